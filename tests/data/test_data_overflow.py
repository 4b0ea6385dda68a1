"""Data whose inputs are not finite in the run's dtype (they overflow it) is refused where it enters, naming the
data set and the setting (issue 46, U6), not trained on until it "diverges" with advice about the learning
rate."""

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
    (1e308, torch.float32, True),  # overflows numpy's float64 already
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


def test_train_on_overflowing_data_is_one_line_before_any_work(tmp_path):
    line = one_line_error(invoke("train", "--dataset", "synthetic", "--model", "mlp", "--set", "dataset.beta=1e308",
                                 "--clients", "2", "--rounds", "1", "--device", "cpu", "--quiet",
                                 "--out", tmp_path / "run"))
    assert line.startswith("error: data set synthetic with dataset.beta=1e+308: ") and "diverged" not in line
    assert not (tmp_path / "run").exists()
