"""What the multi-start S_rho search says of the maximum: each start's value, their spread, how many starts
reached the best (``maximum_agreed``), what ``ascent_converged`` describes, and the ">=" of the summary."""

import math

import numpy as np
import pytest
import torch
from support.helpers import tiny_recipe

from landscape.analyze.summary import LOWER_BOUNDS, AnalysisReport, format_summary
from landscape.measure.ascent import search_agreement
from landscape.measure.sharpness import local_sharpness, rho_sharpness


class Bumps:
    """F(z) = sum_k h_k exp(-||z - p_k||^2 / (2 s^2)) in the plane, exactly: two maxima on the unit circle around
    0, a low one at (1, 0) towards which the gradient at 0 points, and a high one at (-1, 0)."""

    centres = torch.tensor([[1.05, 0.0], [-1.6, 0.0]], dtype=torch.float64)
    heights = torch.tensor([1.0, 4.0], dtype=torch.float64)
    width = 0.5

    def _terms(self, w):
        return self.heights * torch.exp(-((w - self.centres) ** 2).sum(1) / (2 * self.width**2))

    def loss(self, w):
        return self._terms(w).sum()

    def loss_and_grad(self, w):
        terms = self._terms(w)
        return terms.sum(), -(terms[:, None] * (w - self.centres)).sum(0) / self.width**2


def _circle_maxima(objective, rho):
    """The two local maxima of F on the ball of radius ``rho`` around 0, by a dense grid over the disk (every
    maximum lies on the circle here): (low, high) of S = F(e) - F(0), each the best grid value of its half
    plane (x > 0: the low maximum's, x < 0: the high one's)."""
    r = torch.linspace(0, rho, 401, dtype=torch.float64)
    theta = torch.linspace(-math.pi, math.pi, 20001, dtype=torch.float64)
    points = torch.stack([r[:, None] * theta.cos(), r[:, None] * theta.sin()], -1).reshape(-1, 2)
    terms = objective.heights * torch.exp(-((points[:, None, :] - objective.centres) ** 2).sum(-1)
                                          / (2 * objective.width**2))
    values = terms.sum(1) - float(objective.loss(torch.zeros(2, dtype=torch.float64)))
    low = float(values[points[:, 0] > 0].max())
    high = float(values[points[:, 0] < 0].max())
    return low, high


def test_one_start_ends_on_the_low_maximum_and_says_so():
    quad, w = Bumps(), torch.zeros(2, dtype=torch.float64)
    low, high = _circle_maxima(quad, 1.0)
    assert low < 0.6 * high  # the problem: a local maximum far below the global one
    g = quad.loss_and_grad(w)[1]
    assert g[0] > 0 and g[1] == 0  # the SAM direction points to the low maximum
    one = rho_sharpness(quad, w, 1.0, starts=1)
    assert one.sharpness == pytest.approx(low, rel=1e-3)
    # the ascent converged (to its own local maximum): the flag says so, and no more
    assert one.ascent_converged and one.start_converged.tolist() == [True]
    # one start is no evidence of the maximum: not agreed, no spread to measure
    assert one.starts_at_best == 1 and not one.maximum_agreed and one.start_spread == 0.0
    np.testing.assert_array_equal(one.start_sharpness, [one.sharpness])


def test_several_starts_find_the_high_maximum_and_measure_their_spread():
    quad, w = Bumps(), torch.zeros(2, dtype=torch.float64)
    low, high = _circle_maxima(quad, 1.0)
    r = rho_sharpness(quad, w, 1.0, starts=8, seed=0)
    assert r.sharpness == pytest.approx(high, rel=1e-3) and r.best_start > 0
    values = r.start_sharpness
    assert values[0] == pytest.approx(low, rel=1e-3)  # the centre's start: the low maximum, as alone
    # every start ends on one of the two maxima of the grid
    on_high = np.isclose(values, high, rtol=1e-3, atol=0)
    on_low = np.isclose(values, low, rtol=1e-3, atol=0)
    assert (on_high | on_low).all() and on_high.sum() >= 2
    assert r.starts_at_best == on_high.sum() and r.maximum_agreed and r.ascent_converged
    assert r.start_converged.all()
    # the spread against the grid's two maxima: (high - low) / high
    assert r.start_spread == pytest.approx((high - low) / high, rel=1e-2)
    assert r.start_spread == pytest.approx((values.max() - values.min()) / values.max(), rel=1e-12)


def test_search_agreement_counts_starts_within_tol_of_the_best():
    got = search_agreement(np.array([1.0, 0.9995, 0.5, 0.998]), 1e-3)
    assert got == {"starts_at_best": 2, "maximum_agreed": True, "start_spread": 0.5}
    alone = search_agreement(np.array([0.2, 1.0, 0.7]), 1e-3)
    assert alone == {"starts_at_best": 1, "maximum_agreed": False, "start_spread": pytest.approx(0.8)}
    # no start beat the centre: every start found S = 0, which two starts confirm and one does not
    assert search_agreement(np.zeros(3), 1e-3) == {"starts_at_best": 3, "maximum_agreed": True, "start_spread": 0.0}
    assert search_agreement(np.zeros(1), 1e-3)["maximum_agreed"] is False
    assert search_agreement(np.array([2.0, 2.0]), 0.0)["starts_at_best"] == 2  # tol 0: exact ties only


def test_local_sharpness_keeps_each_clients_flags():
    quad, w = Bumps(), torch.zeros(2, dtype=torch.float64)
    res = local_sharpness({0: quad, 1: quad}, quad, w, 1.0, starts=1)
    assert res.global_ascent_converged and not res.global_maximum_agreed
    assert res.client_ascent_converged.tolist() == [True, True] and not res.client_maximum_agreed.any()
    np.testing.assert_array_equal(res.client_start_spread, [0.0, 0.0])


def test_summary_prints_unconfirmed_s_rho_as_a_lower_bound():
    rows = [{"run": "a", "round": 3, "S_rho(0.05)": 0.125, "S_rho(0.1)": 0.25, LOWER_BOUNDS: ["S_rho(0.1)"]},
            {"run": "a", "round": 6, "S_rho(0.05)": 0.5, "S_rho(0.1)": 1.0}]
    out = format_summary(AnalysisReport(rows=rows))
    lines = out.splitlines()
    assert lines[0].split() == ["run", "round", "S_rho(0.05)", "S_rho(0.1)"]  # the list is no column
    assert lines[2].split() == ["a", "3", "0.125", ">=0.25"] and lines[3].split() == ["a", "6", "0.5", "1"]
    assert any(line.startswith(">=: S_rho is a lower bound only") for line in lines)
    plain = format_summary(AnalysisReport(rows=rows[1:]))
    assert ">=" not in plain


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.source import find_sources
    from landscape.train import loop

    root = tmp_path_factory.mktemp("search")
    loop.start_run(tiny_recipe(train__rounds=2, train__checkpoint_every=2), root / "run", progress=False)
    sources, _ = find_sources(root / "run")
    return CheckpointContext(sources[0], 2, AnalysisSettings(device="cpu"))


@pytest.mark.parametrize("starts", [1, 3])
def test_the_pass_names_the_values_the_search_does_not_confirm(context, starts):
    from landscape.analyze.catalog import load_passes, pass_options

    options = pass_options("sharpness", {"rhos": [0.02, 0.5], "starts": starts, "adaptive": False,
                                         "clients": 1})
    out = load_passes().get("sharpness").factory(context, options)
    result = out.scalars["global"]
    agreed, converged = (np.asarray(out.arrays.get(f"global.{k}", result.get(k)))
                         for k in ("maximum_agreed", "ascent_converged"))
    expected = [f"S_rho({rho:g})" for rho, a, c in zip((0.02, 0.5), agreed, converged) if not (a and c)]
    assert out.summary.get(LOWER_BOUNDS, []) == expected
    if starts == 1:  # one start confirms nothing
        assert expected == ["S_rho(0.02)", "S_rho(0.5)"]
    values = np.asarray(out.arrays.get("global.start_sharpness", result.get("start_sharpness")))
    assert np.asarray(values).shape == (2, starts)
