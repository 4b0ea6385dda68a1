"""Only trainable parameters are analysed (and trained): a tensor with requires_grad=False is a constant at its
value, never perturbed nor differentiated, as PyHessian treats it; ``dim`` counts the trainable entries.

Every number is checked against a model written out by hand as a function of its trainable tensors only
(``_reference_loss``), with torch.autograd.functional.hessian for its dense Hessian."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from support.helpers import tiny_recipe, write_user_module
from torch import nn

import landscape
from landscape.cli import cli
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import as_data
from landscape.measure.pyhessian_backend import pyhessian_lambda_max_and_trace

IN, HIDDEN, OUT = 5, 4, 3
TRAINABLE = HIDDEN + OUT * HIDDEN + OUT  # 0.bias, 2.weight, 2.bias: 19 entries
FROZEN = HIDDEN * IN  # 0.weight: 20 entries


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT)).double()
    net[0].weight.requires_grad_(False)  # a frozen (e.g. pretrained) layer
    return net


def _data(n: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, IN, generator=g, dtype=torch.float64), torch.randint(0, OUT, (n,), generator=g)


def _trainable_vector(net: nn.Sequential) -> torch.Tensor:
    return torch.cat([net[0].bias, net[2].weight.reshape(-1), net[2].bias]).detach().clone()


def _reference_loss(frozen_weight: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """F(u) written out by hand: u = (b0, W1, b1), the first layer's weight a constant."""

    def loss(u: torch.Tensor) -> torch.Tensor:
        b0, w1, b1 = u[:HIDDEN], u[HIDDEN:HIDDEN + OUT * HIDDEN].view(OUT, HIDDEN), u[HIDDEN + OUT * HIDDEN:]
        return F.cross_entropy(torch.tanh(x @ frozen_weight.T + b0) @ w1.T + b1, y)

    return loss


def _dense_hessian(net: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = _reference_loss(net[0].weight.detach(), x, y)
    return torch.autograd.functional.hessian(loss, _trainable_vector(net))


def test_the_layout_holds_the_trainable_parameters_only():
    net = _net()
    flat = FlatModel(net)
    assert (flat.dim, flat.frozen_dim, flat.frozen_names) == (TRAINABLE, FROZEN, ["0.weight"])
    assert flat.names == ["0.bias", "2.weight", "2.bias"]
    torch.testing.assert_close(flat.vector(), _trainable_vector(net), rtol=0, atol=0)
    buffers = flat.buffers()  # the constants: buffers and frozen parameters
    assert list(buffers) == ["0.weight"] and torch.equal(buffers["0.weight"], net[0].weight)
    state = flat.state_dict(flat.vector(), buffers)  # a checkpoint still holds every parameter
    assert list(state) == list(net.state_dict()) and all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    # an ordinary model: every parameter, in named_parameters() order (training's layout is unchanged)
    plain = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))
    plain_flat = FlatModel(plain)
    assert plain_flat.frozen_dim == 0 and plain_flat.buffers() == {}
    assert torch.equal(plain_flat.vector(), torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))


def test_hessian_eigenvalues_and_trace_are_those_of_the_trainable_parameters():
    net, (x, y) = _net(), _data()
    hessian = _dense_hessian(net, x, y)
    exact = torch.linalg.eigvalsh(hessian).flip(0)
    problem = landscape.problem(net, (x, y))
    assert problem.flat.dim == problem.w.numel() == TRAINABLE and problem.flat.frozen_dim == FROZEN
    eigs = landscape.hessian_eigs(net, (x, y), k=3, tol=1e-10)
    torch.testing.assert_close(torch.from_numpy(eigs.values), exact[:3], rtol=1e-8, atol=1e-12)
    trace = landscape.trace(net, (x, y), hvps=3 * TRAINABLE, method="hutch++")
    assert trace.estimate == pytest.approx(float(torch.trace(hessian)), rel=1e-8)
    assert net[0].weight.requires_grad is False and all(p.grad is None for p in net.parameters())


def test_pyhessian_differentiates_the_same_parameters():
    net, (x, y) = _net(), _data()
    exact = float(torch.linalg.eigvalsh(_dense_hessian(net, x, y))[-1])
    flat = FlatModel(net)
    data = as_data((x, y), batch_size=10)
    result = pyhessian_lambda_max_and_trace(net, data, flat.vector(), top_n=1, trace_iters=0, max_iter=300,
                                            tol=1e-10, seed=0)
    assert result.lambda_max == pytest.approx(exact, rel=1e-4)  # its power iteration's own stopping rule
    assert net[0].weight.requires_grad is False


def test_sharpness_surface_and_flatness_distance_see_the_same_layout():
    net, (x, y) = _net(), _data()
    loss = _reference_loss(net[0].weight.detach(), x, y)
    u = _trainable_vector(net).requires_grad_(True)
    (g,) = torch.autograd.grad(loss(u), u)
    rho = 0.05
    u = u.detach()
    sam = landscape.sharpness(net, (x, y), rho=rho, steps=1, starts=1)  # the SAM estimate: e = rho g / ||g||
    assert sam.perturbed_loss[0] == pytest.approx(float(loss(u + rho * g / g.norm())), rel=1e-10)
    assert sam.sharpness[0] == pytest.approx(float(loss(u + rho * g / g.norm()) - loss(u)), rel=1e-8)
    d = torch.linspace(-1, 1, TRAINABLE, dtype=torch.float64)
    line = landscape.surface(net, (x, y), grid=3, dims=1, directions=(d,))
    expected = [float(loss(u + t * d)) for t in (-1.0, 0.0, 1.0)]
    assert line.loss.tolist() == pytest.approx(expected, rel=1e-10)
    plane = landscape.surface(net, (x, y), grid=3, seed=2)  # filter-normalised: the frozen tensor stays put
    assert plane.loss.shape == (3, 3)
    other = _net(seed=4)  # other trainable and other frozen values
    distance = landscape.flatness_distance(net, [other]).distance_to_global  # ||y - x||^2, trainable entries
    assert distance == pytest.approx(float(((_trainable_vector(other) - u) ** 2).sum()), rel=1e-12)


def test_a_model_with_nothing_trainable_is_refused_in_one_line():
    net = _net()
    net.requires_grad_(False)
    with pytest.raises(LandscapeError, match="no trainable parameters") as info:
        landscape.hessian_eigs(net, _data(), k=1)
    assert "\n" not in str(info.value)


USER_MODULE = textwrap.dedent(f'''
    import torch
    from torch import nn

    from landscape.models import MODELS


    def make_net():
        torch.manual_seed(3)
        net = nn.Sequential(nn.Linear({IN}, {HIDDEN}), nn.Tanh(), nn.Linear({HIDDEN}, {OUT})).double()
        net[0].weight.requires_grad_(False)
        return net


    def make_data():
        g = torch.Generator().manual_seed(1)
        return torch.randn(30, {IN}, generator=g, dtype=torch.float64), torch.randint(0, {OUT}, (30,), generator=g)


    @MODELS.register("frozennet", summary="a model with a frozen first layer")
    def frozennet(input_shape, num_classes, options):
        torch.manual_seed(0)
        n = int(torch.tensor(input_shape).prod())
        net = nn.Sequential(nn.Flatten(), nn.Linear(n, 8), nn.Tanh(), nn.Linear(8, num_classes))
        net[1].weight.requires_grad_(False)
        return net
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = write_user_module(tmp_path, monkeypatch, "frozenlab", USER_MODULE)
    yield name
    from landscape.models import MODELS

    MODELS._entries.pop("frozennet", None)
    sys.modules.pop(name, None)


def test_a_state_dict_through_the_cli_keeps_its_frozen_values(tmp_path, user_module):
    module = __import__(user_module)
    net = module.make_net()
    with torch.no_grad():
        net[0].weight.mul_(3.0)  # the saved frozen values differ from what the factory builds
    torch.save(net.state_dict(), tmp_path / "mine.pt")
    result = CliRunner().invoke(cli, [
        "analyze", str(tmp_path / "mine.pt"), "--model", f"{user_module}:make_net", "--dataset",
        f"{user_module}:make_data", "--passes", "hessian", "--quiet", "--dtype", "float64", "--set",
        "hessian.top_k=2", "--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=4"])
    assert result.exit_code == 0, result.output
    record = json.loads(next((tmp_path / "analysis" / "mine").glob("hessian*.json")).read_text())["result"]
    x, y = module.make_data()
    exact = torch.linalg.eigvalsh(_dense_hessian(net, x, y)).flip(0)
    assert record["dim"] == TRAINABLE and record["frozen"] == FROZEN
    assert record["top"]["values"] == pytest.approx(exact[:2].tolist(), rel=1e-6)


def test_training_keeps_frozen_parameters_at_their_values(tmp_path, user_module):
    from landscape.train import loop

    recipe = tiny_recipe(imports=[user_module], model__name="frozennet", train__rounds=2, train__participation=0.75,
                         algorithm__name="fedsam")
    loop.start_run(recipe, tmp_path / "run", progress=False)
    run = landscape.open_run(tmp_path / "run")
    first, last = run.model(0), run.model(2)
    assert first[1].weight.requires_grad is False
    assert torch.equal(first[1].weight, last[1].weight)  # bit for bit: never trained, never averaged
    assert not torch.equal(first[1].bias, last[1].bias) and not torch.equal(first[3].weight, last[3].weight)
    assert run.recipe.model.name == "frozennet"
