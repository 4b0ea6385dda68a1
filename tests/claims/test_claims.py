"""Claims (landscape.claims.checks): claim files, one number per run, the paired test and the verdicts."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from landscape.claims import checks as claims
from landscape.claims import table as claims_table
from landscape.core.errors import LandscapeError
from landscape.core.rounds import ALL, LAST, LISTED, Rounds
from landscape.figures.rundata import RunData
from landscape.store.run import Run

ROOT = Path(__file__).resolve().parents[2]


def fake_run(path: Path, seed: int, distances: list[float]) -> RunData:
    """A run directory that logged flatness_distance at rounds 1..len(distances) (no analysis), read."""
    folder = path / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.toml").write_text(f'seed = {seed}\n\n[algorithm]\nname = "fedsam"\n')
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"round": r, "flatness_distance": d, "flatness_distance_to_global": d, "test_acc": 0.5}) + "\n"
        for r, d in enumerate(distances, 1)))
    return RunData(Run(folder))


def claim_file(tmp_path: Path, body: str, name: str = "c.toml") -> Path:
    figure = tmp_path / "fig.toml"
    figure.write_text('name = "fig"\n')
    path = tmp_path / name
    path.write_text('claim = "a < b"\nfigure = "fig.toml"\n' + body)
    return path


def test_one_sided_paired_t_matches_the_closed_forms():
    # two degrees of freedom: P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    d = [1.0, 2.0, 3.0]
    t, p = claims.one_sided_paired_t(d)
    assert t == pytest.approx(2.0 / (1.0 / math.sqrt(3)), rel=1e-12)
    assert p == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2, rel=1e-10)
    # one degree of freedom (Cauchy): P(T > t) = 1/2 - atan(t) / pi
    t1, p1 = claims.one_sided_paired_t([0.5, 1.5])
    assert t1 == pytest.approx(1.0 / 0.5, rel=1e-12)
    assert p1 == pytest.approx(0.5 - math.atan(t1) / math.pi, rel=1e-10)
    # the opposite direction is the complement
    _, q = claims.one_sided_paired_t([-x for x in d])
    assert p + q == pytest.approx(1.0)
    assert claims.one_sided_paired_t([2.0, 2.0, 2.0]) == (math.inf, 0.0)
    assert claims.one_sided_paired_t([0.0, 0.0]) == (0.0, 1.0)
    with pytest.raises(LandscapeError, match="two seeds"):
        claims.one_sided_paired_t([1.0])


def test_run_value_averages_the_chosen_rounds(tmp_path):
    run = fake_run(tmp_path, 0, [5.0, 4.0, 3.0, 2.0, 1.0])
    assert claims.run_value(run, "flatness_distance", "last")[0] == 1.0
    value, rounds = claims.run_value(run, "flatness_distance", "last 3")
    assert value == pytest.approx(2.0) and rounds == [3, 4, 5]
    assert claims.run_value(run, "flatness_distance", "all")[0] == pytest.approx(3.0)
    assert claims.run_value(run, "flatness_distance", (1, 5))[0] == pytest.approx(3.0)
    with pytest.raises(LandscapeError, match="last 9"):
        claims.run_value(run, "flatness_distance", "last 9")
    with pytest.raises(LandscapeError, match="round.s. 7"):
        claims.run_value(run, "flatness_distance", 7)
    with pytest.raises(LandscapeError, match="neither a metrics.jsonl key"):
        claims.run_value(run, "no_such_key", "last")
    with pytest.raises(LandscapeError, match="no hessian analysis"):
        claims.run_value(run, "lambda_max", "last")


def test_a_claim_s_rounds_take_the_one_grammar_of_rounds(tmp_path):
    run = fake_run(tmp_path, 0, [5.0, 4.0, 3.0, 2.0, 1.0])
    assert claims.run_value(run, "flatness_distance", "1, 5") == (pytest.approx(3.0), [1, 5])  # a comma list too
    with pytest.raises(LandscapeError, match=r"has no flatness_distance in metrics.jsonl at round\(s\) 6, 7 "):
        claims.run_value(run, "flatness_distance", "6,7,1")
    body = '[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "flatness_distance"\nrounds = {}\n'
    read = [claims.load_claim(claim_file(tmp_path, body.format(r))).comparisons[0].rounds
            for r in ('"2,3"', "[2, 3]", "3", '"last  2"')]
    assert read == [Rounds(LISTED, listed=(2, 3))] * 2 + [Rounds(LISTED, listed=(3,)), Rounds(LAST, count=2)]
    # in the table as written: one round, a list, the last N
    assert [claims._rounds_text(r) for r in read] == ["rounds 2,3", "rounds 2,3", "round 3", "last 2 rounds"]


def test_surface_width_is_the_area_of_the_level_set():
    axis = np.linspace(-1, 1, 21)
    x, y = np.meshgrid(axis, axis, indexing="ij")
    sharp, flat = 4.0 * (x**2 + y**2) + 0.3, 1.0 * (x**2 + y**2) + 0.3
    tau = 0.47  # no grid point on the level set itself
    for curvature, loss in ((4.0, sharp), (1.0, flat)):
        by_hand = np.mean(curvature * (x**2 + y**2) <= tau)
        assert claims.surface_width(loss, axis, axis, tau) == pytest.approx(by_hand)
    assert claims.surface_width(flat, axis, axis, tau) > claims.surface_width(sharp, axis, axis, tau)
    assert claims.surface_width(flat, axis, axis, 100.0) == 1.0


SEEDS5 = (0, 1, 2, 3, 4)


def make_claim(comparisons, level=0.05, seeds=SEEDS5, name="c") -> claims.Claim:
    return claims.Claim(Path(f"{name}.toml"), name, f"text {name}", "", Path("fig.toml"), seeds, tuple(comparisons),
                        level)


def groups(tmp_path, values: dict[str, list[list[float]]]) -> dict[str, list[RunData]]:
    return {run_id: [fake_run(tmp_path / run_id, seed, rows) for seed, rows in enumerate(per_seed)]
            for run_id, per_seed in values.items()}


def test_sign_flip_p_is_the_exact_permutation_test():
    from scipy import stats

    rng = np.random.default_rng(0)
    cases = [rng.normal(0.3, 1.0, n) for n in (2, 3, 5, 8, 12)]
    cases += [np.array([0.5, 0.0, 0.2, -0.1, 0.0]), np.array([1.0, 1.0, -1.0, 2.0])]  # zeros and tied sums
    for d in cases:
        p, q = claims.sign_flip_p(d)
        for alternative, mine in (("greater", p), ("less", q)):
            exact = stats.permutation_test((d,), np.mean, permutation_type="samples", alternative=alternative,
                                           n_resamples=np.inf).pvalue
            assert mine == pytest.approx(exact, abs=1e-15), (d, alternative)
    # the smallest p is 2^-n, reached when every difference points the same way
    assert claims.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5]) == (1 / 32, 1.0)
    assert claims.sign_flip_p([-0.1, -0.2, -0.3]) == (1.0, 1 / 8)
    # 20 differences, by brute force over all 2^20 sign patterns
    d = rng.normal(0.2, 1.0, 20)
    signs = 1 - 2 * ((np.arange(2**20)[:, None] >> np.arange(20)) & 1)
    sums = signs @ d
    assert claims.sign_flip_p(d)[0] == pytest.approx(np.mean(sums >= d.sum() - 1e-9), abs=1e-15)
    with pytest.raises(LandscapeError, match="at most 40"):
        claims.sign_flip_p(np.ones(41))
    with pytest.raises(LandscapeError, match="finite"):
        claims.sign_flip_p([1.0, math.nan])


def test_detectable_difference_solves_the_noncentral_t_power():
    from scipy import stats

    for n, sd, level in ((2, 1.0, 0.05), (3, 0.5, 0.05), (5, 0.03, 0.05), (10, 2.0, 0.01)):
        delta = claims.detectable_difference(sd, n, level)
        critical = stats.t.ppf(1 - level, n - 1)
        power = stats.nct.sf(critical, n - 1, delta * math.sqrt(n) / sd)
        assert power == pytest.approx(0.8, abs=1e-9)
        assert stats.nct.sf(critical, n - 1, 0.99 * delta * math.sqrt(n) / sd) < 0.8
    # at large n the t-test is the z-test: delta -> (z_0.95 + z_0.8) sd / sqrt(n)
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    assert claims.detectable_difference(1.0, 2000, 0.05) == pytest.approx(z / math.sqrt(2000), rel=1e-3)
    assert claims.detectable_difference(0.0, 5, 0.05) == 0.0
    for sd, n, level in ((-1.0, 5, 0.05), (1.0, 1, 0.05), (1.0, 5, 0.9), (math.nan, 5, 0.05)):
        with pytest.raises(LandscapeError):
            claims.detectable_difference(sd, n, level)


def test_holm_matches_a_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 * 0.005, 3 * 0.01, 2 * 0.03, max(1 * 0.04, 0.06)
    assert claims.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert claims.holm([0.6, 0.2]) == pytest.approx([0.6, 0.4])
    assert claims.holm([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])  # capped at 1, monotone
    assert claims.holm([0.02]) == [0.02] and claims.holm([]) == []
    with pytest.raises(LandscapeError, match="in \\[0, 1\\]"):
        claims.holm([0.1, math.nan])


def test_every_number_of_a_comparison_matches_scipy(tmp_path):
    from scipy import stats

    low, high = [1.1, 1.0, 0.9, 1.1, 0.9], [2.1, 2.2, 1.95, 2.0, 1.3]
    runs = groups(tmp_path, {"a": [[v] for v in low], "b": [[v] for v in high]})
    claim = make_claim([claims.Comparison("a", "b", "flatness_distance", "last")])
    (r,) = claims.evaluate(claim, runs).comparisons
    greater = stats.ttest_rel(high, low, alternative="greater")
    assert r.t == pytest.approx(greater.statistic, rel=1e-12) and r.p == pytest.approx(greater.pvalue, rel=1e-10)
    assert r.p_opposite == pytest.approx(stats.ttest_rel(high, low, alternative="less").pvalue, rel=1e-10)
    d = np.subtract(high, low)
    for alternative, mine in (("greater", r.p_signflip), ("less", r.p_signflip_opposite)):
        assert mine == pytest.approx(stats.permutation_test((d,), np.mean, permutation_type="samples",
                                                            alternative=alternative, n_resamples=np.inf).pvalue)
    interval = stats.ttest_rel(high, low).confidence_interval(0.95)
    assert r.mean_difference == pytest.approx(d.mean()) and r.ci95 == pytest.approx(interval, rel=1e-10)
    power = stats.nct.sf(stats.t.ppf(0.95, 4), 4, r.detectable_difference * math.sqrt(5) / d.std(ddof=1))
    assert power == pytest.approx(0.8, abs=1e-9)
    # alone, Holm's step is the identity; every seed higher: p_sign-flip = 1/32 < 0.05
    assert r.p_holm == r.p and r.family == 1 and r.p_signflip == 1 / 32 and r.verdict == claims.HELD


def test_verdicts_held_not_held_inconclusive(tmp_path):
    compare = claims.Comparison("a", "b", "flatness_distance", "last 2")
    runs = groups(tmp_path, {
        "a": [[9, 1.0, 1.2], [9, 1.1, 0.9], [9, 0.8, 1.0], [9, 1.2, 1.0], [9, 0.9, 0.9]],  # 1.1, 1.0, 0.9, 1.1, 0.9
        "b": [[0, 2.0, 2.2], [0, 2.4, 2.0], [0, 1.8, 2.1], [0, 2.0, 2.0], [0, 2.2, 2.3]],  # 2.1, 2.2, 1.95, 2, 2.25
        "c": [[0, 1.0, 1.6], [0, 0.1, 0.5], [0, 2.0, 1.0], [0, 0.4, 0.6], [0, 1.5, 1.7]],  # no clear order with a
    })
    held = claims.evaluate(make_claim([compare]), runs)
    assert held.verdict == claims.HELD
    result = held.comparisons[0]
    np.testing.assert_allclose(result.lower, [1.1, 1.0, 0.9, 1.1, 0.9])
    np.testing.assert_allclose(result.higher, [2.1, 2.2, 1.95, 2.0, 2.25])
    d = np.array([1.0, 1.2, 1.05, 0.9, 1.35])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(5))
    assert result.t == pytest.approx(t)
    assert result.seeds == SEEDS5 and result.rounds == (2, 3)

    refuted = claims.evaluate(make_claim([claims.Comparison("b", "a", "flatness_distance", "last 2")]), runs)
    assert refuted.verdict == claims.NOT_HELD and refuted.comparisons[0].verdict == claims.NOT_HELD
    assert refuted.comparisons[0].reason.startswith("refuted")
    unclear = claims.evaluate(make_claim([claims.Comparison("a", "c", "flatness_distance", "last 2")]), runs)
    (r,) = unclear.comparisons
    assert unclear.verdict == claims.INCONCLUSIVE
    assert r.reason == f"no evidence at n=5, detectable difference {r.detectable_difference:.2g}"
    # every comparison must hold; one that does not makes the claim not HELD
    both = claims.evaluate(make_claim([compare, claims.Comparison("a", "c", "flatness_distance", "last 2")]), runs)
    assert both.verdict == claims.INCONCLUSIVE
    assert "HELD" in held.lines()[0] and "t=" in held.lines()[3] and "p_Holm" in held.lines()[3]
    assert "no evidence at n=5" in unclear.lines()[3]
    table = claims_table.markdown_table([held, refuted])
    assert "**HELD**" in table and "**NOT HELD**" in table and "p_sign-flip" in table


def test_refutation_is_holm_corrected(tmp_path):
    # a single opposite comparison with p between level / 2 and level is refuted alone, not as one of two
    runs = groups(tmp_path, {"a": [[1.0]] * 5, "b": [[0.95], [0.7], [0.95], [0.6], [0.9]],
                             "c": [[2.0], [2.1], [2.2], [2.0], [2.3]]})
    opposite = claims.Comparison("a", "b", "flatness_distance", "last")
    alone = claims.evaluate(make_claim([opposite]), runs)
    p = alone.comparisons[0].p_opposite
    assert 0.025 < p < 0.05, p
    assert alone.verdict == claims.NOT_HELD
    paired = claims.evaluate(make_claim([claims.Comparison("a", "c", "flatness_distance", "last"), opposite]), runs)
    assert paired.verdict == claims.INCONCLUSIVE
    assert paired.comparisons[1].p_holm_opposite == pytest.approx(2 * p) and paired.comparisons[1].family == 2


def test_holm_runs_over_every_claim_of_a_call(tmp_path):
    from scipy import stats

    # two claims, each HELD alone (p_t about 0.03 and 0.04, every seed higher), not both under Holm's step
    runs = groups(tmp_path, {"a": [[1.0]] * 5, "b": [[1.05], [1.3], [1.05], [1.4], [1.1]],
                             "c": [[1.1], [1.3], [1.05], [1.45], [1.05]]})
    first = claims.evaluate(make_claim([claims.Comparison("a", "b", "flatness_distance", "last")], name="one"), runs)
    second = claims.evaluate(make_claim([claims.Comparison("a", "c", "flatness_distance", "last")], name="two"), runs)
    assert first.verdict == second.verdict == claims.HELD
    p = [stats.ttest_rel([h[0] for h in rows], [1.0] * 5, alternative="greater").pvalue
         for rows in ([[1.05], [1.3], [1.05], [1.4], [1.1]], [[1.1], [1.3], [1.05], [1.45], [1.05]])]
    assert 0.025 < min(p) and max(p) < 0.05, p
    together = claims.decide([first, second])
    by_hand = [max(2 * min(p), max(p)) if q == max(p) else 2 * min(p) for q in p]
    for result, expected in zip(together, by_hand):
        (r,) = result.comparisons
        assert r.p_holm == pytest.approx(expected, rel=1e-10) and r.family == 2
        assert result.verdict == claims.INCONCLUSIVE and r.reason.startswith("no evidence at n=5, detectable")
        assert "t-test alone" not in r.reason
    # the raw p-values are those of the claims alone
    assert [r.comparisons[0].p for r in together] == [first.comparisons[0].p, second.comparisons[0].p]
    record = together[0].to_dict()["comparisons"][0]
    assert record["p_holm"] == together[0].comparisons[0].p_holm and record["holm_family"] == 2


def test_few_seeds_cannot_reach_the_sign_flip_level(tmp_path):
    # three seeds, far apart: the t-test is sure (p ~ 1e-4) but the sign-flip p is at least 1/8
    runs = groups(tmp_path, {"a": [[1.0], [1.1], [0.9]], "b": [[5.0], [5.2], [4.9]]})
    result = claims.evaluate(make_claim([claims.Comparison("a", "b", "flatness_distance", "last")],
                                        seeds=(0, 1, 2)), runs)
    (r,) = result.comparisons
    assert r.p < 1e-3 and r.p_signflip == 1 / 8 and result.verdict == claims.INCONCLUSIVE
    assert "cannot reach p < 0.05 with 3 seeds" in r.reason and "0.125" in r.reason


def test_one_seed_and_non_finite_values_are_untested(tmp_path):
    runs = groups(tmp_path, {"a": [[1.0]], "b": [[2.0]]})
    result = claims.evaluate(make_claim([claims.Comparison("a", "b", "flatness_distance", "last")]), runs)
    assert result.verdict == claims.INCONCLUSIVE and result.comparisons[0].t is None and result.notes
    assert result.comparisons[0].family == 0 and "n=1" in result.comparisons[0].reason
    runs = groups(tmp_path, {"a": [[1.0], [1.0], [math.nan]], "b": [[2.0], [2.0], [2.0]]})
    result = claims.evaluate(make_claim([claims.Comparison("a", "b", "flatness_distance", "last")]), runs)
    (r,) = result.comparisons
    assert r.t is None and r.p_holm is None and "seed 2 of a is nan" in r.reason
    assert result.verdict == claims.INCONCLUSIVE and "seed 2 of a is nan" in result.lines()[3]


@pytest.mark.parametrize("body, message", [
    ("", "at least one"),
    ('[[compare]]\nlower = "a"\nhigher = "a"\nquantity = "q"\nrounds = "last"\n', "same run id"),
    ('[[compare]]\nlower = "a"\nhigher = "b"\nrounds = "last"\n', "no quantity"),
    ('[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\n', "no rounds"),
    ('[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "first"\n', "rounds must be"),
    ('[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last 0"\n', "rounds must be"),
    ('seeds = [0, 0]\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n', "distinct"),
    ('level = 0.7\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n', "below 0.5"),
    ('seeds = ' + str(list(range(41))) + '\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\n'
     'rounds = "last"\n', "at most 40 seeds"),
    ('tau = -1\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n', "positive"),
    ('colour = 1\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n',
     "c.toml: unknown claim key 'colour'; allowed top-level: claim, figure, source, hypothesis, seeds, quantity, rounds, level, "
     "tau, compare"),
    ('[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\nbigger = "c"\n',
     r"unknown claim key 'compare\[0\].bigger'; allowed in \[compare\[0\]\]: lower, higher, quantity, rounds, tau"),
    ('[[compare]]\nlower = 3\nhigher = "b"\nquantity = "q"\nrounds = "last"\n', r"compare\[0\].lower must be a string"),
    ('[[compare]]\nhigher = "b"\nquantity = "q"\nrounds = "last"\n', r"compare\[0\].lower is required"),
    ('level = "0.05"\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n',
     "level must be a number"),
    ('seeds = [0, -1]\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n',
     r"seeds\[1\] must be >= 0 \(got -1\)"),
    ('hypothesis = "yes"\n[[compare]]\nlower = "a"\nhigher = "b"\nquantity = "q"\nrounds = "last"\n',
     "hypothesis must be"),
])
def test_bad_claim_files_get_one_line(tmp_path, body, message):
    with pytest.raises(LandscapeError, match=message) as error:
        claims.load_claim(claim_file(tmp_path, body))
    assert "\n" not in str(error.value)


def test_a_missing_figure_is_named(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('claim = "x"\nfigure = "nowhere.toml"\n[[compare]]\nlower = "a"\nhigher = "b"\n'
                    'quantity = "q"\nrounds = "last"\n')
    with pytest.raises(LandscapeError, match="nowhere.toml not found"):
        claims.load_claim(path)


def test_shipped_claims_name_runs_and_quantities_their_figures_have():
    from landscape.figures.recipe import figure as figure_recipe

    files = sorted((ROOT / "claims").glob("*.toml"))
    assert len(files) >= 7
    for path in files:
        claim = claims.load_claim(path)
        figure = figure_recipe.load_figure_recipe(claim.figure)
        claims.check_run_ids(claim, [spec.id for spec in figure.runs])
        assert len(claim.seeds) >= 3, path
        for comparison in claim.comparisons:
            output = claims.analysis_output(comparison.quantity)
            if output is not None:  # an analysis quantity: the figure analyses its pass
                assert output in figure.pass_rounds, (path, comparison.quantity)
    with pytest.raises(LandscapeError, match="not in"):
        claims.check_run_ids(claims.load_claim(files[0]), ["x"])


TINY_FIGURE = """
name = "tiny-claim"
[[runs]]
id = "avg"
label = "FedAvg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "sam"
label = "FedSAM"
set = { "algorithm.name" = "fedsam" }
[[runs]]
id = "unused"
label = "FedProx"
set = { "algorithm.name" = "fedprox" }
[analyze]
analysis_samples = 64
[analyze.hessian]
top_k = 1
trace_hvps = 6
density_runs = 1
density_steps = 4
clients = -1
[analyze.sharpness]
steps = 1
[[plots]]
kind = "hessian"
[[plots]]
kind = "flatness-sharpness"
[digits.train.set]
"partition.clients" = 4
"train.rounds" = 3
"train.local_steps" = 2
"train.batch_size" = 16
"train.checkpoint_every" = 1
"model.name" = "mlp"
"model.hidden" = [16]
"""

TINY_CLAIM = """
claim = "FedSAM lowers the flatness distance and lambda_max against FedAvg"
figure = "fig.toml"
seeds = [0, 1]
[[compare]]
lower = "sam"
higher = "avg"
quantity = "flatness_distance"
rounds = "last 2"
[[compare]]
lower = "sam"
higher = "avg"
quantity = "lambda_max"
rounds = "last"
"""


def test_landscape_claims_trains_analyses_and_tests(tmp_path):
    import json

    from click.testing import CliRunner

    from landscape.cli import cli

    (tmp_path / "fig.toml").write_text(TINY_FIGURE)
    (tmp_path / "c.toml").write_text(TINY_CLAIM)
    args = ["claims", str(tmp_path / "c.toml"), "-o", str(tmp_path / "out"), "--figures-out", str(tmp_path / "figs"),
            "--device", "cpu", "--quiet"]
    dry = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "seeds 0,1: sam, avg" in dry.output and not (tmp_path / "figs").exists()
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    runs = tmp_path / "figs" / "tiny-claim" / "runs"
    # only the runs the claim compares are trained, one per seed
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) == ["avg-seed0", "avg-seed1", "sam-seed0", "sam-seed1"]
    # only the passes it reads: the figure's sharpness pass is not run
    assert not list(runs.glob("*/analysis/round-*/sharpness*.json")) and list(runs.glob("*/analysis/*/hessian*"))
    (record,) = json.loads((tmp_path / "out" / "claims.json").read_text())
    distance, top = record["comparisons"]
    for key, run_id in (("lower_values", "sam"), ("higher_values", "avg")):
        for seed, value in zip((0, 1), distance[key]):  # the mean of the last two logged rounds, read here
            rows = [json.loads(line) for line in (runs / f"{run_id}-seed{seed}" / "metrics.jsonl").read_text().splitlines()]
            logged = [row["flatness_distance"] for row in rows if "flatness_distance" in row]
            assert value == pytest.approx(np.mean(logged[-2:]), rel=1e-12)
        for seed, value in zip((0, 1), top[key]):  # lambda_1 of the round-3 hessian result
            (path,) = (runs / f"{run_id}-seed{seed}" / "analysis" / "round-0003").glob("hessian*.json")
            assert value == pytest.approx(json.loads(path.read_text())["result"]["top"]["values"][0], rel=1e-12)
    # two seeds: the sign-flip test cannot reach 0.05 (its smallest p is 1/4), so nothing can hold
    assert record["verdict"] == claims.INCONCLUSIVE and record["verdict"] in result.output and "t=" in result.output
    assert "Holm's step over the 2 tested comparison(s)" in result.output and "cannot reach" in result.output
    for row in (distance, top):
        assert row["holm_family"] == 2 and row["n"] == 2 and row["p_signflip"] in (0.25, 0.5, 0.75, 1.0)
        assert {"p_holm", "p_holm_opposite", "p_signflip_opposite", "ci95", "detectable_difference",
                "mean_difference"} <= set(row) and row["reason"].startswith("no evidence at n=2, detectable")
    table = (tmp_path / "out" / "claims.md").read_text()
    assert "| FedSAM lowers" in table and "p_Holm" in table and "p_sign-flip" in table
    assert "tested as: flatness_distance (raw) mean over rounds 2-3; lambda_max (raw) at round 3" in result.output

    # --compare-with: the same runs again (reused), against the first call's verdicts, then against a record
    # whose claim verdict differs
    again = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "out2"), "--compare-with", str(tmp_path / "out")])
    assert again.exit_code == 0 and "0 FRAGILE (against" in again.output, again.output
    assert "in the other results" not in again.output
    changed = json.loads((tmp_path / "out" / "claims.json").read_text())
    changed[0]["verdict"] = claims.HELD
    (tmp_path / "out" / "claims.json").write_text(json.dumps(changed))
    fragile = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "out3"), "--compare-with", str(tmp_path / "out")])
    assert fragile.exit_code == 0 and "INCONCLUSIVE FRAGILE (HELD in the other results)" in fragile.output
    assert "1 FRAGILE" in fragile.output and "FRAGILE (HELD" in (tmp_path / "out3" / "claims.md").read_text()
    missing = CliRunner().invoke(cli, [*args, "--compare-with", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "--compare-with" in missing.output and "Traceback" not in missing.output

    (tmp_path / "bad.toml").write_text(TINY_CLAIM.replace('lower = "sam"', 'lower = "nobody"', 1))
    bad = CliRunner().invoke(cli, ["claims", str(tmp_path / "bad.toml"), "--figures-out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "nobody" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "x").exists()


def test_claims_read_set_as_figures_does(tmp_path):
    from landscape.workflows.claims import plan_claims

    (tmp_path / "fig.toml").write_text(TINY_FIGURE)
    (tmp_path / "c.toml").write_text(TINY_CLAIM)

    def planned(*assignments: str):
        (work,) = plan_claims([tmp_path / "c.toml"], figures_out=tmp_path / "figs", assignments=assignments)
        return work.fig

    fig = planned("train.rounds=4", "analyze.analysis_samples=32", "hessian.top_k=2", "hessian.rounds=all")
    assert fig.forced == {"train.rounds": 4} and fig.settings["analysis_samples"] == 32
    assert fig.pass_options["hessian"]["top_k"] == 2 and fig.pass_rounds == {"hessian": Rounds(ALL)}
    for assignment, message in (("surface.grid=3", "--set surface.grid: this figure runs no surface pass"),
                                ("analyze.colour=1", "--set analyze.colour: unknown analysis setting 'analyze.colour'"),
                                ("analyze.split=3", "--set analyze.split: analyze.split must be one of train, test (got 3)"),
                                ("train.lrr=1", "unknown recipe key 'train.lrr'")):
        with pytest.raises(LandscapeError, match=re.escape(message)) as e:
            planned(assignment)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "figs").exists()  # nothing was trained
