"""The dry-runs' estimates (landscape.workflows.estimate): the arithmetic of a run's training and a job's analysis
from measured rates, what is counted (the rounds left, never a job already done, a shared run once), and the
figures and claims dry-runs that print them."""

from __future__ import annotations

import math

import pytest
from support.helpers import invoke, tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.passes import PASSES
from landscape.analyze.registry import Cost
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.core.rounds import Rounds
from landscape.train.schedule import clients_per_round
from landscape.workflows import estimate
from landscape.workflows.estimate import Rates, WorkEstimate

SETTINGS = AnalysisSettings(device="cpu", analysis_samples=100)
HESSIAN = {"top_k": 2, "tol": 0.05, "clients": 2, "trace_hvps": 6, "density_steps": 4, "density_runs": 1}

FIGURE = """
name = "priced"
[[runs]]
id = "a"
label = "FedAvg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "b"
label = "FedSAM"
set = { "algorithm.name" = "fedsam" }
[analyze]
analysis_samples = 100
[analyze.hessian]
rounds = "last"
top_k = 2
tol = 0.05
clients = 2
trace_hvps = 6
density_steps = 4
density_runs = 1
[[plots]]
kind = "hessian"
[train]
set = { "partition.clients" = 4, "train.rounds" = 2, "train.local_steps" = 2, "model.name" = "mlp" }
"""


def test_durations_in_words():
    assert [estimate.duration(v) for v in (0.00042, 0.0123, 3.21, 45.4, 130, 900, 9000)] == [
        "0.42 ms", "12 ms", "3.2 s", "45 s", "2.2 min", "15 min", "2.5 h"]
    assert estimate.duration(math.nan) == "unknown" and estimate.about(math.nan) == "time unknown"
    assert estimate.about(61) == "about 61 s"


def test_training_and_analysis_are_priced_from_the_rates_by_hand():
    rates = Rates(step=0.01, client=0.1, evaluation=0.5, gradient=0.2, product=0.3, sizes=(10, 20, 35, 7))
    epochs = tiny_recipe(train__local_steps=0, train__local_epochs=2, train__batch_size=8,
                         train__participation=0.5).train
    assert clients_per_round(epochs, 4) == 2
    steps = 2 * (2 + 3 + 5 + 1) / 4  # E * ceil(n_i / B), over the clients
    assert estimate.local_steps(epochs, rates.sizes) == steps
    assert rates.training(epochs, 7, 3) == pytest.approx(7 * 2 * (steps * 0.01 + 0.1) + 3 * 0.5)
    fixed = tiny_recipe(train__local_steps=5).train
    assert estimate.local_steps(fixed, rates.sizes) == 5.0
    assert rates.analysis(Cost(hvps=10, gradients=2.5)) == pytest.approx(10 * 0.3 + 2.5 * 0.2)


def test_rates_are_kept_per_kind_of_run_not_per_seed_or_length():
    a = tiny_recipe()
    assert estimate.rate_key(a, SETTINGS) == estimate.rate_key(
        tiny_recipe(seed=5, train__rounds=40, train__lr=0.3, train__swa=True), SETTINGS)
    for other in (tiny_recipe(algorithm__name="fedsam"), tiny_recipe(partition__alpha=0.1),
                  tiny_recipe(train__batch_size=8)):
        assert estimate.rate_key(other, SETTINGS) != estimate.rate_key(a, SETTINGS)
    assert estimate.rate_key(a, AnalysisSettings(device="cpu")) != estimate.rate_key(a, SETTINGS)


def test_a_resumed_run_is_priced_for_its_rounds_left_and_a_done_job_never(tmp_path, six_round_copy):
    recipe = tiny_recipe(train__rounds=10, train__eval_every=3)
    work = WorkEstimate()
    rates = work.rates_of(recipe, SETTINGS)  # measured once, on a throwaway copy
    assert rates.step > 0 and rates.evaluation > 0 and rates.gradient > 0 and rates.product > 0
    assert sorted(rates.sizes) and len(rates.sizes) == recipe.partition.clients
    assert work.training(recipe, tmp_path / "absent", "new", SETTINGS) == rates.training(recipe.train, 10, 4)
    # six rounds done (checkpoints 0, 2, 4, 6): four rounds left, evaluated at 9 and 10
    assert work.training(recipe, six_round_copy, "resume", SETTINGS) == rates.training(recipe.train, 4, 2)
    assert work.training(recipe, six_round_copy, "done", SETTINGS) == 0.0
    assert len(work.rates) == 1

    options = pass_options("hessian", HESSIAN)
    run_analysis(six_round_copy, rounds="6", passes=["hessian"], settings=SETTINGS, options={"hessian": options},
                 progress=False)
    done = WorkEstimate()
    todo, finished, seconds = done.analysis(None, six_round_copy, "done", "hessian", Rounds.parse("2,6"), options,
                                            SETTINGS)
    assert (todo, finished) == (1, 1) and seconds > 0 and len(done.jobs) == 1 and len(done.done) == 1
    (_, gradient, product), = done.products.values()  # timed at the checkpoint itself: nothing trained
    assert not done.rates
    assert seconds == pytest.approx(done_cost(options, gradient, product))
    # a run still to train: every round it will have at the pass's rounds, none done
    new = WorkEstimate()
    todo, finished, seconds = new.analysis(recipe, tmp_path / "new", "new", "hessian", Rounds.parse("last 2"), options,
                                           SETTINGS)
    assert (todo, finished) == (2, 0)
    assert seconds == pytest.approx(2 * new.rates_of(recipe, SETTINGS).analysis(PASSES.get("hessian").cost(options)))


def done_cost(options, gradient, product) -> float:
    cost = PASSES.get("hessian").cost(options)
    return cost.hvps * product + cost.gradients * gradient


def test_rates_that_cannot_be_measured_are_said_not_priced(tmp_path):
    recipe = tiny_recipe(dataset__name="cifar10", dataset__root=str(tmp_path / "nothing"), model__name="lenet5")
    work = WorkEstimate()
    assert math.isnan(work.training(recipe, tmp_path / "run", "new", SETTINGS))
    lines = work.lines()
    assert lines[0] == "estimate: 1 run(s) to train (time unknown), nothing to analyse"
    assert lines[1].startswith("  not priced (rates not measurable here) cifar10 lenet5 fedavg: cifar10: missing")


def test_the_figures_dry_run_prices_what_is_missing_and_nothing_done(tmp_path):
    path = tmp_path / "fig.toml"
    path.write_text(FIGURE)
    out = tmp_path / "out"
    before = invoke("figures", path, "--out", out, "--dry-run", "--device", "cpu")
    assert before.exit_code == 0, before.output
    assert "analyze hessian at rounds last: 2 job(s) to compute (about " in before.output
    assert "run a                      new" in before.output
    assert "estimate: 2 run(s) to train (about " in before.output
    assert "rates measured here on 2 throwaway run(s) (digits mlp fedavg, digits mlp fedsam)" in before.output
    assert not out.exists()
    drawn = invoke("figures", path, "--out", out, "--device", "cpu")
    assert drawn.exit_code == 0, drawn.output
    after = invoke("figures", path, "--out", out, "--dry-run", "--device", "cpu")
    assert after.exit_code == 0, after.output
    assert "analyze hessian at rounds last: 0 job(s) to compute, 2 already done" in after.output
    assert "estimate: nothing to train, nothing to analyse (2 analysis job(s) already done)" in after.output
    assert "throwaway" not in after.output
    given = invoke("figures", path, "--runs", out / "runs" / "a", "--out", tmp_path / "given", "--dry-run",
                   "--device", "cpu")
    assert given.exit_code == 0 and "0 job(s) to compute, 1 already done" in given.output, given.output
    # drawn again over the same files: said, never silent
    again = invoke("figures", path, "--out", out, "--device", "cpu")
    assert again.exit_code == 0 and f"note: replaced 3 file(s) in {out}" in again.output, again.output
