"""Data whose inputs are not finite in the run's dtype (they overflow it) is refused where it enters, naming the
data set and the setting (issue 46, U6), not trained on until it "diverges" with advice about the learning
rate; data finite but far beyond unit scale that makes a run diverge is named as the likely cause."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.helpers import invoke, one_line_error

from landscape.core.errors import LandscapeError
from landscape.data.datasets import load_dataset


def synthetic(beta: float, dtype: torch.dtype):
    return load_dataset("synthetic", root="unused", download=False, augment=False, num_clients=2, seed=0,
                        options={"beta": beta, "dimension": 6, "classes": 3}, dtype=dtype)


@pytest.mark.parametrize(("beta", "dtype", "refused"), [
    (1e40, torch.float32, True),  # finite as made (float64), inf in a float32 run
    (1e40, torch.float64, False),
    (1e30, torch.float32, False),
])
def test_inputs_not_finite_in_the_run_s_dtype_are_refused_naming_the_setting(beta, dtype, refused):
    if not refused:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no warning either
            bundle = synthetic(beta, dtype)
        assert bundle.train.x.dtype == dtype and bool(torch.isfinite(bundle.train.x).all())
        return
    with pytest.raises(LandscapeError) as e:
        synthetic(beta, dtype)
    message = str(e.value)
    assert message.startswith(f"data set synthetic with dataset.beta={beta!r}: ") and "\n" not in message
    assert f"not finite in {str(dtype).split('.')[-1]}" in message and "choose smaller values of dataset.beta" in message
    assert "dimension" not in message  # options changed, but not ones that scale the data


@pytest.mark.parametrize(("beta", "expected"), [
    # not finite in float32: refused where the data enters, before a run folder is made
    ("1e40", "error: data set synthetic with dataset.beta=1e+40: "),
    # finite but far beyond unit scale: the run diverges, and the message says the data, not the step size
    ("1e15", "the training inputs reach |x| = "),
])
def test_training_on_data_of_an_odd_scale_says_the_data(tmp_path, beta, expected):
    line = one_line_error(invoke("train", "--dataset", "synthetic", "--model", "mlp", "--set", f"dataset.beta={beta}",
                                 "--clients", "2", "--rounds", "1", "--device", "cpu", "--quiet",
                                 "--out", tmp_path / "run"))
    assert expected in line, line
    assert "a smaller train.lr" not in line and "dataset.beta" in line, line
    if beta == "1e40":
        assert line.startswith(expected) and not (tmp_path / "run").exists()
    else:
        assert line.startswith("error: training diverged in round 1") and "choose smaller values of dataset.beta" in line


def test_divergence_advice_names_the_step_size_for_data_of_unit_scale():
    from landscape.config.sections import DatasetSettings
    from landscape.train.state import INPUT_SCALE, divergence_advice

    synthetic = DatasetSettings(name="synthetic", options={"alpha": 1.0, "beta": 3e9, "dimension": 6})
    assert divergence_advice(torch.randn(50, 6), synthetic) == "a smaller train.lr or train.clip_norm may help"
    large = divergence_advice(torch.full((5, 6), 3 * INPUT_SCALE), synthetic)
    assert large.startswith("the training inputs reach |x| = 3e+04 (data set synthetic with dataset.beta=3e+09)")
    assert large.endswith("choose smaller values of dataset.beta")
    digits = divergence_advice(torch.full((5, 6), -7e20), DatasetSettings(name="digits"))
    assert "|x| = 7e+20 (data set digits)" in digits and digits.endswith("standardise the inputs")
