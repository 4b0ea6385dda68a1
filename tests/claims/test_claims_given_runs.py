"""``landscape claims --runs RUN_ID=PATH``: a claim checked on runs trained elsewhere (a plain federated loop of
its own, recorded with landscape.RunWriter), one per seed, instead of the figure's runs; the values it tests are
those the runs recorded; what does not fit is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.helpers import invoke, one_line_error
from support.plain_fl import forget_lab, train, write_lab

from landscape.store.directory import RunDir

CLAIM = "claims/fedsam-distance-grows-with-heterogeneity.toml"  # flatness_distance over the last 5 rounds
IDS = ("fedsam-alpha0.6", "fedsam-alpha0.3", "fedsam-alpha0.1")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """For each run id of the claim, runs of seeds 0 and 1 (5 rounds of the plain loop, the clients'
    minibatches in another order per seed and id), in a folder per id."""
    root = tmp_path_factory.mktemp("given")
    write_lab(root)
    for k, run_id in enumerate(IDS):
        for seed in (0, 1):
            train(root / run_id / f"s{seed}", sam=True, rounds=5, shuffle=10 * k + seed, seed=seed)
    yield root
    forget_lab(root)


def _args(recorded, *more):
    runs = [arg for run_id in IDS for arg in ("--runs", f"{run_id}={recorded / run_id}")]
    return ["claims", CLAIM, "--seeds", "0,1", *runs, "--figures-out", recorded / "figures", "--quiet", *more]


def test_a_claim_is_checked_on_the_runs_given_with_the_values_they_recorded(recorded, tmp_path):
    result = invoke(*_args(recorded, "-o", tmp_path / "claims"))
    assert result.exit_code == 0, result.output
    assert not (recorded / "figures").exists(), "nothing of the figure was trained"
    (claim,) = json.loads((tmp_path / "claims" / "claims.json").read_text())

    def recorded_mean(run_id: str, seed: int) -> float:  # the mean of the last 5 rounds' Delta_D, as recorded
        rows = RunDir(recorded / run_id / f"s{seed}").read_metrics()
        return float(np.mean([r["flatness_distance"] for r in rows[-5:]]))

    for comparison in claim["comparisons"]:
        assert comparison["seeds"] == [0, 1] and comparison["rounds"] == [1, 2, 3, 4, 5]
        for side in ("lower", "higher"):
            expected = [recorded_mean(comparison[side], seed) for seed in (0, 1)]
            np.testing.assert_allclose(comparison[f"{side}_values"], expected, rtol=1e-14, atol=0)


def test_the_dry_run_names_the_runs_given(recorded):
    result = invoke(*_args(recorded, "--dry-run"))
    assert result.exit_code == 0, result.output
    assert f"fedsam-alpha0.1: the runs given, {recorded / 'fedsam-alpha0.1' / 's0'}" in result.output


def test_runs_that_do_not_fit_are_refused_in_one_line(recorded, tmp_path):
    missing = invoke("claims", CLAIM, "--seeds", "0,1,2", "--runs", f"fedsam-alpha0.1={recorded / 'fedsam-alpha0.1'}",
                     "--dry-run")
    assert "--runs fedsam-alpha0.1: " in one_line_error(missing) and "no run of seed(s) 2" in one_line_error(missing)
    unknown = invoke("claims", CLAIM, "--runs", f"fedavg-x={recorded / 'fedsam-alpha0.1'}", "--dry-run")
    assert "--runs fedavg-x: no claim given compares such a run" in one_line_error(unknown)
    bad = invoke("claims", CLAIM, "--runs", "fedsam-alpha0.1", "--dry-run")
    assert "--runs takes RUN_ID=PATH" in one_line_error(bad)
