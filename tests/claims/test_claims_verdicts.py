"""What a referee reads in the claims table (landscape.claims.table): both directions, the detectable
difference at the Holm step applied, this project's hypotheses apart, each claim's operationalisation, the
FRAGILE mark, and the SWA snapshot rule and adaptive S_rho of the claims workflow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from landscape.claims import checks as claims
from landscape.claims import table as claims_table
from landscape.core.errors import LandscapeError
from landscape.figures.rundata import RunData
from landscape.store.run import Run

ROOT = Path(__file__).resolve().parents[2]
SEEDS = tuple(range(8))
PARTITION = '[partition]\nname = "dirichlet-client-reuse"\nclients = 20\nalpha = 0.1\n'


def fake_run(path: Path, seed: int, rows: dict[str, list[float]], partition: str = PARTITION) -> RunData:
    """A run that logged each key of ``rows`` at rounds 1..len(values), with ``partition`` in its recipe."""
    folder = path / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.toml").write_text(f'seed = {seed}\n\n{partition}\n[algorithm]\nname = "fedsam"\n')
    rounds = len(next(iter(rows.values())))
    (folder / "metrics.jsonl").write_text("".join(  # with the key that marks a row of today's runs
        json.dumps({"round": r + 1, "flatness_distance_to_global": 0.0, **{key: values[r] for key, values in rows.items()}})
        + "\n" for r in range(rounds)))
    return RunData(Run(folder))


def runs_of(tmp_path: Path, values: dict[str, list[float]], key: str = "flatness_distance") -> dict:
    return {run_id: [fake_run(tmp_path / run_id, s, {key: [v]}) for s, v in enumerate(per_seed)]
            for run_id, per_seed in values.items()}


def make_claim(comparisons, name="c", hypothesis=False, seeds=SEEDS) -> claims.Claim:
    return claims.Claim(Path(f"{name}.toml"), name, f"text {name}", "", Path("fig.toml"), seeds, tuple(comparisons),
                        0.05, hypothesis)


def compare(lower: str, higher: str, quantity: str = "flatness_distance", rounds="last") -> claims.Comparison:
    return claims.Comparison(lower, higher, quantity, rounds)


# a: the reference; b clearly higher, c slightly higher, g clearly LOWER (the claim "g < a" is refuted)
VALUES = {"a": [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98],
          "b": [2.0, 2.3, 1.8, 2.1, 2.05, 1.9, 2.2, 2.0],
          "c": [1.1, 1.08, 1.2, 1.0, 1.15, 0.97, 1.3, 1.05],
          "g": [3.0, 4.5, 2.2, 3.9, 2.6, 5.1, 3.3, 2.8]}


def test_holm_steps_are_the_ranks_of_the_p_values():
    assert claims.holm_steps([0.01, 0.04, 0.03, 0.005]) == [2, 4, 3, 1]
    assert claims.holm_steps([0.2, 0.2, 0.1]) == [2, 3, 1]  # ties in input order, as holm sorts them
    assert claims.holm_steps([]) == []


def test_detectable_difference_is_at_the_level_of_the_holm_step(tmp_path):
    from scipy import stats
    from scipy.optimize import brentq

    runs = runs_of(tmp_path, VALUES)
    result = claims.evaluate(make_claim([compare("a", "b"), compare("a", "c"), compare("g", "a")]), runs)
    steps = {r.comparison.higher + r.comparison.lower: r for r in result.comparisons}
    p = [r.p for r in result.comparisons]
    for r in result.comparisons:
        k = 1 + sum(q < r.p for q in p)  # the rank of its p: the step Holm's procedure tests it at
        assert r.holm_step == k and r.family == 3 and r.holm_level == pytest.approx(0.05 / (3 - k + 1), rel=1e-15)
        d = np.subtract(r.higher, r.lower)
        sd, n = d.std(ddof=1), d.size
        critical = stats.t.isf(r.holm_level, n - 1)
        # solved independently for delta itself: the power of the one-sided t-test at the step's level is 0.8
        delta = brentq(lambda x: stats.nct.sf(critical, n - 1, x * math.sqrt(n) / sd) - 0.8, 1e-9 * sd, 50 * sd,
                       xtol=1e-14)
        assert r.detectable_difference == pytest.approx(delta, rel=1e-9)
        # and by simulation: 200,000 t-tests of normal differences with that mean and sd reject 80% of the time
        rng = np.random.default_rng(k)
        sample = rng.normal(delta, sd, (200_000, n))
        t = sample.mean(axis=1) / (sample.std(axis=1, ddof=1) / math.sqrt(n))
        assert np.mean(t > critical) == pytest.approx(0.8, abs=0.004)
    # the strictest step (k = 1, level 0.05 / 3) needs a larger difference than the plain level would
    first = min(result.comparisons, key=lambda r: r.holm_step)
    assert first.holm_step == 1 and first.detectable_difference > claims.detectable_difference(first.sd, 8, 0.05)
    assert steps["ba"].holm_step == 1


def test_the_opposite_direction_is_printed_and_refutes(tmp_path):
    runs = runs_of(tmp_path, VALUES)
    refuted, weak = claims.decide([claims.evaluate(make_claim([compare("g", "a")], name="refuted"), runs),
                                   claims.evaluate(make_claim([compare("c", "a"), compare("a", "b")], name="weak"),
                                                   runs)])
    (r,) = refuted.comparisons
    assert r.p_opposite < 0.01 and r.p_signflip_opposite == 1 / 256 and r.p_holm_opposite < 0.05
    assert r.verdict == refuted.verdict == claims.NOT_HELD and r.reason.startswith("refuted")
    # "c < a" goes the other way a little: INCONCLUSIVE, its reason names the opposite direction's p-values
    c = weak.comparisons[0]
    assert c.verdict == claims.INCONCLUSIVE and 0 < c.p_opposite < 0.05 < c.p_holm_opposite
    assert f"the opposite direction has p_t {claims._p(c.p_opposite)}" in c.reason
    table = claims_table.markdown_table([refuted, weak])
    header, rule, row = table.splitlines()[2:5]
    assert "opposite p_t | opposite p_sign-flip | opposite p_Holm" in header
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == len(claims_table.COLUMNS) == rule.count("---")
    assert cells[11:14] == [claims._p(r.p_opposite), claims._p(r.p_signflip_opposite), claims._p(r.p_holm_opposite)]
    assert cells[1] == "**NOT HELD**" and cells[2].endswith("g < a: NOT HELD")
    assert "opposite p_t=" in refuted.lines()[3]


def test_hypotheses_have_their_own_section_and_share_the_holm_family(tmp_path):
    runs = runs_of(tmp_path, VALUES)
    published = claims.evaluate(make_claim([compare("a", "b")], name="published"), runs)
    mine = claims.evaluate(make_claim([compare("a", "c")], name="mine", hypothesis=True), runs)
    decided = claims.decide([mine, published])
    table = claims_table.markdown_table(decided)
    assert table.index("**Published claims**") < table.index("`published`") < table.index(
        "**This project's hypotheses**") < table.index("`mine`")
    assert all(r.family == 2 for result in decided for r in result.comparisons)
    assert "(this project's hypothesis)" in decided[0].lines()[0] and decided[0].to_dict()["hypothesis"] is True
    only = claims_table.markdown_table([decided[1]])
    assert "**Published claims**" in only and "hypotheses" not in only


def test_each_claim_states_its_operationalisation(tmp_path):
    rows = {"flatness_distance": [0.5, 0.4, 0.3], "flatness_distance_relative": [0.9, 0.8, 0.7]}
    other = '[partition]\nname = "dirichlet-client-reuse"\nclients = 20\nalpha = 0.6\n'
    runs = {"a": [fake_run(tmp_path / "a", s, rows) for s in SEEDS],
            "b": [fake_run(tmp_path / "b", s, rows) for s in SEEDS],
            "w": [fake_run(tmp_path / "w", s, rows, other) for s in SEEDS],
            "x": [fake_run(tmp_path / "x", s, rows, "") for s in SEEDS]}
    both = claims.evaluate(make_claim([compare("a", "b", rounds="last 2"),
                                       compare("a", "b", "flatness_distance_relative", "last 2"),
                                       compare("a", "b", "flatness_distance", (1, 3))]), runs)
    assert both.operationalisation() == (
        "flatness_distance (raw) and flatness_distance_relative (relative) mean over rounds 2-3; flatness_distance "
        "(raw) mean over rounds 1, 3; partition dirichlet-client-reuse, alpha 0.1")
    mixed = claims.evaluate(make_claim([compare("w", "a", rounds="last"), compare("x", "a", rounds="last")]), runs)
    assert mixed.operationalisation() == (
        "flatness_distance (raw) at round 3; partitions w: dirichlet-client-reuse, alpha 0.6, a: "
        "dirichlet-client-reuse, alpha 0.1, x: not recorded")
    table = claims_table.markdown_table([both])
    assert f"- `c`: {both.operationalisation()}" in table
    assert both.lines()[1] == f"  tested as: {both.operationalisation()}"
    assert both.to_dict()["comparisons"][1]["scale"] == "relative"
    for quantity, scale in (("adaptive S_rho(0.05)", "relative"), ("S_rho(0.05)", "raw"), ("Delta_D", "raw"),
                            ("lambda_1/lambda_k", "relative"), ("lambda_max", "raw")):
        assert claims.scale_of(quantity) == scale, quantity


def test_fragile_marks_the_verdicts_that_differ_in_the_other_results(tmp_path):
    runs = runs_of(tmp_path / "runs", VALUES)
    decided = claims.decide([claims.evaluate(make_claim([compare("a", "b"), compare("a", "c")], name="one"), runs),
                             claims.evaluate(make_claim([compare("g", "a")], name="two"), runs)])
    assert [r.verdict for r in decided[0].comparisons] == [claims.HELD, claims.INCONCLUSIVE]
    claims_table.write_results(decided, tmp_path / "other")
    same = claims_table.compare_with(decided, claims_table.read_verdicts(tmp_path / "other"))
    assert not any(r.fragile for r in same) and not any(r.fragile for x in same for r in x.comparisons)
    assert same[0].other_verdict == claims.INCONCLUSIVE
    # the other layout's record: "a < c" HELD there (and with it the claim), "g < a" missing
    record = json.loads((tmp_path / "other" / "claims.json").read_text())
    record[0]["verdict"] = record[0]["comparisons"][1]["verdict"] = claims.HELD
    record[1]["comparisons"] = []
    (tmp_path / "other" / "claims.json").write_text(json.dumps(record))
    marked = claims_table.compare_with(decided, claims_table.read_verdicts(tmp_path / "other"))
    assert [r.fragile for r in marked] == [True, False]
    assert [r.fragile for r in marked[0].comparisons] == [False, True]
    assert marked[1].comparisons[0].other_verdict is None and not marked[1].comparisons[0].fragile
    table = claims_table.markdown_table(marked, "runs/claims-other")
    assert "**INCONCLUSIVE** FRAGILE (HELD in the other results)" in table
    assert "a < c: INCONCLUSIVE FRAGILE (HELD in the other results)" in table
    assert "`runs/claims-other`" in table and "1 of 2 claims, 1 of 3 comparisons; 1 comparison(s) are not in it" in table
    assert "FRAGILE" in marked[0].lines()[0] and marked[0].to_dict()["fragile"] is True
    with pytest.raises(LandscapeError, match="claims.json not found") as e:
        claims_table.read_verdicts(tmp_path / "nowhere")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "claims.json").write_text('[{"verdict": "HELD"}]')
    with pytest.raises(LandscapeError, match="not a claims.json") as e:
        claims_table.read_verdicts(tmp_path / "bad")
    assert "\n" not in str(e.value)


SWA_FIGURE = """
name = "tiny-swa"
[[runs]]
id = "sam"
label = "FedSAM"
set = { "algorithm.name" = "fedsam" }
[[runs]]
id = "sam-swa"
label = "FedSAM + SWA"
set = { "algorithm.name" = "fedsam", "train.swa" = true }
[analyze.sharpness]
rhos = [0.05]
steps = 2
starts = 1
[[plots]]
kind = "flatness-sharpness"
[digits.train.set]
"partition.clients" = 4
"train.rounds" = 8
"train.swa_cycle" = 2
"train.swa_start" = 0.25
"train.local_steps" = 1
"model.name" = "mlp"
"model.hidden" = [8]
"""

SWA_CLAIM = """
claim = "SWA lowers S_rho"
figure = "fig.toml"
seeds = [0, 1]
[[compare]]
lower = "sam-swa"
higher = "sam"
quantity = "adaptive S_rho(0.05)"
rounds = "last"
"""


def test_an_swa_comparison_needs_five_snapshots(tmp_path, tiny):
    from landscape.train import loop
    from landscape.workflows.claims import MIN_SWA_SNAPSHOTS, plan_claims, swa_snapshots

    # the rounds averaged, against the number of models the training loop logs (swa_models) every round
    recipe = tiny(train__rounds=9, train__swa=True, train__swa_start=0.3, train__swa_cycle=2, train__local_steps=1,
                  model__name="mlp", model__hidden=[8], partition__clients=4)
    loop.start_run(recipe, tmp_path / "swa", progress=False)
    logged = {row["round"]: row["swa_models"] for row in Run(tmp_path / "swa").metrics() if "swa_models" in row}
    train = Run(tmp_path / "swa").recipe.train
    assert len(logged) == 9 and logged == {r: len(swa_snapshots(train, r)) for r in range(1, 10)}
    assert swa_snapshots(train, 9) == [4, 6, 8]  # from round int(0.3 * 9) = 2 (0-based), every 2nd round
    (tmp_path / "fig.toml").write_text(SWA_FIGURE)
    (tmp_path / "c.toml").write_text(SWA_CLAIM)
    # 8 rounds from round 2 with cycle 2: rounds 4, 6, 8 -> 3 snapshots, refused before anything trains
    with pytest.raises(LandscapeError, match=f"averages 3 SWA snapshot.s. at round 8 .rounds 4, 6, 8.*at least "
                                             f"{MIN_SWA_SNAPSHOTS}") as e:
        plan_claims([tmp_path / "c.toml"], figures_out=tmp_path / "figs")
    assert "\n" not in str(e.value) and not (tmp_path / "figs").exists()
    # 12 rounds: rounds 4, 6, 8, 10, 12 -> 5 snapshots, accepted
    plan_claims([tmp_path / "c.toml"], figures_out=tmp_path / "figs", assignments=["train.rounds=12"])
    (tmp_path / "fig.toml").write_text(SWA_FIGURE.replace("starts = 1", "starts = 1\nadaptive = false"))
    with pytest.raises(LandscapeError, match="adaptive S_rho needs the sharpness pass's adaptive = true"):
        plan_claims([tmp_path / "c.toml"], figures_out=tmp_path / "figs", assignments=["train.rounds=12"])


class _Result:
    def __init__(self, result: dict) -> None:
        self.result = result

    def value(self, key: str, default=None):
        node = self.result
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def array(self, key: str) -> np.ndarray:
        return np.asarray(self.value(key), dtype=float)


def test_adaptive_sharpness_reads_the_adaptive_profile():
    from landscape.claims.files import _QUANTITIES

    assert claims.analysis_output("adaptive S_rho(0.05)") == "sharpness"
    quantity = _QUANTITIES["adaptive S_rho(0.05)"]
    both = _Result({"global": {"rhos": [0.01, 0.05], "sharpness": [1.0, 2.0]},
                    "adaptive": {"rhos": [0.01, 0.05], "sharpness": [3.0, 4.0]}})
    assert quantity.read(both) == (4.0, None) and _QUANTITIES["S_rho(0.05)"].read(both)[0] == 2.0
    assert quantity.read(_Result({"global": {"rhos": [0.05], "sharpness": [2.0]}})) == (None, None)
    with pytest.raises(LandscapeError, match="bad radius"):
        claims.analysis_output("adaptive S_rho(x)")


def test_shipped_claims_are_operationalised_as_the_issue_asks(tmp_path):
    from landscape.workflows.claims import MIN_SWA_SNAPSHOTS, plan_claims, swa_snapshots
    from landscape.workflows.figure import figure_plan

    files = sorted((ROOT / "claims").glob("*.toml"))
    work = plan_claims(files, figures_out=tmp_path / "figs")  # every check before training, SWA snapshots too
    by_name = {w.claim.name: w for w in work}
    assert all(len(w.claim.seeds) >= 12 for w in work)
    assert [name for name, w in by_name.items() if w.claim.hypothesis] == ["global-guidance-lowers-distance"]
    for name in ("fednsam-lowers-distance-and-sharpness", "global-guidance-lowers-distance"):  # "brings together"
        quantities = {c.quantity for c in by_name[name].claim.comparisons}
        assert {"flatness_distance", "flatness_distance_relative"} <= quantities, name
    assert "adaptive S_rho(0.05)" in {c.quantity for c in by_name["fednsam-lowers-distance-and-sharpness"].claim.comparisons}
    for w in work:  # the reference codes' partition for every run; every SWA run averages at least 5 models
        for entries in figure_plan(w.fig, w.out, "cpu").values():
            for _, recipe, _ in entries:
                assert recipe.partition.name == "dirichlet-client-reuse", w.claim.name
                if recipe.train.swa:
                    assert len(swa_snapshots(recipe.train, recipe.train.rounds)) >= MIN_SWA_SNAPSHOTS
