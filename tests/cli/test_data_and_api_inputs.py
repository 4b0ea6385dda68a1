"""Data and API arguments validated where they enter (issue 20): data given to the function API or made by a
``--dataset`` factory, the arguments of the public functions and of ``Run``, DataLoaders read in index order,
and a hypothesis test over random API arguments (a one-line LandscapeError or a finite result, never another
exception, never a silent zero)."""

from __future__ import annotations

import math
import re
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.helpers import one_line_error, tiny_recipe, write_user_module
from torch import nn

import landscape
from landscape.cli import cli
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel


def _model_and_data(n: int = 40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x = torch.randn(n, 4, dtype=torch.float64)
    return model, x, torch.randint(0, 3, (n,))


MODEL, X, Y = _model_and_data()


def _one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert text and "\n" not in text, text
    return text


class _Items(torch.utils.data.Dataset):
    def __init__(self, item, n: int = 40) -> None:
        self.item, self.n = item, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.item(i)


def _nan_inputs():
    x = X.clone()
    x[3, 1] = float("nan")
    return x, Y


DATA_CASES = {
    "float labels": (lambda: (X, Y.double()), r"targets are float64 of shape \[40\]"),
    "label 57 of 3": (lambda: (X, torch.full((40,), 57)), "class 57.*outside 0..2"),
    "label -3": (lambda: (X, torch.full((40,), -3)), "class -3.*outside 0..2"),
    "labels [n, 1]": (lambda: (X, Y[:, None]), r"class indices of shape \[40\]"),
    "wrong width": (lambda: (torch.randn(40, 5, dtype=torch.float64), Y), r"forward pass fails.*\[40, 5\]"),
    "dict items": (lambda: _Items(lambda i: {"x": X[i], "y": Y[i]}), "item 0 of the Dataset is a dict"),
    "triple items": (lambda: _Items(lambda i: (X[i], Y[i], i)), "item 0 of the Dataset is a tuple of 3"),
    "a failing Dataset": (lambda: _Items(lambda i: [][i]),
                          "reading item 0 of the Dataset failed: IndexError"),
    "empty tensors": (lambda: (X[:0], Y[:0]), "data is empty"),
    "empty Dataset": (lambda: _Items(lambda i: (X[i], Y[i]), n=0), "data is empty"),
    "empty DataLoader": (lambda: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:0], Y[:0])),
                         "data is empty"),
    "dict batches": (lambda: torch.utils.data.DataLoader(_Items(lambda i: {"x": X[i], "y": Y[i]}),
                                                         batch_size=8),
                     "batch 0 of the DataLoader is a dict"),
    "nan inputs": (_nan_inputs, "inputs hold 1 non-finite value.*sample 3"),
    "integer inputs": (lambda: (X.long(), Y), "inputs are torch.int64"),
    "lengths differ": (lambda: (X, Y[:7]), "same number of samples \\(40 inputs, 7 targets\\)"),
    "not data": (lambda: [1, 2, 3], "data must be"),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_one_line_naming_the_data(case):
    make, message = DATA_CASES[case]
    with pytest.raises(LandscapeError, match=message) as error:
        landscape.hessian_eigs(MODEL, make(), k=2)
    assert _one_line(error).startswith("data")


FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn


    def make_net():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 10))


    def _x(n=24):
        return torch.randn(n, 4, generator=torch.Generator().manual_seed(5))


    def good():
        return _x(), torch.arange(24) % 10


    def float_labels():
        return _x(), (torch.arange(24) % 10).float()


    def label_57():
        return _x(), torch.full((24,), 57)


    def label_minus_3():
        return _x(), torch.full((24,), -3)


    def wide():
        return torch.randn(24, 5), torch.arange(24) % 10


    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return {"image": _x()[i], "label": i % 10}


    def dicts():
        return Dicts()


    def empty():
        return _x()[:0], torch.zeros(0, dtype=torch.long)


    def nan_inputs():
        x = _x()
        x[2, 0] = float("inf")
        return x, torch.arange(24) % 10
''')


@pytest.fixture
def factories(tmp_path, monkeypatch):
    name = write_user_module(tmp_path, monkeypatch, "factories", FACTORIES)
    module = __import__(name)
    torch.save(module.make_net().state_dict(), tmp_path / "mine.pt")
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("factory, message", [
    ("float_labels", "targets are float32 of shape [24]"),
    ("label_57", "class 57 is outside 0..9"),
    ("label_minus_3", "class -3 is outside 0..9"),
    ("wide", "forward pass fails on its first batch (inputs [24, 5] float32)"),
    ("dicts", "item 0 of the Dataset is a dict (keys 'image', 'label')"),
    ("empty", "is empty (0 samples)"),
    ("nan_inputs", "inputs hold 1 non-finite value (NaN or inf), the first in sample 2"),
])
def test_bad_factory_data_is_one_line_naming_the_factory(tmp_path, factories, factory, message):
    model = f"{factories}:make_net"
    result = CliRunner().invoke(cli, ["analyze", str(tmp_path / "mine.pt"), "--model", model,
                                      "--dataset", f"{factories}:{factory}", "--passes", "loss", "--quiet"])
    line = one_line_error(result)
    assert line.startswith(f"error: data factory '{factories}:{factory}'"), line
    assert message in line, line
    good = CliRunner().invoke(cli, ["analyze", str(tmp_path / "mine.pt"), "--model", model,
                                    "--dataset", f"{factories}:good", "--passes", "loss", "--quiet"])
    assert good.exit_code == 0, good.output


def _vector_loss(outputs, targets):
    return F.cross_entropy(outputs, targets, reduction="none")


def _problem():
    return landscape.problem(MODEL, (X, Y))


def _on_xy(function: str):
    return lambda **arguments: getattr(landscape, function)(MODEL, (X, Y), **arguments)


EIGS, TRACE, DENSITY, SHARP, SURF = map(_on_xy, ("hessian_eigs", "trace", "density", "sharpness", "surface"))
BN_MODEL = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).double()


def EIGS_ON(data):  # noqa: N802 - named as the calls beside it
    return landscape.hessian_eigs(MODEL, data, k=2)


ARGUMENT_CASES = {
    "k=1.5": (lambda: EIGS(k=1.5), "k must be a whole number >= 1 (got 1.5)"),
    "k='3'": (lambda: EIGS(k="3"), "k must be a whole number >= 1 (got '3')"),
    "k=True": (lambda: EIGS(k=True), "k must be a whole number"),
    "tol=nan": (lambda: EIGS(tol=math.nan), "tol must be a finite number > 0"),
    "seed=-1": (lambda: EIGS(seed=-1), r"seed must be a whole number in 0..2\*\*32-1"),
    "seed=1.5": (lambda: TRACE(seed=1.5), "seed must be a whole number"),
    "device=meta": (lambda: EIGS(device="meta"), "device 'meta' holds no data"),
    "device=gpu7": (lambda: TRACE(device="gpu7"), "unknown device 'gpu7'"),
    "device=cuda:99": (lambda: TRACE(device="cuda:99"), "device 'cuda:99'"),
    "device=3.5": (lambda: TRACE(device=3.5), "device must be"),
    "a meta model": (lambda: landscape.hessian_eigs(nn.Linear(4, 3, device="meta"), (X, Y)), "device 'meta'"),
    "meta data": (lambda: EIGS_ON((X.to("meta"), Y.to("meta"))),
                  "data: the inputs are on device 'meta', which holds no data"),
    "meta targets": (lambda: EIGS_ON((X, Y.to("meta"))), "data: the targets are on device 'meta'"),
    "BatchNorm batch statistics of one sample": (
        lambda: landscape.hessian_eigs(BN_MODEL, (X[:1], Y[:1]), k=2, bn_mode="train-batch-stats"),
        r"fails on a batch of 1 sample \(data: 1 sample in batches of 512\).*at least 2 samples per batch"),
    "BatchNorm batch statistics, batch_size=1": (
        lambda: landscape.hessian_eigs(BN_MODEL, (X, Y), k=2, bn_mode="train-batch-stats", batch_size=1),
        r"fails on a batch of 1 sample \(data: 40 samples in batches of 1\)"),
    "BatchNorm batch statistics, a last batch of 1": (
        lambda: landscape.trace(BN_MODEL, (X[:9], Y[:9]), hvps=3, bn_mode="train-batch-stats", batch_size=4),
        r"fails on a batch of 1 sample \(data: 9 samples in batches of 4\)"),
    "dtype='float64x'": (lambda: TRACE(dtype="float64x"), "dtype must be"),
    "dtype=int64": (lambda: TRACE(dtype=torch.int64), "dtype must be"),
    "a vector loss": (lambda: EIGS(loss=_vector_loss),
                      r"loss returned a tensor of shape \[40\].*0-d"),
    "a loss returning a float": (lambda: EIGS(loss=lambda o, t: 1.0),
                                 "loss returned a float, not a tensor"),
    "a failing loss": (lambda: EIGS(loss=lambda o, t: o.nosuch),
                       "loss failed on the first batch: AttributeError"),
    "mse with class labels": (lambda: EIGS(loss="mse"),
                              r"loss 'mse' needs float targets shaped like the outputs \[40, 3\]"),
    "batch_size=0": (lambda: EIGS(batch_size=0), "batch_size must be a whole"),
    "an unknown setting": (lambda: EIGS(bacth_size=8),
                           "hessian_eigs got an unknown argument 'bacth_size'"),
    "settings with a Problem": (lambda: landscape.trace(_problem(), loss="mse"), "a Problem carries its"),
    "progress=5": (lambda: TRACE(progress=5), "progress must be"),
    "hvps=2.5": (lambda: TRACE(hvps=2.5), "hvps must be a whole number"),
    "density steps=1.5": (lambda: DENSITY(steps=1.5), "steps must be a whole number"),
    "density runs='4'": (lambda: DENSITY(runs="4"), "runs must be a whole number"),
    "rho='0.05'": (lambda: SHARP(rho="0.05"), "rho must be a radius"),
    "rho=None": (lambda: SHARP(rho=None), "rho must be a radius"),
    "rho=[0.1, 'a']": (lambda: SHARP(rho=[0.1, "a"]), "rho must be a radius"),
    "sharpness tol=inf": (lambda: SHARP(tol=math.inf), "tol must be a finite"),
    "steps=2.0": (lambda: SHARP(steps=2.0), "steps must be a whole number"),
    "adaptive='yes'": (lambda: SHARP(adaptive="yes"), "adaptive must be True or"),
    "grid=3.0": (lambda: SURF(grid=3.0), "grid must be an odd"),
    "grid=None": (lambda: SURF(grid=None), "grid must be an odd"),
    "span=1": (lambda: SURF(grid=3, span=1), "span must be"),
    "span='ab'": (lambda: SURF(grid=3, span="ab"), "span must be"),
    "span=(nan, 1)": (lambda: SURF(grid=3, span=(math.nan, 1)), "span must be"),
    "span=(0, 1)": (lambda: SURF(grid=3, span=(0, 1)), "span must be symmetric"),
    "span=(-1e308, 1e308)": (lambda: SURF(grid=3, span=(-1e308, 1e308), dims=1,
                                                       directions=(torch.full((51,), 10.0),)),
                             "takes the model out of the torch.float64 range"),
    "dims='2'": (lambda: SURF(grid=3, dims="2"), "dims must be 1 or 2 (got '2')"),
    "a zero direction": (lambda: SURF(grid=3, dims=1,
                                                   directions=(torch.zeros(51, dtype=torch.float64),)),
                         "direction 1 is all zeros"),
    "a nan direction": (lambda: SURF(grid=3, dims=1,
                                                  directions=(torch.full((51,), math.nan),)),
                        "direction 1 is not finite"),
    "clients=None": (lambda: landscape.flatness_distance(MODEL, None), "client_models must be"),
    "a nan client": (lambda: landscape.flatness_distance(MODEL, [torch.full((51,), math.nan)]),
                     "client 0's model is not finite"),
}


@pytest.mark.parametrize("case", list(ARGUMENT_CASES))
def test_bad_api_arguments_are_one_line_naming_the_argument(case):
    call, message = ARGUMENT_CASES[case]
    with pytest.raises(LandscapeError) as error:
        call()
    assert message in _one_line(error) or re.search(message, _one_line(error)), _one_line(error)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from landscape.train import loop

    path = tmp_path_factory.mktemp("run") / "run"
    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), path, progress=False)
    return landscape.open_run(path)


@pytest.mark.parametrize("call, message", [
    (lambda run: run.client_data(1.5), r"client must be a whole number in 0..3 \(got 1.5\)"),
    (lambda run: run.client_data("0"), r"client must be a whole number in 0..3 \(got '0'\)"),
    (lambda run: run.client_data(True), "client must be a whole number"),
    (lambda run: run.client_data(-1), "client -1 does not exist"),
    (lambda run: run.client_data(9), "client 9 does not exist"),
    (lambda run: landscape.open_run(None), "open_run takes the path of a run directory, not None"),
    (lambda run: landscape.open_run(3), "open_run takes the path of a run directory, not 3"),
])
def test_bad_run_arguments_are_one_line(tiny_run, call, message):
    with pytest.raises(LandscapeError, match=message) as error:
        call(tiny_run)
    _one_line(error)
    assert len(tiny_run.client_data(np.int64(1))) == len(tiny_run.partition()[1])


def _loader(kind: str, seed: int):
    dataset = torch.utils.data.TensorDataset(X, Y)
    g = torch.Generator().manual_seed(seed)
    if kind == "shuffled":
        return torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, generator=g)
    if kind == "shuffled, drop_last":
        return torch.utils.data.DataLoader(dataset, batch_size=7, shuffle=True, drop_last=True, generator=g)
    if kind == "a random subset":
        sampler = torch.utils.data.SubsetRandomSampler(list(range(5, 30)), generator=g)
        return torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, index, batch", [
    ("shuffled", slice(None), 8), ("shuffled, drop_last", slice(None), 7),
    ("a random subset", slice(5, 30), 8),
])
def test_a_shuffled_loader_is_read_in_index_order(kind, index, batch):
    state = torch.random.get_rng_state()
    first = landscape.hessian_eigs(MODEL, _loader(kind, 1), k=3).values
    second = landscape.hessian_eigs(MODEL, _loader(kind, 2), k=3).values
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random stream is not drawn from
    ordered = landscape.hessian_eigs(MODEL, (X[index], Y[index]), k=3, batch_size=batch).values
    assert np.array_equal(first, second) and np.array_equal(first, ordered)
    replacement = torch.utils.data.RandomSampler(torch.utils.data.TensorDataset(X, Y), replacement=True)
    with pytest.raises(LandscapeError, match="draws other samples each time") as error:
        landscape.hessian_eigs(MODEL, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                                                 sampler=replacement), k=2)
    _one_line(error)


# -- random API arguments ------------------------------------------------------------------------------------

SMALL_MODEL = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
SX = torch.randn(24, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
SY = torch.arange(24) % 3
HOSTILE = st.one_of(st.sampled_from([None, "3", "", "cpu", 0, -1, 1.5, True, [], (1,), 1e308, -0.0]),
                    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10))


# Each argument: (valid values, hostile values besides HOSTILE).
ARGUMENTS = {
    "k": (st.integers(1, 4), st.just(1000)), "hvps": (st.integers(4, 12), st.just(2)),
    "runs": (st.integers(1, 3), st.just(10**9 + 0.5)), "steps": (st.integers(1, 4), st.just(2.0)),
    "seed": (st.integers(0, 2**32 - 1), st.just(2**32)),
    "rho": (st.one_of(st.floats(1e-3, 1.0), st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=3)),
            st.lists(HOSTILE, min_size=1, max_size=2)),
    "grid": (st.sampled_from([3, 5, (3, 5)]), st.sampled_from([4, (3,), (3, 3, 3), 3.0])),
    "dims": (st.sampled_from([1, 2]), st.just(3)),
    "span": (st.floats(0.01, 2.0).map(lambda s: (-s, s)), st.tuples(HOSTILE, HOSTILE)),
    "batch_size": (st.integers(1, 30), st.just(2.5)),
    "bn_mode": (st.sampled_from(["eval", "recompute"]), st.just("batch")),
    "loss": (st.sampled_from(["cross-entropy", None, F.cross_entropy]),
             st.sampled_from(["mse", "hinge", _vector_loss, lambda o, t: 1.0])),
    "device": (st.sampled_from(["cpu", torch.device("cpu"), None]),
               st.sampled_from(["meta", "cuda:99", "gpu"])),
    "dtype": (st.sampled_from([torch.float64, torch.float32, "float64", None]),
              st.sampled_from([torch.int32, "x", torch.complex64])),
}
OWN = {"hessian_eigs": ("k", "seed"), "trace": ("hvps", "seed"), "density": ("runs", "steps", "seed"),
       "sharpness": ("rho", "steps", "seed"), "surface": ("grid", "dims", "span", "seed")}
SETTINGS = ("batch_size", "bn_mode", "loss", "device", "dtype")


@st.composite
def api_calls(draw):
    """A function, valid values of its own arguments and of some settings, then 0-2 of them made hostile."""
    name = draw(st.sampled_from(sorted(OWN)))
    keys = list(OWN[name]) + [key for key in SETTINGS if draw(st.booleans())]
    args = {key: draw(ARGUMENTS[key][0]) for key in keys}
    for key in draw(st.permutations(keys))[:draw(st.sampled_from([0, 1, 1, 2]))]:
        args[key] = draw(st.one_of(ARGUMENTS[key][1], HOSTILE))
    own = {key: args.pop(key) for key in OWN[name]}
    return name, own, args


def _check_result(name: str, result, own: dict) -> None:
    """Finite, of the right shape, and not all zero (every one of these is non-zero on this model)."""
    if name == "hessian_eigs":
        values = result.values
        assert values.shape == (own["k"],) and bool(np.isfinite(values).all())
        assert bool((values != 0).any())
    elif name == "trace":
        assert math.isfinite(result.estimate) and result.estimate != 0
    elif name == "density":
        assert bool(np.isfinite(result.density).all()) and bool((result.density > 0).any())
    elif name == "sharpness":
        rhos = own["rho"] if isinstance(own["rho"], list) else [own["rho"]]
        assert result.sharpness.shape == (len(rhos),)
        assert np.isfinite(result.sharpness).all() and (result.sharpness > 0).all()
    else:
        grid = own["grid"] if isinstance(own["grid"], tuple) else (own["grid"],) * 2
        assert result.loss.shape == grid[:own["dims"]]
        assert np.isfinite(result.loss).all() and (result.loss > 0).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=api_calls())
def test_random_api_arguments_give_a_one_line_error_or_a_finite_result(call):
    name, own, extra = call
    try:
        result = getattr(landscape, name)(SMALL_MODEL, (SX, SY), **own, **extra)
    except LandscapeError as error:
        assert str(error) and "\n" not in str(error), str(error)
        return
    _check_result(name, result, own)


def test_the_checks_leave_good_input_alone():
    """Good input gives the numbers it gave before the checks: int32 targets (read as int64) against a dense
    Hessian in float64, one-hot float targets (class probabilities) against the cross-entropy."""
    flat = FlatModel(MODEL)
    dense = torch.autograd.functional.hessian(lambda w: F.cross_entropy(flat.logits(w, X, {}), Y),
                                              flat.vector())
    values = landscape.hessian_eigs(MODEL, torch.utils.data.TensorDataset(X, Y.int()), k=3, tol=1e-8).values
    torch.testing.assert_close(torch.from_numpy(values), torch.linalg.eigvalsh(dense).flip(0)[:3], rtol=1e-7,
                               atol=1e-10)
    soft = F.one_hot(Y, 3).double()
    with torch.no_grad():
        expected = float(F.cross_entropy(MODEL(X), Y))
    assert landscape.sharpness(MODEL, (X, soft), rho=0.05, steps=2).loss == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss", [None, "cross-entropy"])
def test_float_targets_with_the_cross_entropy_are_one_line(loss):
    """Float class labels given to the cross-entropy (the default, or named) are refused in one line saying what
    it takes; a loss name it does not know ('ce') is one line naming the losses."""
    with pytest.raises(LandscapeError) as error:
        landscape.hessian_eigs(MODEL, (X, Y.double()), k=2, loss=loss)
    assert _one_line(error) == ("data: the targets are float64 of shape [40]; the cross-entropy takes class indices "
                                "(integers: y.long()) or class probabilities of the outputs' shape [40, 3]; for "
                                "regression targets use loss='mse' (function API)")
    with pytest.raises(LandscapeError) as error:
        landscape.hessian_eigs(MODEL, (X, Y.double()), k=2, loss="ce")
    assert _one_line(error).startswith("unknown loss 'ce'; give one of cross-entropy, mse")
