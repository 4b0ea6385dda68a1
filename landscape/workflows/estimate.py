"""What a figure or a claim would cost, before any of it is done (their dry-runs): the runs to train and the
analysis jobs to compute (never those already done with the same settings), each priced with rates measured on
this machine.

The rates (``Rates``) are measured once per kind of run (its data set, model, algorithm and partition and how its
steps are computed: ``rate_key``) by training a throwaway copy in a temporary folder: one client per round, rounds of one local step and rounds of three
(the mean of two after a warm-up; the per-step cost is the slope, the rest of a client's round its intercept), a
test evaluation, and one full-data gradient and one Hessian-vector product at the analysis settings on its
checkpoint (``analyze.plan.time_products``, as ``landscape analyze --dry-run`` times them), the last two on
``TIMED_SAMPLES`` samples and scaled to all. A run's training is then rounds x clients per round x (mean local
steps x step + client) + evaluations x evaluation, and a job's analysis its pass's cost model (``PassSpec.cost``)
in products and gradients. Rough: a factor of 2 either way. Nothing measured here is stored anywhere: no recorded
number depends on a clock.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds

# The training settings a run's rates depend on (how and where its steps are computed); the others (its length,
# learning rates, SWA, what is logged or kept) change what is computed, not how long a step takes.
_RATE_KEYS = ("batch_size", "device", "dtype", "compile", "precision", "threads", "vectorize", "memory_format")


@dataclass(frozen=True)
class Rates:
    """Seconds measured on this machine for one kind of run: one local step of one client (``step``), the rest of a
    client's round (``client``: its start and upload, and its share of the server's sampling, aggregation and
    distances), one test-set evaluation; one full-data gradient and one Hessian-vector product at the analysis
    settings; and its clients' sizes (their local steps)."""

    step: float
    client: float
    evaluation: float
    gradient: float
    product: float
    sizes: tuple[int, ...]  # the training samples of each client

    def training(self, train: Any, rounds: int, evaluations: int) -> float:
        """Seconds of ``rounds`` rounds and ``evaluations`` test evaluations with the settings ``train``."""
        from landscape.train.schedule import clients_per_round

        per_round = clients_per_round(train, len(self.sizes))
        return rounds * per_round * (local_steps(train, self.sizes) * self.step + self.client) \
            + evaluations * self.evaluation

    def analysis(self, cost: Any) -> float:
        return cost.hvps * self.product + cost.gradients * self.gradient


def rate_key(recipe: Any, settings: Any) -> str:
    """What the rates of a run depend on: its data set, model, algorithm and partition, how its steps are computed
    (``_RATE_KEYS``), and the analysis settings; not its seed, length or step sizes."""
    table = recipe.to_dict()
    dataset = {k: v for k, v in table["dataset"].items() if k not in ("root", "download")}
    train = {k: table["train"][k] for k in _RATE_KEYS}
    return json.dumps([dataset, table["model"], recipe.algorithm.name, table["partition"], train, settings.record()],
                      sort_keys=True, default=str)


def local_steps(train: Any, sizes: tuple[int, ...]) -> float:
    """The mean local steps of a client in a round (``Trainer._batch_indices``' count: K fixed steps, or E epochs
    of ceil(n_i / B) minibatches)."""
    if train.local_steps:
        return float(train.local_steps)
    return sum(train.local_epochs * math.ceil(n / train.batch_size) for n in sizes) / max(len(sizes), 1)


# The samples the evaluation and the analysis products are timed on; their time over more samples is scaled from it
# (both are sums over batches of fixed size: linear in the samples).
TIMED_SAMPLES = 256


def measure_rates(recipe: Any, settings: Any, setup: Any = None) -> Rates:
    """The rates of ``recipe``'s kind of run (``Rates``), measured on a throwaway copy in a temporary folder: one
    client per round, rounds of one local step and of three (the mean of two after a warm-up), a test evaluation
    and the analysis products on ``TIMED_SAMPLES`` samples, scaled to the sizes of the run's."""
    from landscape.analyze.source import Source
    from landscape.config.setup import prepare_data, using_threads
    from landscape.store.directory import RunDir
    from landscape.train.trainer import Trainer

    recipe.require_entries()
    setup = setup if setup is not None else prepare_data(recipe)
    seconds: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="landscape-estimate-") as folder:
        for steps in (1, 3):
            copy = recipe.with_values({
                "train.local_steps": steps, "train.participation": 1 / len(setup.client_indices),
                "train.rounds": 1000, "train.eval_every": 1000, "train.checkpoint_every": 1000, "train.log": [],
                "train.keep_clients": False})
            trainer = Trainer(copy, RunDir(Path(folder) / f"steps-{steps}"), setup)
            with using_threads(copy.train.threads):
                state = trainer.initial_state()
                state, _, _ = trainer.run_round(state)  # warm-up
                for _ in range(2):  # the mean of two
                    state, _, row = trainer.run_round(state)
                    seconds[steps] = seconds.get(steps, 0.0) + float(row["seconds"]) / 2
        step = (seconds[3] - seconds[1]) / 2
        overhead = seconds[1] - step
        if step <= 0 or overhead < 0:  # timing noise: all of a client's round counted as its steps' work
            step, overhead = seconds[3] / 3, 0.0
        n = len(trainer.test_y)
        m = min(n, TIMED_SAMPLES)
        with using_threads(copy.train.threads):
            evaluation = _timed(lambda: trainer.flat.evaluate(state.model, state.buffers, trainer.test_x[:m],
                                                              trainer.test_y[:m])) * n / m
        trainer.run_dir.path.joinpath("checkpoints").mkdir(parents=True)
        trainer.save(state, None)
        source = Source("estimate", copy, {state.round: trainer.run_dir.checkpoint(state.round)},
                        Path(folder) / "analysis", None)
        source._setup = setup
        gradient, product = products_at(source, state.round, settings)
    return Rates(step, overhead, evaluation, gradient, product, tuple(len(ix) for ix in setup.client_indices))


def products_at(source: Any, round: int, settings: Any) -> tuple[float, float]:
    """Seconds of one full-data gradient and one Hessian-vector product at a checkpoint under ``settings``, timed
    (``analyze.plan.time_products``) on ``TIMED_SAMPLES`` of its analysis samples and scaled to all of them."""
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.plan import time_products
    from landscape.config.setup import using_threads

    n = len(source.analysis_set(settings.split)[1])
    if settings.analysis_samples:
        n = min(n, settings.analysis_samples)
    m = min(n, TIMED_SAMPLES)
    with using_threads(settings.threads):
        gradient, product = time_products(CheckpointContext(source, round, replace(settings, analysis_samples=m)))
    return gradient * n / m, product * n / m


def _timed(work: Any, repeats: int = 2) -> float:
    """Mean seconds of ``repeats`` calls of ``work()`` (after one call to warm it up)."""
    work()
    started = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - started) / repeats


def duration(value: float) -> str:
    """A duration in words: 3.2 ms, 14 s, 2.5 min, 1.3 h; NaN (not measured) "unknown"."""
    for unit, size, limit in (("ms", 1e-3, 1), ("s", 1, 120), ("min", 60, 7200), ("h", 3600, math.inf)):
        if value < limit:
            value /= size
            return f"{value:.2g} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return "unknown"


def about(seconds: float) -> str:
    """An estimate in words: "about 14 s", or "time unknown" where the rates could not be measured."""
    return "time unknown" if math.isnan(seconds) else f"about {duration(seconds)}"


def _known(values: Any) -> float:
    """The sum of the durations that were measured (NaN: not)."""
    return sum(v for v in values if not math.isnan(v))


def _priced(values: Any) -> str:
    """Durations summed in words: "about 3 min", "about 3 min for those priced" where some could not be measured,
    "time unknown" where none could."""
    values = list(values)
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "time unknown"
    return f"about {duration(sum(known))}" + (" for those priced" if len(known) < len(values) else "")


def _spread(values: list[float]) -> str:
    """Measured durations in words: one, or the least and the most."""
    low, high = min(values), max(values)
    return duration(low) if duration(low) == duration(high) else f"{duration(low)} to {duration(high)}"


@dataclass
class WorkEstimate:
    """The runs to train and the analysis jobs to compute of one or more dry-runs, each counted once (a run
    directory two claims share trains once, a job two figures share computes once), priced by the rates of its
    kind of run, each measured once: on a throwaway copy for a run still to train (``measure_rates``), at the
    first checkpoint to analyse for a run that exists (``analyze.plan.time_products``)."""

    rates: dict[str, tuple[str, Rates]] = field(default_factory=dict)  # rate key -> (what, rates)
    products: dict[str, tuple[str, float, float]] = field(default_factory=dict)  # -> (what, gradient, product)
    trained: dict[Path, float] = field(default_factory=dict)  # run directory -> seconds of its training
    jobs: dict[tuple, float] = field(default_factory=dict)  # (checkpoint, pass, result name) -> seconds
    done: set[tuple] = field(default_factory=set)  # the same keys, of the jobs already done

    setups: dict[str, Any] = field(default_factory=dict)  # data set and partition -> its DataSetup
    # rate key -> (what, why its rates could not be measured)
    unmeasured: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _setup(self, recipe: Any) -> Any:
        """The data set and partition of ``recipe`` (``prepare_data``), made once for the kinds of run that share
        them (the algorithms of one figure)."""
        from landscape.config.setup import prepare_data

        table = recipe.to_dict()
        key = json.dumps([table["dataset"], table["partition"], recipe.seed, recipe.train.dtype, recipe.imports],
                         sort_keys=True, default=str)
        if key not in self.setups:
            recipe.require_entries()
            self.setups[key] = prepare_data(recipe)
        return self.setups[key]

    def rates_of(self, recipe: Any, settings: Any) -> Rates | None:
        """The rates of ``recipe``'s kind of run, measured the first time; None where they cannot be measured
        here (its data is not under the data root, its device is missing: the reason is kept for ``lines``)."""
        key = rate_key(recipe, settings)
        if key not in self.rates and key not in self.unmeasured:
            what = f"{recipe.dataset.name} {recipe.model.name} {recipe.algorithm.name}"
            try:
                self.rates[key] = (what, measure_rates(recipe, settings, self._setup(recipe)))
            except LandscapeError as e:
                self.unmeasured[key] = (what, str(e))
        return self.rates[key][1] if key in self.rates else None

    def training(self, recipe: Any, path: Path, status: str, settings: Any) -> float:
        """Seconds to bring run directory ``path`` to ``recipe`` (``status``: ``lifecycle.owned_run_status``):
        nothing when done, the rounds after its last checkpoint when resumed, every round otherwise."""
        from landscape.figures.recipe.rounds import logged_rounds
        from landscape.store.directory import RunDir

        if status == "done":
            return 0.0
        have = RunDir(path).rounds() if status == "resume" else []
        start = have[-1] if have else 0
        evaluations = sum(r > start for r in logged_rounds("test_acc", recipe.train))
        rates = self.rates_of(recipe, settings)
        seconds = math.nan if rates is None else rates.training(recipe.train, recipe.train.rounds - start, evaluations)
        self.trained[path] = seconds
        return seconds

    def analysis(self, recipe: Any | None, path: Path, status: str, name: str, spec: Rounds, options: Any,
                 settings: Any) -> tuple[int, int, float]:
        """(jobs to compute, jobs done, their seconds) of pass ``name`` at rounds ``spec`` on run directory
        ``path``. A run that exists (``status`` done, or None: a run given as it is, never trained here) has
        its jobs planned as ``landscape analyze`` plans them, each done when its result with these settings is
        on disk (``scheduler.recorded_summaries``); a run still to train has the rounds it will have
        (``figures.recipe.rounds.analysed_rounds``), none done."""
        from landscape.analyze.passes import PASSES, RESULT_NAMES
        from landscape.analyze.plan import pass_settings_record
        from landscape.figures.recipe.rounds import analysed_rounds
        from landscape.store.directory import RunDir

        if status in (None, "done"):
            return self._existing(path, name, spec, options, settings)
        rates = self.rates_of(recipe, settings)
        seconds = math.nan if rates is None else rates.analysis(PASSES.get(name).cost(options))
        rounds = analysed_rounds(name, spec, recipe.train)
        result_name = RESULT_NAMES.result_name(name, pass_settings_record(name, options, settings))
        for r in rounds:
            self.jobs[(RunDir(path).checkpoint(r), name, result_name)] = seconds
        return len(rounds), 0, seconds * len(rounds)

    def pass_line(self, runs: list[tuple[Any, Path, str | None]], name: str, spec: Rounds, options: Any,
                  settings: Any) -> str:
        """One pass at its rounds over ``runs`` ((recipe, run directory, status) each, as ``analysis`` takes
        them) in words: the jobs to compute, about how long, and how many are done already."""
        todo = done = 0
        seconds = 0.0
        for recipe, path, status in runs:
            n, d, s = self.analysis(recipe, path, status, name, spec, options, settings)
            todo, done, seconds = todo + n, done + d, seconds + s
        return (f"analyze {name} at rounds {spec}: {todo} job(s) to compute"
                + (f" ({about(seconds)})" if todo else "") + (f", {done} already done" if done else ""))

    def _existing(self, path: Path, name: str, spec: Rounds, options: Any, settings: Any) -> tuple[int, int, float]:
        from landscape.analyze.plan import plan, planned_work, skip_unavailable
        from landscape.analyze.scheduler import recorded_summaries

        jobs, _ = skip_unavailable(plan(path, spec, [name], {name: options}, settings))
        recorded, _ = recorded_summaries(jobs, settings, False)
        todo, seconds = 0, 0.0
        for job, summary in zip(jobs, recorded):
            key = (job.source.checkpoints[job.round], name, job.result_name)
            if summary is not None:
                self.done.add(key)
                continue
            measured = rate_key(job.source.recipe, settings)
            if measured not in self.products:
                self.products[measured] = (job.source.name, *products_at(job.source, job.round, settings))
            _, gradient, product = self.products[measured]
            cost = planned_work(job)
            self.jobs[key] = cost.hvps * product + cost.gradients * gradient
            todo, seconds = todo + 1, seconds + self.jobs[key]
        return todo, len(jobs) - todo, seconds

    def total(self) -> float:
        """Seconds of all the work priced (what could not be measured counts nothing: ``lines`` says so)."""
        return _known(self.trained.values()) + _known(self.jobs.values())

    def lines(self) -> list[str]:
        """The totals, and the rates they were priced with."""
        parts = [f"{len(self.trained)} run(s) to train ({_priced(self.trained.values())})" if self.trained
                 else "nothing to train",
                 f"{len(self.jobs)} analysis job(s) to compute ({_priced(self.jobs.values())})" if self.jobs
                 else "nothing to analyse"]
        done = f" ({len(self.done)} analysis job(s) already done)" if self.done else ""
        everything = [*self.trained.values(), *self.jobs.values()]
        total = f": {_priced(everything)} in all (rough: a factor of 2 either way)" if self.total() else ""
        out = [f"estimate: {', '.join(parts)}{done}{total}"]
        measured = [rates for _, rates in self.rates.values()]
        if measured:
            kinds = ", ".join(dict.fromkeys(what for what, _ in self.rates.values()))
            out.append(f"  rates measured here on {len(measured)} throwaway run(s) ({kinds}): "
                       + ", ".join(f"{what} {_spread([getattr(r, key) for r in measured])}"
                                   for what, key in (("a local step", "step"), ("the rest of a client's round", "client"),
                                                     ("a test evaluation", "evaluation"),
                                                     ("a gradient", "gradient"),
                                                     ("a Hessian-vector product", "product"))))
        reasons: dict[str, list[str]] = {}
        for what, why in self.unmeasured.values():
            reasons.setdefault(why, []).append(what)
        for why, whats in reasons.items():
            out.append(f"  not priced (rates not measurable here) {', '.join(whats)}: {why}")
        if self.products:
            whats, gradients, products = zip(*self.products.values())
            out.append(f"  rates measured here at the first checkpoint to analyse of {len(whats)} run(s) "
                       f"({', '.join(whats)}): a gradient {_spread(list(gradients))}, a Hessian-vector product "
                       f"{_spread(list(products))}")
        return out
