"""train.memory_format: channels-last training and evaluation equal the contiguous ones to float tolerance (and a
plain-PyTorch gradient), "auto" is resolved from the model and the device alone (never a clock: two runs under
different clocks write the same bytes), records its choice and a resume keeps it, a model without convolutions
stays contiguous, bad values are one-line errors."""

from __future__ import annotations

import hashlib
import itertools
import time

import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe

from landscape.core import memory_format
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.memory_format import choose_memory_format, recorded_choice
from landscape.models import build_model
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop
from landscape.train import trainer as trainer_module

CPU = torch.device("cpu")


def pool2_layouts(flat: FlatModel) -> list[bool]:
    """Whether each forward fed the CNN's second max-pool a channels-last tensor (a hook on ``pool2``)."""
    seen: list[bool] = []
    flat.module.pool2.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0].is_contiguous(memory_format=torch.channels_last)))
    return seen


@pytest.mark.parametrize("shape", [(5, 1, 8, 8), (32, 1, 3, 3), (4, 3, 6, 7)])
def test_a_copy_has_channels_last_strides_even_with_one_channel(shape):
    tensor = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    copy = memory_format.channels_last_copy(tensor)
    _, c, h, w = shape
    assert copy.stride() == (h * w * c, 1, w * c, c) and torch.equal(copy, tensor)
    assert memory_format.channels_last_copy(copy) is copy  # already laid out: no second copy
    copy.sum().backward()  # differentiable: the gradient reaches the original in its own layout
    assert torch.equal(tensor.grad, torch.ones_like(tensor)) and tensor.grad.is_contiguous()
    three_d = tensor.detach()[0]
    assert memory_format.channels_last_copy(three_d) is three_d  # not 4-D: as it is


def test_a_one_channel_input_runs_its_first_convolution_and_pooling_channels_last():
    """A grey-scale input's (N, 1, H, W) strides are NCHW's too: PyTorch would run the first block NCHW."""
    flat = FlatModel(build_model("cnn", (1, 8, 8), 10, {}))
    flat.channels_last = True
    seen: list[bool] = []
    flat.module.pool1.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0].is_contiguous(memory_format=torch.channels_last)
                                                   and inputs[0].stride(1) == 1))
    flat.loss_and_grad(flat.vector(), torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,)), {})
    assert seen == [True]


def test_channels_last_gradient_equals_a_plain_pytorch_gradient():
    torch.manual_seed(0)
    module = build_model("cnn", (1, 8, 8), 10, {}).double()
    x, y = torch.randn(16, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (16,))
    flat = FlatModel(module)
    flat.channels_last = True
    seen = pool2_layouts(flat)
    loss, grad = flat.loss_and_grad(flat.vector(), x, y, {})
    assert seen == [True]  # the layout really changed
    # plain PyTorch: the module's own NCHW forward and backward
    module.zero_grad()
    plain = F.cross_entropy(module(x), y)
    plain.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    assert seen == [True, False]
    torch.testing.assert_close(loss, plain.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-13)
    assert grad.is_contiguous() and grad.shape == (flat.dim,)


def test_channels_last_training_equals_contiguous_on_the_digits_cnn(tmp_path):
    trained = {}
    for layout in ("contiguous", "channels-last"):
        trainer = loop.Trainer(tiny_recipe(train__memory_format=layout), RunDir(tmp_path / layout))
        seen = pool2_layouts(trainer.flat)
        state = trainer.initial_state()
        assert trainer.memory_format.name == layout and trainer.flat.channels_last == (layout == "channels-last")
        for _ in range(2):
            state, _, row = trainer.run_round(state)
        evaluated = trainer.evaluate(state)
        assert seen and set(seen) == {layout == "channels-last"}  # training and evaluation
        trained[layout] = (state, row, evaluated)
    (a, row_a, eval_a), (b, row_b, eval_b) = trained["contiguous"], trained["channels-last"]
    assert not torch.equal(a.x, b.x)  # another order of float operations: the last bits differ
    torch.testing.assert_close(b.x, a.x, rtol=1e-5, atol=1e-6)
    assert row_b["train_loss"] == pytest.approx(row_a["train_loss"], rel=1e-5)
    assert eval_b == pytest.approx(eval_a, rel=1e-5)


def test_auto_is_recorded_and_a_resume_keeps_it(tmp_path, monkeypatch):
    recipe = tiny_recipe(train__rounds=2)
    run = tmp_path / "run"
    loop.start_run(recipe, run, progress=False)
    record = load_checkpoint(RunDir(run).checkpoint(2))["memory_format"]
    assert record == {"name": "channels-last",
                      "reason": "auto on the CPU: channels-last for a model with 4-D convolution weights"}
    assert 'memory_format = "auto"' in (run / "recipe.toml").read_text()  # recipe.toml keeps what was asked

    # the resume takes the checkpoint's choice, whatever the rule would say now
    with monkeypatch.context() as patched:
        patched.setattr(trainer_module, "choose_memory_format", lambda *a, **k: pytest.fail("resolved again"))
        resumed = loop.resume_run(run, rounds=3, progress=False)
    assert load_checkpoint(RunDir(run).checkpoint(3))["memory_format"] == record

    pinned = loop.start_run(tiny_recipe(train__rounds=3, train__memory_format="channels-last"), tmp_path / "pinned",
                            progress=False)
    assert torch.equal(resumed.x, pinned.x)


def _checkpoint_digests(run) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(run.rglob("*.pt"))}


def test_two_runs_under_different_clocks_write_the_same_bytes(tmp_path, monkeypatch):
    """Same recipe + seed + machine = same bits whatever the load: the second run sees a clock that runs 1000x
    slower and jumps (as a loaded machine's would); every checkpoint and clients file is byte-identical."""
    recipe = tiny_recipe(train__rounds=2, train__keep_clients=True)
    loop.start_run(recipe, tmp_path / "a", progress=False)
    ticks = itertools.count()
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() * 1000.0 + 7.3 * next(ticks) ** 1.5)
    loop.start_run(recipe, tmp_path / "b", progress=False)
    first, second = _checkpoint_digests(tmp_path / "a"), _checkpoint_digests(tmp_path / "b")
    assert len(first) >= 4 and any(name.endswith(".clients.pt") for name in first)
    assert first == second


def test_a_checkpoint_from_before_the_setting_resumes_contiguous(tmp_path):
    trainer = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "run"))
    payload = trainer.checkpoint_payload(trainer.initial_state())
    del payload["memory_format"]
    fresh = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "other"))
    fresh.state_from_checkpoint(payload, tmp_path / "round-0000.pt")
    assert fresh.memory_format.name == "contiguous" and not fresh.flat.channels_last
    assert recorded_choice(None, "x").reason.startswith("written before train.memory_format")


def test_a_model_without_convolutions_or_off_the_cpu_stays_contiguous(tmp_path):
    trainer = loop.Trainer(tiny_recipe(model__name="mlp"), RunDir(tmp_path / "mlp"))
    trainer.initial_state()
    assert trainer.memory_format.name == "contiguous" and not trainer.flat.channels_last
    assert "no 4-D convolution weights" in trainer.memory_format.reason
    cnn = FlatModel(build_model("cnn", (1, 8, 8), 10, {}))
    assert choose_memory_format("auto", cnn, torch.device("cuda")).name == "contiguous"
    assert choose_memory_format("auto", cnn, CPU).name == "channels-last"


@pytest.mark.parametrize("value", ["nchw", "channels_last", 1, True])
def test_bad_values_are_one_line_errors(value):
    with pytest.raises(LandscapeError, match=r"^train\.memory_format must be one of auto, channels-last, "
                                             r"contiguous \(got .*\)$"):
        tiny_recipe(train__memory_format=value)


def test_a_checkpoint_recording_an_unknown_format_is_refused(tmp_path):
    trainer = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "run"))
    payload = trainer.checkpoint_payload(trainer.initial_state())
    payload["memory_format"] = {"name": "nhwc"}
    fresh = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "other"))
    with pytest.raises(LandscapeError, match=r"round-0000.pt records an unknown memory format 'nhwc' \(one of "):
        fresh.state_from_checkpoint(payload, tmp_path / "round-0000.pt")
