"""The function API (landscape.hessian_eigs, trace, density, sharpness, surface, flatness_distance): any
nn.Module on any data, checked against dense Hessians and against the run-directory path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe
from torch import nn

import landscape
from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.store.results import validity
from landscape.train import loop


def _tiny_problem(regression: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1 if regression else 3)).double()
    x = torch.randn(40, 4, dtype=torch.float64)
    y = torch.randn(40, 1, dtype=torch.float64) if regression else torch.randint(0, 3, (40,))
    return model, x, y


def _dense_hessian(model, x, y, loss):
    flat = FlatModel(model)
    w0 = flat.vector()

    def f(w):
        return loss(flat.logits(w, x, flat.buffers()), y)

    return torch.autograd.functional.hessian(f, w0)


@pytest.mark.parametrize("regression", [False, True])
def test_hessian_eigs_equal_the_dense_hessian(regression):
    model, x, y = _tiny_problem(regression)
    loss = F.mse_loss if regression else F.cross_entropy
    expected = torch.linalg.eigvalsh(_dense_hessian(model, x, y, loss)).flip(0)[:3]
    got = landscape.hessian_eigs(model, (x, y), k=3, tol=1e-8, loss="mse" if regression else None)
    torch.testing.assert_close(torch.from_numpy(got.values), expected, rtol=1e-7, atol=1e-9)
    assert isinstance(got.values, np.ndarray) and got.values.dtype == np.float64 and bool(got.converged.all())
    trace = landscape.trace(model, (x, y), hvps=60, method="hutchinson", loss="mse" if regression else None)
    exact = float(torch.trace(_dense_hessian(model, x, y, loss)))
    assert abs(trace.estimate - exact) < 5 * trace.stderr + 1e-9


def test_a_custom_loss_callable_equals_the_named_one():
    model, x, y = _tiny_problem(regression=True)
    named = landscape.hessian_eigs(model, (x, y), k=2, loss="mse")
    custom = landscape.hessian_eigs(model, (x, y), k=2, loss=lambda out, t: ((out - t) ** 2).mean())
    torch.testing.assert_close(named.values, custom.values, rtol=1e-10, atol=0)


def test_tensors_dataset_and_loader_give_the_same_numbers_and_the_model_is_untouched():
    model, x, y = _tiny_problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=512)
    values = [landscape.hessian_eigs(model, data, k=2).values for data in ((x, y), dataset, loader)]
    torch.testing.assert_close(values[0], values[1], rtol=0, atol=0)
    torch.testing.assert_close(values[0], values[2], rtol=0, atol=0)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_sharpness_surface_and_flatness_distance():
    model, x, y = _tiny_problem()
    profile = landscape.sharpness(model, (x, y), rho=[0.01, 0.1], steps=3)
    assert profile.sharpness.shape == (2,) and 0 <= profile.sharpness[0] <= profile.sharpness[1]
    flat = FlatModel(model)
    with torch.no_grad():
        loss0 = float(F.cross_entropy(model(x), y))
    assert profile.loss == pytest.approx(loss0, rel=1e-12)
    surface = landscape.surface(model, (x, y), grid=5, span=(-0.5, 0.5))
    assert surface.loss.shape == (5, 5) and surface.loss[2, 2] == pytest.approx(loss0, rel=1e-12)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).double().mean().item()
    assert np.isfinite(surface.loss).all() and surface.accuracy[2, 2] == accuracy
    line = landscape.surface(model, (x, y), grid=3, dims=1, directions=(torch.ones(flat.dim, dtype=torch.float64),))
    shifted = FlatModel(model).vector() + 1.0
    assert line.loss[2] == pytest.approx(float(F.cross_entropy(flat.logits(shifted, x, {}), y)), rel=1e-12)
    other = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    result = landscape.flatness_distance(model, [other, model.state_dict()])
    d = float(((FlatModel(other).vector() - flat.vector()) ** 2).sum()) / 2
    assert result.distance_to_global == pytest.approx(d, rel=1e-12)  # mean of ||y_i - x||^2, y = (other, x)
    assert result.distance == pytest.approx(d / 2, rel=1e-12)  # around their mean: each is half-way, 1/4 of it


def test_bad_input_is_a_one_line_error():
    model, x, y = _tiny_problem()
    for call, message in [
        (lambda: landscape.hessian_eigs(model, [1, 2, 3]), "data must be"),
        (lambda: landscape.hessian_eigs(model, (x, y[:3])), "same number"),
        (lambda: landscape.hessian_eigs("model", (x, y)), "nn.Module"),
        (lambda: landscape.hessian_eigs(model, (x, y), loss="hinge"), "unknown loss"),
        (lambda: landscape.surface(model, (x, y), grid=4), "odd"),
        (lambda: landscape.flatness_distance(model, []), "at least one"),
    ]:
        with pytest.raises(LandscapeError, match=message):
            call()


def test_the_function_api_equals_the_run_directory_path(tmp_path):
    """The analyze passes call the same functions: the run's model and data through the API give the numbers
    of `landscape analyze` (train split = the union of the clients' data, eval mode, float32)."""
    recipe = tiny_recipe(model__name="mlp", train__rounds=2)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    options = {"hessian": pass_options("hessian", {"clients": -1, "top_k": 2, "trace_hvps": 12, "density_steps": 4}),
               "sharpness": pass_options("sharpness", {"rhos": [0.05], "steps": 2, "adaptive": False})}
    run_analysis(tmp_path / "run", passes=["hessian", "sharpness"], settings=AnalysisSettings(device="cpu"),
                 options=options, progress=False)
    import json

    out = tmp_path / "run" / "analysis" / "round-0002"
    (hessian_file,), (sharpness_file,) = sorted(out.glob("hessian*.json")), sorted(out.glob("sharpness*.json"))
    hessian = json.loads(hessian_file.read_text())["result"]
    sharp = json.loads(sharpness_file.read_text())["result"]

    run = landscape.open_run(tmp_path / "run")
    train, _ = run.data()
    index = torch.as_tensor(np.sort(np.concatenate(run.partition())))
    data = (train.x[index], train.y[index])
    model = run.model(2)
    eigs = landscape.hessian_eigs(model, data, k=2)
    assert eigs.values.tolist() == pytest.approx(hessian["top"]["values"], rel=1e-6)
    assert landscape.trace(model, data, hvps=12).estimate == pytest.approx(hessian["trace"]["estimate"], rel=1e-6)
    s = landscape.sharpness(model, data, rho=0.05, steps=2)
    assert s.sharpness[0] == pytest.approx(sharp["global"]["sharpness"][0], rel=1e-6)


def test_open_run_model_keeps_the_checkpoint_dtype(tmp_path):
    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1, train__dtype="float64"), tmp_path / "r",
                   progress=False)
    model = landscape.open_run(tmp_path / "r").model()
    assert next(model.parameters()).dtype == torch.float64
    assert landscape.hessian_eigs(model, (torch.randn(8, 1, 8, 8, dtype=torch.float64),
                                          torch.randint(0, 10, (8,))), k=1).values.dtype == np.float64


def test_dir_lists_the_api_and_importing_the_package_loads_no_torch():
    import subprocess
    import sys

    for name in ("open_run", "results", "hessian_eigs", "trace", "density", "sharpness", "surface",
                 "flatness_distance", "problem", "LandscapeError", "Run", "LandscapeNote", "RecipeEditedWarning",
                 "StaleResultWarning"):
        assert name in landscape.__all__ and name in dir(landscape)
    # what reading a run warns, to filter or catch by class: the notes the command line prints as `note:`
    assert issubclass(landscape.StaleResultWarning, landscape.LandscapeNote)
    assert issubclass(landscape.RecipeEditedWarning, landscape.LandscapeNote)
    assert landscape.StaleResultWarning is validity.StaleResultWarning
    assert sorted(dir(landscape)) == sorted(landscape.__all__)
    assert all(getattr(landscape, name) is not None for name in landscape.__all__)  # each name resolves
    assert landscape.LandscapeError is LandscapeError and landscape.results.__module__ == "landscape.api.runs"
    with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
        landscape.nosuch  # noqa: B018
    code = "import sys, landscape; names = dir(landscape); print('torch' in sys.modules, len(names))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["False", str(len(landscape.__all__))]  # tab completion waits for no torch


def test_every_function_runs_on_the_cli_thread_default_and_restores_the_count(monkeypatch):
    """1 thread unless told (as `landscape analyze --threads`), 0 = every core; set back after the call, also
    after an error."""
    import os

    import landscape.measure.surface.evaluation as surface_evaluation
    from landscape import api

    model, x, y = _tiny_problem()
    inside = []

    def spy(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: inside.append(torch.get_num_threads()) or real(*a, **k))

    for name in ("hessian_eigs", "trace", "density", "sharpness", "flatness_distance"):
        spy(api.functions, name)
    spy(surface_evaluation, "evaluate_surface")
    spy(api, "as_data")  # problem: its data is read inside the call
    calls = [lambda **t: landscape.hessian_eigs(model, (x, y), k=1, **t),
             lambda **t: landscape.trace(model, (x, y), hvps=4, **t),
             lambda **t: landscape.density(model, (x, y), runs=1, steps=2, **t),
             lambda **t: landscape.sharpness(model, (x, y), steps=1, starts=1, **t),
             lambda **t: landscape.surface(model, (x, y), grid=3, **t),
             lambda **t: landscape.flatness_distance(model, [model], **t),
             lambda **t: landscape.problem(model, (x, y), **t)]
    before = torch.get_num_threads()
    every = len(os.sched_getaffinity(0))
    try:
        torch.set_num_threads(3)
        for threads, expected in ((None, 1), (2, 2), (0, every)):
            for call in calls if threads is None else calls[:1]:
                inside.clear()
                call(**({} if threads is None else {"threads": threads}))
                assert inside and set(inside) == {expected} and torch.get_num_threads() == 3, call
        with pytest.raises(LandscapeError, match="data must be"):
            landscape.hessian_eigs(model, [1, 2, 3], threads=2)
        assert torch.get_num_threads() == 3
        for bad in (-1, 1.5, True, "2"):
            with pytest.raises(LandscapeError, match=r"^threads must be a whole number >= 0 \(got "):
                landscape.trace(model, (x, y), threads=bad)
    finally:
        torch.set_num_threads(before)


def _arrays(result, name: str = "") -> dict[str, object]:
    """Every array-like field of a result (nested results too), by its dotted name."""
    import dataclasses

    found = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if dataclasses.is_dataclass(value):
            found |= _arrays(value, f"{name}{f.name}.")
        elif isinstance(value, (np.ndarray, torch.Tensor)):
            found[name + f.name] = value
    return found


def test_every_result_holds_numpy_arrays_float64_for_measurements():
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))  # float32: the numbers still float64
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(1))
    other = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    clients = [(x[:20], y[:20]), (x[20:], y[20:])]
    results = {
        "hessian_eigs": landscape.hessian_eigs(model, (x, y), k=2),
        "density": landscape.density(model, (x, y), runs=2, steps=4),
        "sharpness": landscape.sharpness(model, (x, y), rho=[0.01, 0.05], steps=2, starts=2),
        "surface": landscape.surface(model, (x, y), grid=3),
        "flatness_distance": landscape.flatness_distance(model, [model, other], start=other),
        "incompatibility": landscape.incompatibility(model, clients, rho=0.05, batches=2, minibatch_size=5),
        "alignment": landscape.alignment(model, clients, start=model, client_models=[model, other], batches=2,
                                         minibatch_size=5),
    }
    for function, result in results.items():
        arrays = _arrays(result)
        assert arrays, function
        for name, value in arrays.items():
            assert isinstance(value, np.ndarray), f"{function}: {name} is {type(value).__name__}"
            assert value.dtype in (np.float64, np.bool_, np.int64), f"{function}: {name} is {value.dtype}"
    eigs, dens = results["hessian_eigs"], results["density"]
    assert eigs.values.dtype == eigs.residuals.dtype == np.float64 and eigs.converged.dtype == np.bool_
    assert all(a.dtype == np.float64 for a in (dens.grid, dens.density, dens.nodes, dens.weights))


def test_the_api_lays_out_a_convolutional_model_as_the_cli_and_gives_its_numbers_bit_for_bit(one_round_run, tmp_path):
    """Issue 47: the API chose no memory layout (a CNN ran contiguous on the CPU, slower, and its numbers differed
    from `landscape analyze`'s in the last bits); it now resolves "auto" by the CLI's own rule."""
    import json
    import shutil

    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.source import find_sources

    run = shutil.copytree(one_round_run, tmp_path / "run")
    settings = AnalysisSettings(device="cpu")
    run_analysis(run, passes=["loss"], settings=settings, options={"loss": pass_options("loss", {})}, progress=False)
    (loss_file,) = (run / "analysis" / "round-0001").glob("loss*.json")
    stored = json.loads(loss_file.read_text())
    cli = stored["result"]
    assert stored["memory_format"]["name"] == "channels-last"  # the CNN on the CPU: what the CLI chose

    sources, _ = find_sources(run)
    ctx = CheckpointContext(sources[0], 1, settings)
    data = (ctx.global_data.x, ctx.global_data.y)  # the analysis data as the CLI reads it, in its order
    p = landscape.problem(landscape.open_run(run).model(1), data)
    assert p.flat.channels_last
    loss, grad = p.objective.loss_and_grad(p.w)
    assert (loss.item(), grad.norm().item(), p.objective.accuracy(p.w)) == (cli["loss"], cli["grad_norm"],
                                                                            cli["accuracy"])
    mlp = landscape.problem(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), data)
    assert not mlp.flat.channels_last  # no convolutions: contiguous, as the CLI
