"""The source of an analysis: a run directory, or a loose folder of checkpoints carrying their recipe
(``Source``), and how sources and their rounds are found from a path (``find_sources``, ``select_rounds``, which
takes a ``core.rounds.Rounds``).

``find_sources`` turns the path given to ``landscape analyze`` (a run directory, a folder of runs, a run's
``checkpoints/`` folder, a loose folder of checkpoints, or one checkpoint file) into sources and rounds.
A checkpoint carries the resolved recipe it was trained with, so a folder of checkpoints copied away from
its run still analyses: the data and partition are rebuilt from the recipe (both are seeded).

Plain state_dicts (a file, or a folder of them) are a ``StateDictSource`` (``state_dict_source``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.setup import DataSetup, build_module, prepare_data, torch_dtype
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds, RoundsUnavailable
from landscape.store.checkpoints import Checkpoint, load_checkpoint
from landscape.store.directory import RunDir
from landscape.store.recorded import check_recipe
from landscape.store.results.validity import PROCESS_HASHES
from landscape.store.run import Run

_ROUND_FILE = re.compile(r"^round-(\d{4,})\.pt$")


class Source:
    """One run (a run directory, read through ``store.run.Run``, the one read model of a run; or a loose folder
    of checkpoints carrying their recipe)."""

    def __init__(self, name: str, recipe: Recipe, checkpoints: dict[int, Path], analysis_dir: Path,
                 run: Run | None) -> None:
        self.name = name
        self.recipe = recipe
        self.checkpoints = checkpoints
        self.analysis_dir = analysis_dir
        self.run = run
        self.recipe_here = "in recipe.toml"  # how a difference from ``recipe`` names it (a loose folder: its file)
        self._setup: DataSetup | None = None

    @property
    def run_dir(self) -> RunDir | None:
        return self.run.dir if self.run is not None else None

    @property
    def setup(self) -> DataSetup:
        if self._setup is None:
            self.recipe.require_entries()  # a data set or partition only its untrusted imports provide: refused
            self._setup = self.run.data_setup() if self.run is not None else prepare_data(self.recipe)
        return self._setup

    def clients_checkpoint(self, round: int) -> Path:
        return self.checkpoints[round].with_name(f"round-{round:04d}.clients.pt")

    def kept_client_ids(self, round: int) -> list[int]:
        """The clients whose final local models the round kept (those sampled in it, saved with
        --keep-clients), in order; [] when it kept none. Read from the clients file's keys (loaded safely;
        the models are checked when a pass loads them)."""
        path = self.clients_checkpoint(round)
        if not path.is_file():
            return []
        clients = load_checkpoint(path).get("clients")
        keys = clients if isinstance(clients, dict) else {}
        return sorted(int(k) for k in keys if isinstance(k, str) and k.isdigit())

    def result_dir(self, round: int) -> Path:
        """Where the results of a round's checkpoint go."""
        return self.analysis_dir / f"round-{round:04d}"

    def load(self, round: int) -> Checkpoint:
        return Checkpoint.load(self.checkpoints[round])

    def build_module(self) -> nn.Module:
        self.recipe.require_entries()  # a model only its untrusted imports provide: refused in one line
        return build_module(self.recipe, self.setup.bundle)

    @property
    def inputs(self) -> dict | None:
        """What the results are keyed by besides the checkpoint's SHA-256 and the settings: None for a run (its
        checkpoints carry the recipe that made them); a plain state_dict's model and data (``StateDictSource``)."""
        return None

    def check_pass(self, name: str, options: object) -> None:
        """Refuse, in one line, a pass that cannot run on this source (a run: every pass can)."""

    @property
    def model_name(self) -> str:
        return self.recipe.model.name

    def dtype_of(self, checkpoint: Checkpoint) -> torch.dtype:
        """The dtype analysis uses by default: the run's."""
        return torch_dtype(self.recipe.train.dtype)

    @property
    def run_dtype(self) -> torch.dtype | None:
        """The dtype the run's checkpoints hold (train.dtype); None: any."""
        return torch_dtype(self.recipe.train.dtype)

    def check_recipe(self, checkpoint: Checkpoint) -> None:
        """A checkpoint that carries another recipe than this run's (another seed's run copied in) is refused,
        as resuming refuses it: its analysis would rebuild other data and partition (``store.recorded.
        check_recipe``, the check ``open_run(...).model()`` makes). A run's recipe is the one its checkpoints
        record (``Run.recipe_table``: a recipe.toml edited after training is not used, and a note says so)."""
        if self.run is not None:
            check_recipe(checkpoint.path, checkpoint.recipe_text, self.run.recipe_table(), self.name,
                         self.run.recipe_here)
        else:
            check_recipe(checkpoint.path, checkpoint.recipe_text, self.recipe, self.name, self.recipe_here)

    @property
    def train_batch_size(self) -> int:
        """The clients' minibatch size (the minibatch metrics use it by default)."""
        return self.recipe.train.batch_size

    def analysis_set(self, split: str) -> tuple[Tensor, Tensor]:
        """(inputs, targets) of the split: train = all clients' training data with multiplicity (a sample that
        clients hold k times in all counts k times, as dirichlet-client-reuse repeats samples: the mean loss over it
        is the reference codes' global objective sum_i n_i f_i / sum_i n_i); test = the test set."""
        bundle = self.setup.bundle
        if split == "test":
            return bundle.test.x, bundle.test.y
        index = torch.as_tensor(np.sort(np.concatenate(self.setup.client_indices)))
        return bundle.train.x[index], bundle.train.y[index]


def _source_from_run(path: Path) -> Source:
    run = Run(path)
    # its imports run only when trusted (--trust-imports); else what they provide is refused once it is built
    ckpts = {r: run.dir.checkpoint(r) for r in run.rounds()}
    return Source(path.name, run.recipe, ckpts, path / "analysis", run)


def _source_from_checkpoints(folder: Path, files: list[Path]) -> Source:
    ckpts = {int(_ROUND_FILE.match(f.name).group(1)): f for f in files}
    last = Checkpoint.load(ckpts[max(ckpts)], finite=False)  # its recipe: the rounds analysed are checked at load
    if last.recipe_text is None:
        raise LandscapeError(f"{last.path} carries no recipe and is not inside a run directory")
    recipe = recipes.resolve(recipes.tomllib.loads(last.recipe_text), algorithms=False, recorded=True, defer=True,
                             origin=f"the recipe in {last.path}")
    source = Source(folder.name, recipe, ckpts, folder / "analysis", None)
    source.recipe_here = f"in {last.path.name}"
    return source


def find_sources(path: Path) -> tuple[list[Source], int | None]:
    """Runs to analyse under ``path``; the round when ``path`` is one checkpoint file. (Plain state_dicts, a
    file or a folder of them: ``state_dict_source.state_dict_sources``.)"""
    path = Path(path)
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if path.is_file():
        match = _ROUND_FILE.match(path.name)
        if not match:
            raise LandscapeError(f"{path} is not a checkpoint file (round-NNNN.pt); to analyse a plain state_dict "
                                 "give --model (package.module:factory or a model name) and --dataset")
        if RunDir(path.parent.parent).is_run() and path.parent.name == "checkpoints":
            return [_source_from_run(path.parent.parent)], int(match.group(1))
        return [_source_from_checkpoints(path.parent, [path])], int(match.group(1))
    if RunDir(path).is_run():
        return [_source_from_run(path)], None
    if path.name == "checkpoints" and RunDir(path.parent).is_run():
        return [_source_from_run(path.parent)], None
    files = sorted(f for f in path.iterdir() if _ROUND_FILE.match(f.name))
    if files:
        return [_source_from_checkpoints(path, files)], None
    runs = sorted(p for p in path.iterdir() if p.is_dir() and RunDir(p).is_run())
    if runs:
        return [_source_from_run(p) for p in runs], None
    raise LandscapeError(
        f"{path} is not a run directory (no recipe.toml), a folder of runs, or a folder of checkpoints"
    )


def select_rounds(source: Source, rounds: Rounds | str) -> list[int]:
    """The checkpoints ``rounds`` picks (``Rounds``: last, last N, all, a round or a list of rounds) of a
    source; each listed round must have a checkpoint."""
    rounds = Rounds.parse(rounds, "--checkpoints")
    available = sorted(source.checkpoints)
    if not available:
        raise LandscapeError(f"{source.name} has no checkpoints to analyse")
    try:
        return rounds.select(available)
    except RoundsUnavailable as e:
        what = (f"round {e.lacking[0]} has no checkpoint in {source.name}" if e.lacking else
                f"--checkpoints {rounds} asks for {e.asked} checkpoints; {source.name} has {len(available)}")
        raise LandscapeError(f"{what}; checkpointed rounds: {', '.join(map(str, available))}") from None


def file_digest(path: Path) -> str:
    """The checkpoint file's SHA-256, as its results record it and every reader checks it
    (``store.results.validity.file_sha256``; a FIFO in its place: one line, never a hang), hashed once per
    process while the file is unchanged (``validity.PROCESS_HASHES``)."""
    return PROCESS_HASHES.sha256(path)
