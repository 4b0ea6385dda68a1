"""analyze.memory_format: the analysis's losses and gradients in channels-last layout equal the contiguous ones to
float tolerance, its Hessian-vector products stay contiguous (the same bits whatever the setting), "auto" is resolved
from the model and the device alone (never a clock), a layout is recorded beside a result's settings and never renames or
recomputes a result, and a model without convolutions stays contiguous."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from support.helpers import analyze_args, invoke, result_file, tiny_recipe

from landscape.analyze.context import CheckpointContext
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.measure.operator import HessianOperator
from landscape.train import loop


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    """A tiny digits run of the CNN (contiguous training), its clients kept."""
    out = tmp_path_factory.mktemp("layout") / "run"
    recipe = tiny_recipe(model__name="cnn", train__rounds=2, train__keep_clients=True,
                         train__memory_format="contiguous")
    loop.start_run(recipe, out, progress=False)
    return out


def context(run, memory_format_setting: str, dtype: str = "auto") -> CheckpointContext:
    (source,), _ = find_sources(run)
    return CheckpointContext(source, 2, AnalysisSettings(device="cpu", memory_format=memory_format_setting,
                                                         analysis_samples=200, dtype=dtype))


def pool_layouts(ctx: CheckpointContext) -> list[bool]:
    """Whether each forward fed the CNN's first max-pool (after the one-channel convolution) a channels-last
    tensor."""
    seen: list[bool] = []
    ctx.flat.module.pool1.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0].is_contiguous(memory_format=torch.channels_last)))
    return seen


def test_losses_and_gradients_follow_the_layout_and_agree_to_float_tolerance(cnn_run):
    values = {}
    for layout in ("contiguous", "channels-last"):
        ctx = context(cnn_run, layout, dtype="float64")
        _ = ctx.objective  # the layout settled (after the check of model and data, one forward)
        seen = pool_layouts(ctx)
        loss, grad = ctx.objective.loss_and_grad(ctx.w)
        client_loss = ctx.client_objective(1).loss(ctx.w)
        assert ctx.memory_format.name == layout and ctx.memory_format.reason == f'analyze.memory_format = "{layout}"'
        assert seen and set(seen) == {layout == "channels-last"}  # the global and the client objective alike
        values[layout] = (loss, grad, client_loss)
    (a, ga, ca), (b, gb, cb) = values["contiguous"], values["channels-last"]
    torch.testing.assert_close(b, a, rtol=1e-12, atol=0)
    torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(cb, ca, rtol=1e-12, atol=0)


def test_hessian_products_are_contiguous_whatever_the_layout(cnn_run):
    products = {}
    v = torch.randn(context(cnn_run, "contiguous").flat.dim, 2, generator=torch.Generator().manual_seed(0))
    for layout in ("contiguous", "channels-last"):
        ctx = context(cnn_run, layout)
        _ = ctx.objective  # the layout settled
        seen = pool_layouts(ctx)
        for backend in ("double-backward", "forward-over-reverse"):
            products[layout, backend] = HessianOperator(ctx.objective, ctx.w, backend).matmat(v.to(ctx.w.dtype))
        assert seen and not any(seen)
        assert ctx.flat.channels_last == (layout == "channels-last")  # set back after the products
    for backend in ("double-backward", "forward-over-reverse"):  # the same operations: the same bits
        assert torch.equal(products["contiguous", backend], products["channels-last", backend])


def test_auto_is_channels_last_for_a_cnn_on_the_cpu_whatever_the_clock(cnn_run, monkeypatch):
    ctx = context(cnn_run, "auto")
    assert ctx.memory_format is None  # nothing evaluated yet: nothing resolved
    monkeypatch.setattr(time, "perf_counter", lambda: pytest.fail("read a clock"))
    _ = ctx.client_objective(0)  # a client's objective settles it too (through the global one)
    assert ctx.memory_format.name == "channels-last" and ctx.flat.channels_last
    assert ctx.memory_format.reason == "auto on the CPU: channels-last for a model with 4-D convolution weights"


def test_no_convolutions_stay_contiguous(tmp_path):
    loop.start_run(tiny_recipe(model__name="mlp", model__hidden=[8], train__rounds=2), tmp_path / "mlp",
                   progress=False)
    mlp = context(tmp_path / "mlp", "auto")
    _ = mlp.objective
    assert mlp.memory_format.name == "contiguous" and "no 4-D convolution weights" in mlp.memory_format.reason


def test_the_layout_is_recorded_beside_the_settings_and_renames_nothing(cnn_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(cnn_run, run)
    folder = run / "analysis" / "round-0002"
    args = analyze_args(run, "--passes", "loss,flatness")
    result = invoke(*args, "--memory-format", "contiguous")
    assert result.exit_code == 0, result.output
    loss = json.loads(result_file(folder, "loss").read_text())
    assert loss["memory_format"] == {"name": "contiguous", "reason": 'analyze.memory_format = "contiguous"'}
    assert "memory_format" not in loss["settings"]["analysis"] and loss["threads"] == 1
    before = {p.name for p in folder.iterdir()}
    # the other layout: the same results (the last bits only), so they are found and skipped
    again = invoke(*args, "--memory-format", "channels-last")
    assert again.exit_code == 0 and "0 computed, 2 already done" in again.output, again.output
    forced = invoke(*args, "--memory-format", "channels-last", "--force")
    assert forced.exit_code == 0, forced.output
    assert {p.name for p in folder.iterdir()} == before
    redone = json.loads(result_file(folder, "loss").read_text())
    assert redone["memory_format"]["name"] == "channels-last"
    assert redone["summary"]["loss"] == pytest.approx(loss["summary"]["loss"], rel=1e-5)
    flatness = json.loads(result_file(folder, "flatness").read_text())
    assert "memory_format" not in flatness or flatness["memory_format"]["name"] == "channels-last"
