"""The runs every figure reads: ``load_runs`` -> ``RunData``, each a view of one ``store.run.Run``.

The directory is read by the store's one read model of a run (``landscape.store.run.Run``: recipe.toml as
recorded, the metrics rows of metrics.jsonl without its event rows, and every analysis result, a
``PassRecord`` each); a ``RunData`` adds what is the figures' own: the run's label, its colour, its seed group
and which results it reads (``landscape.store.results.selection``). A run that lacks the analysis a figure needs
raises a LandscapeError that names the run and the ``landscape analyze`` command to run (``require_passes``).
Every run keeps one colour in every figure; runs that differ only in their recipe's seed are one group with one
colour and label (``landscape.figures.seeds``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from landscape.analyze.passes import RESULT_NAMES
from landscape.core.errors import LandscapeError
from landscape.figures.labels import run_labels
from landscape.figures.seeds import recipe_groups, without_seed
from landscape.store.directory import RunDir
from landscape.store.fileio import lock_holder
from landscape.store.results.selection import Chosen, Result, Selection, as_results, choose
from landscape.store.run import PassRecord, Run


@dataclass
class RunData:
    """A run as a figure reads it: a view of one ``store.run.Run`` (``run``), which holds everything read from
    the directory (``path``, ``recipe``, ``metrics`` and ``results`` are its), with what is the figures' own:
    the label, the colour index, the seed group, and the results read. ``results`` holds every analysis result
    of every round, whatever its settings; ``analyses`` (round -> output -> result) the ones read, one set of
    settings per output (sharpness, surface, surface-pca, ...) as ``selection`` chooses
    (``landscape.store.results.selection``). ``select`` chooses again."""

    run: Run
    label: str = ""
    index: int = 0  # position in the loaded list: the run's colour
    selection: Selection = field(default_factory=lambda: Selection(RESULT_NAMES))
    # runs with one group key are seeds of one configuration (landscape.figures.seeds)
    group: str | None = None
    group_label: str = ""  # the label of that configuration (without the seed)
    analyses: dict[int, dict[str, PassRecord]] = field(init=False)  # round -> output -> the result read
    chosen: dict[str, Chosen] = field(init=False)  # output -> the settings read and the rounds left out
    unwanted: dict[str, list[str]] = field(init=False)  # output -> settings it has, none of them wanted
    _keyed: dict[int, list[Result]] = field(init=False, repr=False)  # what selection reads of each result

    def __post_init__(self) -> None:
        self._keyed = as_results(self.run.records(), RESULT_NAMES)
        self.select(self.selection)

    def select(self, selection: Selection) -> RunData:
        """Read the results ``selection`` wants (see ``landscape.store.results.selection``)."""
        self.selection = selection
        self.analyses, self.chosen, self.unwanted = choose(self._keyed, selection)
        return self

    @property
    def path(self) -> Path:
        return self.run.path

    @property
    def recipe(self) -> dict:
        """recipe.toml as recorded (``Run.recipe_table``)."""
        return self.run.recipe_table()

    @property
    def metrics(self) -> list[dict]:
        """The metrics.jsonl rows without its event rows (``Run.metrics``)."""
        return self.run.metrics()

    @property
    def results(self) -> dict[int, list[PassRecord]]:
        """Round -> every analysis result there (``Run.records``)."""
        return self.run.records()

    def shown(self, output: str) -> str:
        """The settings of the ``output`` results read where they are not those asked for ('' when they
        are)."""
        chosen = self.chosen.get(output)
        return chosen.shown if chosen is not None else ""

    def notes(self, outputs: Sequence[str] | None = None) -> list[str]:
        """One line per output whose results of some analysed rounds are left out (other settings)."""
        lines = []
        for output, chosen in self.chosen.items():
            if chosen.left_out and (outputs is None or output in outputs):
                rounds = ", ".join(map(str, chosen.left_out))
                there = "; ".join(sorted({text for texts in chosen.left_out.values() for text in texts}))
                flags = self.selection.analyze_flags(chosen.pass_name)
                shown = RESULT_NAMES.settings_label(chosen.pass_name, chosen.settings)
                checkpoints = ",".join(map(str, chosen.left_out))
                lines.append(f"run {self.name}: {output} of round(s) {rounds} left out, computed there only "
                             f"with {there} (shown: {shown}); "
                             f"`landscape analyze {shlex.quote(str(self.path))} "
                             f"--checkpoints {checkpoints} --passes {chosen.pass_name}"
                             + (f" {flags}" if flags else "") + "` computes them")
        return lines

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def color(self) -> str:
        return f"C{self.index % 10}"

    def in_use(self) -> str | None:
        """None, or the words that say another process is training into the run now (its ``RunLock`` is
        held): 'run NAME is in use by another landscape process (pid N): it is still being trained'. What the
        run lacks then may only not be written yet."""
        holder = lock_holder(self.path)
        if holder is None:
            return None
        return (f"run {self.name} is in use by another landscape process{f' ({holder})' if holder else ''}: it is "
                "still being trained")

    def lacks_while_in_use(self, what: str) -> str | None:
        """None, or the words that say the run lacks ``what`` because another process is training into it now
        (``in_use``): what it lacks may only not be written yet, so the advice for a finished run is wrong."""
        busy = self.in_use()
        return f"{busy} and has no {what} yet" if busy else None

    def has_metric(self, key: str) -> bool:
        return any(row.get(key) is not None for row in self.metrics)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the metrics.jsonl rows that carry ``key`` (e.g. test_acc: eval rounds only)."""
        rows = [(row["round"], row[key]) for row in self.metrics
                if row.get(key) is not None and "round" in row]
        if not rows:
            return np.zeros(0, dtype=int), np.zeros(0)
        rounds, values = zip(*rows)
        return np.asarray(rounds, dtype=int), np.asarray(values, dtype=float)

    def analysed_rounds(self, pass_name: str) -> list[int]:
        return sorted(r for r, passes in self.analyses.items() if pass_name in passes)

    def pass_records(self, pass_name: str) -> list[PassRecord]:
        """The pass's records at every analysed round, ascending; an error naming the command when none."""
        rounds = self.analysed_rounds(pass_name)
        if not rounds:
            raise LandscapeError(missing_message(self, [pass_name]))
        return [self.analyses[r][pass_name] for r in rounds]

    def pass_record(self, pass_name: str, round: int | None = None) -> PassRecord:
        """The pass's record at ``round`` (default: the latest analysed round)."""
        rounds = self.analysed_rounds(pass_name)
        if not rounds:
            raise LandscapeError(missing_message(self, [pass_name]))
        if round is None:
            return self.analyses[rounds[-1]][pass_name]
        if round not in rounds:
            raise LandscapeError(
                f"run {self.name} has no {pass_name} analysis at round {round} (analysed rounds: "
                f"{', '.join(map(str, rounds))}); run `landscape analyze {shlex.quote(str(self.path))} "
                f"--checkpoints {round} "
                f"--passes {pass_name}`")
        return self.analyses[round][pass_name]


def missing_message(run: RunData, passes: Sequence[str]) -> str:
    """The run lacks the analysis ``passes``: the command that computes it, or (while another process trains
    into the run) that it is in use."""
    names = ", ".join(passes)
    busy = run.lacks_while_in_use(f"{names} analysis")
    if busy:
        return (f"{busy}; when it is done, run `landscape analyze "
                f"{shlex.quote(str(run.path))} --passes {','.join(passes)}`")
    flags = " ".join(dict.fromkeys(f for f in (run.selection.analyze_flags(p) for p in passes) if f))
    others = [f"{p} with {'; '.join(run.unwanted[p])}" for p in passes if p in run.unwanted]
    what = f" with {run.selection.describe()}" if run.selection.filters else ""
    return (f"run {run.name} has no {names} analysis{what}"
            + (f" (it has {', '.join(others)}: --settings KEY=VALUE picks other settings)" if others else "")
            + f"; run `landscape analyze {shlex.quote(str(run.path))} --passes {','.join(passes)}"
            + (f" {flags}" if flags else "")
            + "`")


def require_passes(runs: Sequence[RunData], passes: Sequence[str]) -> None:
    """One error listing every run that lacks one of ``passes`` (with the command for each)."""
    problems = []
    for run in runs:
        missing = [p for p in passes if not run.analysed_rounds(p)]
        if missing:
            problems.append(missing_message(run, missing))
    if problems:
        raise LandscapeError("; ".join(problems))


WAIT = "wait for it to finish (or stop it), then run this again"


def require_metric(runs: Sequence[RunData], key: str, hint: str = "") -> None:
    """One error naming the runs without ``key`` in metrics.jsonl (with ``hint``, how it is logged), or the
    runs in use by another process (still being trained: the key may only not be logged yet)."""
    missing = [run for run in runs if not run.has_metric(key)]
    busy = [text for text in (run.lacks_while_in_use(f"'{key}' in metrics.jsonl") for run in missing) if text]
    if busy:
        raise LandscapeError(f"{'; '.join(busy)}: {WAIT}")
    if missing:
        names = ", ".join(run.name for run in missing)
        known = sorted({k for row in missing[0].metrics for k in row})
        raise LandscapeError(f"run {names} has no '{key}' in metrics.jsonl" + (f" ({hint})" if hint else "")
                             + (f"; keys there: {', '.join(known)}" if known else "; the file has no rows"))


def _run_dirs(path: Path) -> list[Path]:
    """A run directory, or a folder whose sub-folders are run directories."""
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if RunDir(path).is_run():
        return [path]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and RunDir(p).is_run()) if path.is_dir() else []
    if not subs:
        raise LandscapeError(f"{path} is not a run directory (no recipe.toml) and holds none")
    return subs


def load_runs(paths: str | Path | Run | Sequence[str | Path | Run], selection: Selection | None = None
              ) -> list[RunData]:
    """The runs of run directories (or folders of them), or of ``store.run.Run``s read already (``open_run``),
    each read once by its ``Run``; unique labels. ``selection`` says which settings' results to read
    (default: ``Selection(RESULT_NAMES)``, the defaults)."""
    if isinstance(paths, (str, Path, Run)):
        paths = [paths]
    found: dict[Path, Run] = {}
    for p in paths:
        for run in [p] if isinstance(p, Run) else [Run(d) for d in _run_dirs(Path(p)) if d not in found]:
            found.setdefault(run.path, run)
    if not found:
        raise LandscapeError("no run directories given")
    runs = [RunData(run, selection=selection or Selection(RESULT_NAMES)) for run in found.values()]
    for i, (run, label) in enumerate(zip(runs, run_labels([r.recipe for r in runs], [r.name for r in runs]))):
        run.label, run.index = label, i
    mark_seed_groups(runs)
    return runs


def mark_seed_groups(runs: Sequence[RunData]) -> None:
    """Runs that differ only in their recipe's seed become one group (``landscape.figures.seeds``): one
    ``group`` key, a label without the seed and one colour per group. Nothing changes when no two runs do."""
    found = recipe_groups([run.recipe for run in runs])
    if all(len(members) == 1 for members in found):
        return
    firsts = [runs[members[0]] for members in found]
    labels = run_labels([without_seed(run.recipe) for run in firsts], [run.name for run in firsts])
    for k, (members, label) in enumerate(zip(found, labels)):
        for i in members:
            runs[i].index, runs[i].group, runs[i].group_label = k, f"recipe-{k}", label


RunsLike = Sequence["RunData | Run | str | Path"] | Run | str | Path


def as_runs(runs: RunsLike, selection: Selection | None = None) -> list[RunData]:
    """RunData as given (choosing again when a ``selection`` is given), or the runs of ``store.run.Run``s and
    paths (``load_runs``; a RunData among them gives its ``Run``, read already)."""
    if isinstance(runs, (str, Path, Run)):
        return load_runs(runs, selection)
    runs = list(runs)
    if runs and all(isinstance(r, RunData) for r in runs):
        return runs if selection is None else [run.select(selection) for run in runs]
    return load_runs([r.run if isinstance(r, RunData) else r for r in runs], selection)
