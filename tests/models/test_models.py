"""Tests for landscape.models: shapes, determinism, layer sizes, parameter counts and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from landscape.core.errors import LandscapeError
from landscape.models import MODELS, build_model

DIGITS = (1, 8, 8)
MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def logits(model: nn.Module, input_shape: tuple[int, ...], batch: int = 2) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(torch.randn(batch, *input_shape))


def test_registry_names() -> None:
    assert MODELS.names() == ["cnn", "factory", "lenet5", "mlp", "resnet18", "stacked-lstm"]


@pytest.mark.parametrize(
    ("name", "input_shape", "num_classes"),
    [
        ("mlp", DIGITS, 10),
        ("mlp", MNIST, 10),
        ("mlp", CIFAR, 10),
        ("mlp", CIFAR, 100),
        ("mlp", (60,), 3),
        ("cnn", DIGITS, 10),
        ("cnn", MNIST, 10),
        ("cnn", CIFAR, 10),
        ("cnn", CIFAR, 100),
        ("lenet5", MNIST, 10),
        ("lenet5", CIFAR, 10),
        ("lenet5", CIFAR, 100),
        ("lenet5", (3, 16, 20), 7),
        ("resnet18", DIGITS, 10),
        ("resnet18", MNIST, 10),
        ("resnet18", CIFAR, 10),
        ("resnet18", CIFAR, 100),
    ],
)
def test_output_shape(name: str, input_shape: tuple[int, ...], num_classes: int) -> None:
    torch.manual_seed(0)
    out = logits(build_model(name, input_shape, num_classes), input_shape)
    assert out.shape == (2, num_classes)
    assert torch.isfinite(out).all()


def test_resnet18_bn_output_shape() -> None:
    torch.manual_seed(0)
    out = logits(build_model("resnet18", CIFAR, 10, {"norm": "bn"}), CIFAR)
    assert out.shape == (2, 10)


@pytest.mark.parametrize(
    ("name", "input_shape", "options"),
    [
        ("mlp", DIGITS, {}),
        ("cnn", DIGITS, {}),
        ("lenet5", CIFAR, {}),
        ("resnet18", CIFAR, {}),
        ("resnet18", CIFAR, {"norm": "bn"}),
    ],
)
def test_same_seed_same_parameters(name: str, input_shape: tuple[int, ...], options: dict) -> None:
    torch.manual_seed(123)
    a = build_model(name, input_shape, 10, options).state_dict()
    torch.manual_seed(123)
    b = build_model(name, input_shape, 10, options).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(124)
    c = build_model(name, input_shape, 10, options).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_no_dropout_and_deterministic_forward() -> None:
    torch.manual_seed(0)
    for name, shape in [("mlp", DIGITS), ("cnn", DIGITS), ("lenet5", CIFAR)]:
        model = build_model(name, shape, 10)
        assert not any(isinstance(m, nn.Dropout) for m in model.modules())
        model.train()
        x = torch.randn(4, *shape)
        assert torch.equal(model(x), model(x))


def test_option_defaults() -> None:
    assert MODELS.get("mlp").option_defaults() == {"hidden": (200, 200)}  # a TOML array, frozen
    assert MODELS.get("cnn").option_defaults() == {"width": 32, "hidden": 128}
    assert MODELS.get("lenet5").option_defaults() == {}
    assert MODELS.get("resnet18").option_defaults() == {"norm": "gn", "groups": 2}
    assert MODELS.get("stacked-lstm").option_defaults() == {"embedding": 8, "hidden": 256, "layers": 2}


def test_mlp_layers() -> None:
    linears = [m for m in build_model("mlp", DIGITS, 10).modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 200), (200, 200), (200, 10)]
    assert n_params(build_model("mlp", DIGITS, 10)) == 64 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    linears = [
        m for m in build_model("mlp", (60,), 3, {"hidden": [16]}).modules() if isinstance(m, nn.Linear)
    ]
    assert [(m.in_features, m.out_features) for m in linears] == [(60, 16), (16, 3)]
    # no hidden layers: multinomial logistic regression
    assert n_params(build_model("mlp", (60,), 3, {"hidden": []})) == 60 * 3 + 3


def test_cnn_layers_and_size() -> None:
    model = build_model("cnn", DIGITS, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [tuple(m.weight.shape) for m in convs] == [(32, 1, 3, 3), (64, 32, 3, 3)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64 * 2 * 2, 128), (128, 10)]
    expected = (1 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (256 * 128 + 128) + (128 * 10 + 10)
    assert n_params(model) == expected == 53002
    narrow = build_model("cnn", (3, 32, 32), 5, {"width": 8, "hidden": 16})
    linears = [m for m in narrow.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(16 * 8 * 8, 16), (16, 5)]


def test_lenet5_layers() -> None:
    model = build_model("lenet5", CIFAR, 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [tuple(m.weight.shape) for m in convs] == [(64, 3, 5, 5), (64, 64, 5, 5)]
    assert all(m.padding == (0, 0) for m in convs)
    assert [(m.in_features, m.out_features) for m in linears] == [(64 * 5 * 5, 384), (384, 192), (192, 10)]
    expected = (
        (3 * 25 * 64 + 64) + (64 * 25 * 64 + 64) + (1600 * 384 + 384) + (384 * 192 + 192) + (192 * 10 + 10)
    )
    assert n_params(model) == expected == 797962
    # MNIST-sized input: 28 -> 24 -> 12 -> 8 -> 4
    fc1 = next(m for m in build_model("lenet5", MNIST, 10).modules() if isinstance(m, nn.Linear))
    assert fc1.in_features == 64 * 4 * 4


def resnet18_param_count(in_channels: int, num_classes: int) -> int:
    """Hand count: bias-free convs, 2 affine parameters per channel per norm layer, linear head."""

    def conv(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k

    def norm(c: int) -> int:
        return 2 * c

    total = conv(in_channels, 64, 3) + norm(64)  # CIFAR stem
    cin = 64
    for cout in (64, 128, 256, 512):
        for _ in range(2):
            total += conv(cin, cout, 3) + norm(cout) + conv(cout, cout, 3) + norm(cout)
            if cin != cout:  # 1x1 projection shortcut (first block of stages 2-4)
                total += conv(cin, cout, 1) + norm(cout)
            cin = cout
    return total + 512 * num_classes + num_classes


def test_resnet18_parameter_count() -> None:
    assert resnet18_param_count(3, 10) == 11_173_962
    assert n_params(build_model("resnet18", CIFAR, 10)) == 11_173_962
    assert n_params(build_model("resnet18", CIFAR, 10, {"norm": "bn"})) == 11_173_962
    assert n_params(build_model("resnet18", MNIST, 100)) == resnet18_param_count(1, 100)


def test_resnet18_norms() -> None:
    gn = build_model("resnet18", CIFAR, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gn.modules())
    assert list(gn.buffers()) == []
    group_norms = [m for m in gn.modules() if isinstance(m, nn.GroupNorm)]
    assert len(group_norms) == 1 + 8 * 2 + 3  # stem, two per block, three projection shortcuts
    assert all(m.num_groups == 2 for m in group_norms)
    assert all(
        m.num_groups == 4
        for m in build_model("resnet18", CIFAR, 10, {"groups": 4}).modules()
        if isinstance(m, nn.GroupNorm)
    )

    bn = build_model("resnet18", CIFAR, 10, {"norm": "bn"})
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules()) == 20
    assert not any(isinstance(m, nn.GroupNorm) for m in bn.modules())


def test_resnet18_cifar_stem() -> None:
    model = build_model("resnet18", CIFAR, 10)
    stem = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert tuple(stem.weight.shape) == (64, 3, 3, 3)
    assert stem.stride == (1, 1) and stem.padding == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_error_unknown_model() -> None:
    with pytest.raises(LandscapeError, match=r"unknown model 'vgg'; choose from: cnn, factory, lenet5, mlp, resnet18, stacked-lstm"):
        build_model("vgg", CIFAR, 10)


def test_error_bad_norm() -> None:
    with pytest.raises(LandscapeError, match=r"unknown norm 'ln' for resnet18; choose from: gn, bn"):
        build_model("resnet18", CIFAR, 10, {"norm": "ln"})


def test_error_bad_groups() -> None:
    with pytest.raises(LandscapeError, match=r"'groups' must divide 64"):
        build_model("resnet18", CIFAR, 10, {"groups": 3})


def test_error_lenet5_too_small() -> None:
    with pytest.raises(LandscapeError, match=r"lenet5 needs input at least 16x16 .*got 8x8"):
        build_model("lenet5", DIGITS, 10)
    with pytest.raises(LandscapeError, match=r"at least 16x16 .*got 15x32"):
        build_model("lenet5", (3, 15, 32), 10)


def test_error_cnn_too_small() -> None:
    with pytest.raises(LandscapeError, match=r"cnn needs input at least 4x4"):
        build_model("cnn", (1, 3, 3), 10)


@pytest.mark.parametrize("name", ["cnn", "lenet5", "resnet18"])
def test_error_image_model_on_features(name: str) -> None:
    with pytest.raises(
        LandscapeError, match=rf"{name} needs image input \(C, H, W\), got input shape \(60,\)"
    ):
        build_model(name, (60,), 10)


def test_error_unknown_option() -> None:
    with pytest.raises(LandscapeError, match=r"unknown option 'model\.depth'; allowed in \[model\]: width, hidden"):
        build_model("cnn", MNIST, 10, {"depth": 3})
    with pytest.raises(LandscapeError, match=r"lenet5 takes no options"):
        build_model("lenet5", CIFAR, 10, {"width": 3})


def test_error_bad_option_values() -> None:
    with pytest.raises(LandscapeError, match=r"model\.hidden must be a list \(got 200\)"):
        build_model("mlp", DIGITS, 10, {"hidden": 200})
    with pytest.raises(LandscapeError, match=r"mlp option 'hidden' must be a positive integer, got 0"):
        build_model("mlp", DIGITS, 10, {"hidden": [200, 0]})
    with pytest.raises(LandscapeError, match=r"model\.width must be an integer \(got 'wide'\)"):
        build_model("cnn", DIGITS, 10, {"width": "wide"})


def test_error_bad_shape_and_classes() -> None:
    with pytest.raises(LandscapeError, match=r"num_classes must be a positive integer"):
        build_model("mlp", (60,), 0)
    with pytest.raises(LandscapeError, match=r"input shape must be positive integers"):
        build_model("mlp", (0, 8, 8), 10)


def test_errors_are_one_line() -> None:
    bad_calls = [
        ("vgg", CIFAR, {}),
        ("resnet18", CIFAR, {"norm": "ln"}),
        ("lenet5", DIGITS, {}),
        ("cnn", (60,), {}),
    ]
    for name, shape, options in bad_calls:
        with pytest.raises(LandscapeError) as info:
            build_model(name, shape, 10, options)
        assert "\n" not in str(info.value)


def test_stacked_lstm_is_leaf_s_shakespeare_model_in_size() -> None:
    """Embedding 80 x 8, LSTM layers of 4 gates x 256 over [input, h] with a bias, linear 256 -> 80."""
    model = build_model("stacked-lstm", (80,), 80)
    lstm = lambda i, h: 4 * h * (i + h) + 4 * h  # noqa: E731
    assert n_params(model) == 80 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 80 + 80 == 817_872
    assert n_params(build_model("stacked-lstm", (20,), 7, {"embedding": 3, "hidden": 5, "layers": 3})) == (
        7 * 3 + lstm(3, 5) + 2 * lstm(5, 5) + 5 * 7 + 7)


def test_stacked_lstm_computes_torch_s_lstm_with_the_forget_bias_of_tensorflow_s_cell() -> None:
    """The same function as torch.nn.LSTM given the same weights (its gates i, f, g, o; ours TensorFlow's i, g, f,
    o) with 1 added to the forget gate's bias, on the last step's output; in float64 to compare closely."""
    torch.manual_seed(0)
    model = build_model("stacked-lstm", (12,), 9, {"hidden": 6}).double()
    reference = nn.LSTM(8, 6, num_layers=2, batch_first=True).double()
    with torch.no_grad():
        for k, layer in enumerate(model.layers):
            i, g, f, o = layer.input.weight.chunk(4)
            getattr(reference, f"weight_ih_l{k}").copy_(torch.cat([i, f, g, o]))
            i, g, f, o = layer.recurrent.weight.chunk(4)
            getattr(reference, f"weight_hh_l{k}").copy_(torch.cat([i, f, g, o]))
            i, g, f, o = layer.input.bias.chunk(4)
            getattr(reference, f"bias_ih_l{k}").copy_(torch.cat([i, f + 1.0, g, o]))
            getattr(reference, f"bias_hh_l{k}").zero_()
    tokens = torch.randint(0, 9, (5, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden, _ = reference(model.embedding(tokens))
        expected = model.out(hidden[:, -1])
        got = model(tokens.double())  # the data sets' inputs are float: indices read back as whole numbers
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_stacked_lstm_needs_a_sequence() -> None:
    with pytest.raises(LandscapeError, match=r"stacked-lstm needs a sequence of token indices \(L,\), got input "
                                             r"shape \(1, 8, 8\)"):
        build_model("stacked-lstm", DIGITS, 10)
    with pytest.raises(LandscapeError, match="stacked-lstm option 'hidden' must be a positive integer, got 0"):
        build_model("stacked-lstm", (80,), 80, {"hidden": 0})
