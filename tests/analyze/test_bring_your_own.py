"""Your own model, data and checkpoint: plain state_dicts analysed through the CLI (--model, --dataset) and the
function API with the same numbers; user modules named in a recipe's `imports`; analysis recipes (analyze/*.toml)
(the module graph: tests/test_layers.py)."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support.helpers import invoke, one_line_error, result_file, tiny_recipe, write_user_module

import landscape
from landscape.analyze.recipes import load_analysis_recipe
from landscape.config import recipe as recipes

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = textwrap.dedent('''
    import torch
    from torch import nn

    from landscape.models import MODELS


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.Tanh(), nn.Linear(12, 10))

        def forward(self, x):
            return self.body(x)


    def make_net():
        torch.manual_seed(3)
        return TwoLayer()


    def make_data():
        g = torch.Generator().manual_seed(5)
        return torch.randn(48, 1, 8, 8, generator=g), torch.randint(0, 10, (48,), generator=g)


    def make_relu():  # the same parameters as make_net's, another activation
        net = make_net()
        net.body[2] = nn.ReLU()
        return net


    def half():  # the first half of make_data's samples
        x, y = make_data()
        return x[:24], y[:24]


    SCALE = 1.0
    act = torch.relu


    def squash(x):  # a module-level helper forward calls
        return torch.tanh(x)


    class Scaled(nn.Module):  # its forward reads a helper, an alias of a torch function and a constant
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12))
            self.head = nn.Linear(12, 10)

        def forward(self, x):
            return self.head(squash(act(self.body(x))) * SCALE)


    def make_scaled():
        torch.manual_seed(3)
        return Scaled()


    def not_a_net():
        return 3


    def broken_data():
        raise ValueError("no data here")


    @MODELS.register("usernet", summary="a user's model, registered from outside the package")
    def usernet(input_shape, num_classes, options):
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), num_classes))
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = write_user_module(tmp_path, monkeypatch, "userlab", USER_MODULE)
    yield name
    from landscape.models import MODELS

    MODELS._entries.pop("usernet", None)  # registered by this test's copy of the module
    sys.modules.pop(name, None)


def test_a_plain_state_dict_through_the_cli_equals_the_function_api(tmp_path, user_module):
    module = __import__(user_module)
    net = module.make_net()
    torch.save(net.state_dict(), tmp_path / "mine.pt")
    result = invoke("analyze", tmp_path / "mine.pt", "--model", f"{user_module}:make_net", "--dataset",
                    f"{user_module}:make_data", "--passes", "loss,hessian,sharpness", "--quiet",
                    "--set", "hessian.top_k=2", "--set", "hessian.trace_hvps=12", "--set", "hessian.density_steps=4",
                    "--set", "sharpness.rhos=[0.05]", "--set", "sharpness.adaptive=false")
    assert result.exit_code == 0, result.output
    out = tmp_path / "analysis" / "mine"
    hessian = json.loads(next(out.glob("hessian*.json")).read_text())["result"]
    sharpness = json.loads(next(out.glob("sharpness*.json")).read_text())["result"]
    data = module.make_data()
    eigs = landscape.hessian_eigs(net, data, k=2)
    assert hessian["top"]["values"] == pytest.approx(eigs.values.tolist(), rel=1e-6)
    assert sharpness["global"]["sharpness"][0] == pytest.approx(
        float(landscape.sharpness(net, data, rho=0.05).sharpness[0]), rel=1e-6)
    assert "local" not in sharpness  # a state_dict has no clients
    # a client-level pass is refused in one line
    refused = invoke("analyze", tmp_path / "mine.pt", "--model", f"{user_module}:make_net", "--dataset",
                     f"{user_module}:make_data", "--passes", "incompatibility", "--quiet")
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "needs the clients of a training run" in refused.output


def test_a_folder_of_state_dicts_a_registered_data_set_and_float64(tmp_path, user_module):
    from landscape.data.datasets import load_dataset
    from landscape.models import build_model

    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=1, seed=0, options={})
    folder = tmp_path / "states"
    folder.mkdir()
    for i in range(2):
        torch.manual_seed(i)
        torch.save({"state_dict": build_model("mlp", bundle.input_shape, 10).double().state_dict()},
                   folder / f"epoch{i}.pth")
    result = invoke("analyze", folder, "--model", "mlp", "--dataset", "digits", "--split", "test", "--passes", "loss",
                    "--quiet")
    assert result.exit_code == 0, result.output
    records = [json.loads(next((folder / "analysis" / f"epoch{i}").glob("loss*.json")).read_text()) for i in range(2)]
    assert records[0]["result"]["loss"] != records[1]["result"]["loss"]
    assert records[0]["result"]["samples"] == len(bundle.test.y)


@pytest.mark.parametrize("args, message", [
    (["--model", "nosuchpkg_xyz:make", "--dataset", "digits"], "cannot import the module of model factory"),
    (["--model", "{mod}:missing", "--dataset", "digits"], "has no 'missing'"),
    (["--model", "{mod}:make_net"], "needs both --model and --dataset"),
    (["--model", "{mod}:make_net", "--dataset", "{mod}:make_data", "--passes", "surface", "--grid", "3",
      "--set", "surface.data=client:0"], "client 0 does not exist"),
])
def test_bring_your_own_errors_are_one_line(tmp_path, user_module, args, message):
    module = __import__(user_module)
    torch.save(module.make_net().state_dict(), tmp_path / "mine.pt")
    result = invoke("analyze", tmp_path / "mine.pt", *[a.format(mod=user_module) for a in args], "--quiet")
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output


def test_a_mismatched_state_dict_names_the_tensor(tmp_path, user_module):
    torch.save({"body.1.weight": torch.zeros(3, 3)}, tmp_path / "bad.pt")
    result = invoke("analyze", tmp_path / "bad.pt", "--model", f"{user_module}:make_net", "--dataset",
                    f"{user_module}:make_data", "--passes", "loss", "--quiet")
    assert result.exit_code == 1 and "does not match the model" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_recipe_imports_the_users_registrations(tmp_path, user_module):
    from landscape.train import loop

    recipe = tiny_recipe(imports=[user_module], model__name="usernet", train__rounds=1)
    assert recipe.imports == (user_module,)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    assert recipes.tomllib.loads((tmp_path / "run" / "recipe.toml").read_text())["imports"] == [user_module]
    model = landscape.open_run(tmp_path / "run").model()
    assert isinstance(model, torch.nn.Sequential)
    with pytest.raises(landscape.core.errors.LandscapeError, match="cannot import recipe import 'nosuch_mod_q'"):
        tiny_recipe(imports=["nosuch_mod_q"])


def test_analysis_recipes_load_and_flags_win(tmp_path):
    for path in sorted((ROOT / "analyze").glob("*.toml")):
        recipe = load_analysis_recipe(path)
        assert recipe.passes, path
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    (tmp_path / "mine.toml").write_text('passes = ["loss"]\n[settings]\nanalysis_samples = 40\nseed = 2\n')
    result = invoke("analyze", tmp_path / "run", tmp_path / "mine.toml", "--analysis-samples", "30", "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads(next((tmp_path / "run" / "analysis" / "round-0001").glob("loss*.json")).read_text())
    assert record["settings"]["analysis"]["analysis_samples"] == 30 and record["settings"]["analysis"]["seed"] == 2
    (tmp_path / "bad.toml").write_text('[hessian]\ntop_kk = 3\n')
    bad = invoke("analyze", tmp_path / "run", tmp_path / "bad.toml", "--quiet")
    assert bad.exit_code == 1 and "unknown pass option 'hessian.top_kk'" in bad.output
    assert "did you mean 'hessian.top_k'?" in bad.output


def test_analyze_dry_run_estimates_and_computes_nothing(tmp_path):
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    result = invoke("analyze", tmp_path / "run", "--dry-run", "--passes", "hessian,surface", "--grid", "5",
                    "--set", "hessian.clients=-1")
    assert result.exit_code == 0, result.output
    assert "one Hessian-vector product" in result.output and "total: about" in result.output
    hessian_line = next(line for line in result.output.splitlines() if " hessian " in f" {line} ")
    assert int(hessian_line.split()[3]) > 100  # probe + Lanczos + 2 x 60 trace probes + 80 density steps
    assert not (tmp_path / "run" / "analysis").exists()


def test_analyze_dry_run_never_prices_what_is_already_computed(tmp_path):
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    args = ["--checkpoints", "all", "--set", "hessian.clients=-1", "--set", "hessian.trace_hvps=6",
            "--set", "hessian.density_steps=4"]
    assert invoke("analyze", tmp_path / "run", "--passes", "loss", *args[:2], "--quiet").exit_code == 0
    planned = invoke("analyze", tmp_path / "run", "--passes", "loss,hessian", *args, "--dry-run").output
    rows = {tuple(line.split()[1:3]): line.split()[3] for line in planned.splitlines() if " run " in f" {line} "}
    assert rows[("0", "loss")] == rows[("1", "loss")] == "done" and rows[("1", "hessian")].isdigit()
    assert planned.startswith("2 jobs to compute (2 already done with these settings)")
    hvps = sum(int(rows[(r, "hessian")]) for r in ("0", "1"))
    assert f"total: about {hvps} Hessian-vector products" in planned
    forced = invoke("analyze", tmp_path / "run", "--passes", "loss,hessian", *args, "--dry-run", "--force").output
    assert forced.startswith("4 jobs to compute;") and " done " not in forced
    finished = invoke("analyze", tmp_path / "run", "--passes", "loss", *args[:2], "--dry-run")
    assert finished.output.strip() == ("nothing to compute: all 2 jobs are already done with these settings "
                                       "(--force computes them again)")


def test_a_pass_reports_its_products_to_the_progress_callback(tmp_path):
    from landscape.analyze.catalog import load_passes, pass_options
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.source import find_sources
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    (source,), _ = find_sources(tmp_path / "run")
    ctx = CheckpointContext(source, 1, AnalysisSettings(device="cpu"))
    from landscape.analyze.scheduler import WorkBar

    work = WorkBar(enabled=True)
    ctx.progress = work.start("hessian", expected=20)  # a total from the start (the cost model's estimate)
    assert work.bar.total == 20
    output = load_passes().get("hessian").factory(ctx, pass_options("hessian", {"clients": -1, "trace_hvps": 12,
                                                                                "density_steps": 4}))
    assert work.bar.total >= work.base + work.last > 20  # grown with the work, never past 100%
    work.close()
    assert work.base + work.last == output.scalars["hvp_count"]  # every product of every solver, as it happens


def test_the_sharpness_pass_counts_its_trials_on_a_bar_with_a_total_and_a_time_left(tmp_path):
    """The work bar of the sharpness pass (which makes no Hessian-vector products, so its cost model gives the
    bar no total) gets one from the pass: every ascent's trial points (rhos x 2 profiles and the global and
    client ascents at local_rho, each starts x steps), and ends there."""
    from landscape.analyze.catalog import load_passes, pass_options
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.scheduler import WorkBar
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.source import find_sources
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    (source,), _ = find_sources(tmp_path / "run")
    ctx = CheckpointContext(source, 1, AnalysisSettings(device="cpu", analysis_samples=64))
    work = WorkBar(enabled=True)
    bar = work.start("sharpness", expected=None)  # as the scheduler starts it: no products to expect
    assert work.bar is None  # no bar (never "0step") until the pass reports
    heard, shown = [], []

    def progress(done, total):
        heard.append((done, total))
        bar(done, total)
        shown.append(str(work.bar))

    ctx.progress = progress
    options = pass_options("sharpness", {"rhos": [0.05, 0.1], "steps": 3, "starts": 2, "clients": 2})
    load_passes().get("sharpness").factory(ctx, options)
    total = (2 * 2 + 1 + 2) * 2 * 3
    assert heard[0] == (0, total) and {t for _, t in heard} == {total}
    done = [d for d, _ in heard]
    assert done == sorted(done) and done[-1] == total and len(set(done)) > 10  # advancing as the trials run
    assert work.bar.total == total and work.bar.n == total
    assert f"{total}/{total}" in shown[-1] and f"/{total} [" in shown[1] and "<" in shown[-1]  # a time left
    work.close()


def _analyze_loss(path, model, dataset, *extra):
    return invoke("analyze", path, "--model", model, "--dataset", dataset, "--passes", "loss", "--quiet", *extra)


def _direct_loss(module, factory: str, dataset: str, state_file: Path) -> float:
    """F(x) = mean cross-entropy of the state_dict's model on the data, computed here with plain torch."""
    from landscape.data.datasets import load_dataset

    net = getattr(module, factory)()
    net.load_state_dict(torch.load(state_file, weights_only=True))
    if ":" in dataset:
        x, y = getattr(module, dataset.split(":")[1])()
    else:
        train = load_dataset(dataset, root="data", download=False, augment=False, num_clients=1, seed=0,
                             options={}).train
        x, y = train.x, train.y
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(net.eval()(x), y).item()


# the code forward runs, edited outside the model's class (issue 46, W1): (old text, new text) in the module
HELPER_EDITS = {"edited helper": ("return torch.tanh(x)", "return torch.sigmoid(x)"),
                "edited alias": ("act = torch.relu", "act = torch.tanh"),
                "edited constant": ("SCALE = 1.0", "SCALE = 2.0")}


def _reimport(tmp_path, user_module, old: str, new: str):
    """The user module with ``old`` replaced by ``new`` in its file, imported afresh."""
    from landscape.models import MODELS

    source = tmp_path / f"{user_module}.py"
    assert old in source.read_text()
    source.write_text(source.read_text().replace(old, new))
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    sys.modules.pop(user_module)
    MODELS._entries.pop("usernet", None)  # registered again by the edited module
    importlib.invalidate_caches()
    return importlib.import_module(user_module)


@pytest.mark.parametrize("change", ["none", "model factory", "edited model code", "data factory",
                                    "registered data set", "result without inputs", *HELPER_EDITS])
def test_a_state_dict_result_is_keyed_by_the_model_and_data_that_made_it(tmp_path, user_module, change):
    """Issue 20: another model, data or model code on the same file is recomputed, never "already done"; issue 46
    (W1): the code forward runs outside the class too (a module-level helper, an alias, a constant)."""
    module = __import__(user_module)
    state_file = tmp_path / "mine.pt"
    factory = "make_scaled" if change in HELPER_EDITS else "make_net"
    torch.save(getattr(module, factory)().state_dict(), state_file)
    model, dataset = f"{user_module}:{factory}", f"{user_module}:make_data"
    first = _analyze_loss(state_file, model, dataset)
    assert first.exit_code == 0 and "1 computed, 0 already done" in first.output, first.output
    out = tmp_path / "analysis" / "mine"
    if change == "model factory":
        model = f"{user_module}:make_relu"
    elif change == "edited model code":  # the same --model, its class edited (another activation)
        module = _reimport(tmp_path, user_module, "nn.Tanh()", "nn.Sigmoid()")
    elif change in HELPER_EDITS:  # the same --model and class, code it calls edited
        module = _reimport(tmp_path, user_module, *HELPER_EDITS[change])
    elif change == "data factory":
        dataset = f"{user_module}:half"
    elif change == "registered data set":
        dataset = "digits"
    elif change == "result without inputs":  # written before results of a state_dict were keyed by them
        path = result_file(out, "loss")
        record = json.loads(path.read_text())
        del record["inputs"]
        path.write_text(json.dumps(record))
    second = _analyze_loss(state_file, model, dataset)
    assert second.exit_code == 0, second.output
    done = "0 computed, 1 already done" if change == "none" else "1 computed, 0 already done"
    assert done in second.output, second.output
    record = json.loads(result_file(out, "loss").read_text())  # the old result of these settings is replaced
    assert record["inputs"]["model"] == model and record["inputs"]["dataset"] == dataset
    if ":" in dataset:  # SHA-256 of dtype, shape and bytes of the inputs, then of the targets
        digest = hashlib.sha256()
        for t in getattr(module, dataset.split(":")[1])():
            digest.update(f"{t.dtype}{tuple(t.shape)}".encode() + t.contiguous().numpy().tobytes())
        assert record["inputs"]["data_sha256"] == digest.hexdigest()
    else:
        assert record["inputs"]["data_sha256"] is None  # a registered data set: its name and the split say it
    expected = _direct_loss(module, model.split(":")[1], dataset, state_file)
    assert record["result"]["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("model, dataset, message", [
    ("{mod}:nosuch", "{mod}:make_data", "model factory '{mod}:nosuch': module '{mod}' has no 'nosuch'"),
    ("{mod}:make_net", "{mod}:nosuch", "data factory '{mod}:nosuch': module '{mod}' has no 'nosuch'"),
    ("{mod}:not_a_net", "{mod}:make_data", "model factory '{mod}:not_a_net' returned int, not an nn.Module"),
    ("{mod}:make_net", "{mod}:broken_data", "data factory '{mod}:broken_data' failed: ValueError: no data here"),
    ("nosuch_model", "digits", "unknown model 'nosuch_model'"),
    ("{mod}:make_net", "nosuch_data", "unknown dataset 'nosuch_data'"),
    ("mlp", "{mod}:make_data", "a registered model ('mlp') is built for a registered data set"),
])
def test_the_model_and_data_of_a_state_dict_are_checked_before_anything_is_done(tmp_path, user_module, model,
                                                                                dataset, message):
    """Issue 20: `--model mod:nosuch` after a first analysis exited 0 (everything "already done")."""
    module = __import__(user_module)
    torch.save(module.make_net().state_dict(), tmp_path / "mine.pt")
    assert _analyze_loss(tmp_path / "mine.pt", f"{user_module}:make_net", f"{user_module}:make_data").exit_code == 0
    for extra in ((), ("--dry-run",)):
        line = one_line_error(_analyze_loss(tmp_path / "mine.pt", model.format(mod=user_module),
                                            dataset.format(mod=user_module), *extra))
        assert message.format(mod=user_module) in line


@pytest.mark.parametrize("args, what", [
    (["--passes", "flatness"], "flatness"),
    (["--passes", "loss,flatness", "--dry-run"], "flatness"),
    (["--passes", "surface", "--directions", "clients", "--grid", "3"], "surface --directions clients"),
    (["--passes", "surface", "--directions", "interpolate", "--grid", "5"], "surface --directions interpolate"),
    (["--passes", "loss,incompatibility"], "incompatibility"),
    (["--passes", "alignment"], "alignment"),
])
def test_a_client_pass_on_a_state_dict_says_it_has_no_clients(tmp_path, user_module, args, what):
    """Issue 20: `--passes flatness` on a state_dict said "train with --keep-clients", meaningless there."""
    module = __import__(user_module)
    torch.save(module.make_net().state_dict(), tmp_path / "mine.pt")
    line = one_line_error(invoke("analyze", tmp_path / "mine.pt", "--model", f"{user_module}:make_net",
                                 "--dataset", f"{user_module}:make_data", *args, "--quiet"))
    assert f"{what} needs the clients of a training run" in line and "a plain state_dict, which has no clients" in line
    assert "--keep-clients" not in line and "run on a state_dict: hessian, loss, sharpness, surface (random" in line
    assert not (tmp_path / "analysis").exists()  # refused before anything was computed


@pytest.mark.parametrize("content, reason", [
    (b"junk", "truncated or corrupted"), (b"G", "truncated or corrupted"), (b"X\x00\x01", "truncated or corrupted"),
    (b"r", "truncated or corrupted"), (b"", "truncated (the file ends early)"),
    ({"body.1.weight": torch.zeros(3, 3)}, "does not match the model"),
])
def test_a_bad_file_in_a_folder_of_state_dicts_is_named_and_the_others_are_analysed(tmp_path, user_module, content,
                                                                                   reason):
    """Issue 20: a junk file in a folder of state_dicts gave struct.error after the good ones were written."""
    module = __import__(user_module)
    folder = tmp_path / "states"
    folder.mkdir()
    for name in ("a.pt", "c.pt"):
        torch.save(module.make_net().state_dict(), folder / name)
    if isinstance(content, bytes):
        (folder / "b.pt").write_bytes(content)
    else:
        torch.save(content, folder / "b.pt")
    line = one_line_error(_analyze_loss(folder, f"{user_module}:make_net", f"{user_module}:make_data"))
    assert str(folder / "b.pt") in line and reason in line
    assert "the other 2 files were analysed" in line
    expected = _direct_loss(module, "make_net", f"{user_module}:make_data", folder / "a.pt")
    for stem in ("a", "c"):
        record = json.loads(result_file(folder / "analysis" / stem, "loss").read_text())
        assert record["result"]["loss"] == pytest.approx(expected, rel=1e-5)
    assert not (folder / "analysis" / "b").exists()
