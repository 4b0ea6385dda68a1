"""What an analysis pass sees: one checkpoint of one run, its model as a flat vector, and its data.

``find_targets`` turns the path given to ``landscape analyze`` (a run directory, a folder of runs, a run's
``checkpoints/`` folder, a loose folder of checkpoints, or one checkpoint file) into (run, round) targets.
A checkpoint carries the resolved recipe it was trained with, so a folder of checkpoints copied away from
its run still analyses: the data and partition are rebuilt from the recipe (both are seeded).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from landscape import recipe as recipes
from landscape.analyze.objective import AnalysisData, Objective
from landscape.errors import LandscapeError
from landscape.flat import FlatModel
from landscape.recipe import Recipe
from landscape.runs import Checkpoint, RunDir, load_client_models
from landscape.setup import DataSetup, build_module, prepare_data, resolve_device, torch_dtype

_ROUND_FILE = re.compile(r"^round-(\d{4,})\.pt$")


@dataclass(frozen=True)
class AnalysisSettings:
    """Settings shared by every pass (recorded with each result)."""

    split: str = "train"  # train: union of all clients' training data; test: the test set
    analysis_samples: int = 0  # 0: all of the split; N: a fixed seeded subset of N samples
    bn_mode: str = "eval"
    device: str = "auto"
    backend: str = "native"  # native | pyhessian (lambda_max and trace cross-check)
    hvp: str = "double-backward"  # or forward-over-reverse
    batch_size: int = 512  # analysis batches (fixed order and boundaries)
    seed: int = 0
    dtype: str = "float32"

    def record(self) -> dict:
        return dict(self.__dict__)


class Source:
    """One run (a run directory, or a loose folder of checkpoints carrying their recipe)."""

    def __init__(self, name: str, recipe: Recipe, checkpoints: dict[int, Path], analysis_dir: Path,
                 run_dir: RunDir | None) -> None:
        self.name = name
        self.recipe = recipe
        self.checkpoints = checkpoints
        self.analysis_dir = analysis_dir
        self.run_dir = run_dir
        self._setup: DataSetup | None = None

    @property
    def setup(self) -> DataSetup:
        if self._setup is None:
            self._setup = prepare_data(self.recipe)
        return self._setup

    def clients_checkpoint(self, round: int) -> Path:
        return self.checkpoints[round].with_name(f"round-{round:04d}.clients.pt")


def _source_from_run(path: Path) -> Source:
    run_dir = RunDir(path)
    recipe = recipes.read_recipe(run_dir.recipe, algorithms=False)
    ckpts = {r: run_dir.checkpoint(r) for r in run_dir.rounds()}
    return Source(path.name, recipe, ckpts, path / "analysis", run_dir)


def _source_from_checkpoints(folder: Path, files: list[Path]) -> Source:
    ckpts = {int(_ROUND_FILE.match(f.name).group(1)): f for f in files}
    last = Checkpoint.load(ckpts[max(ckpts)])
    if last.recipe_text is None:
        raise LandscapeError(f"{last.path} carries no recipe and is not inside a run directory")
    recipe = recipes.resolve(recipes.tomllib.loads(last.recipe_text), algorithms=False)
    return Source(folder.name, recipe, ckpts, folder / "analysis", None)


def find_sources(path: Path) -> tuple[list[Source], int | None]:
    """Runs to analyse under ``path``; the round when ``path`` is one checkpoint file."""
    path = Path(path)
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if path.is_file():
        match = _ROUND_FILE.match(path.name)
        if not match:
            raise LandscapeError(f"{path} is not a checkpoint file (round-NNNN.pt)")
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


def select_rounds(source: Source, spec: str) -> list[int]:
    """``last``, ``all`` or a comma list of rounds; each must have a checkpoint."""
    available = sorted(source.checkpoints)
    if not available:
        raise LandscapeError(f"{source.name} has no checkpoints to analyse")
    if spec == "last":
        return [available[-1]]
    if spec == "all":
        return available
    try:
        wanted = [int(r) for r in spec.split(",") if r.strip()]
    except ValueError:
        raise LandscapeError(f"--rounds takes last, all or a comma list of round numbers (got '{spec}')") from None
    missing = [r for r in wanted if r not in source.checkpoints]
    if missing:
        raise LandscapeError(
            f"round {missing[0]} has no checkpoint in {source.name}; checkpointed rounds: "
            + ", ".join(map(str, available))
        )
    return wanted


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class CheckpointContext:
    """One checkpoint, ready for the passes: model as a flat vector w, global and per-client objectives."""

    source: Source
    round: int
    settings: AnalysisSettings
    flat: FlatModel = field(init=False)
    w: Tensor = field(init=False)
    buffers: dict[str, Tensor] = field(init=False)

    def __post_init__(self) -> None:
        path = self.source.checkpoints[self.round]
        ckpt = Checkpoint.load(path)
        self.device = resolve_device(self.settings.device)
        self.dtype = torch_dtype(self.settings.dtype)
        module = build_module(self.source.recipe, self.source.setup.bundle).to(self.device, self.dtype)
        self.flat = FlatModel(module)
        self.reference_state = module.state_dict()
        ckpt.check_model(self.reference_state, self.source.recipe.model.name)
        # Evaluation and analysis use x_swa once server SWA has produced it.
        self.w, self.buffers = self.flat.from_state_dict(ckpt.analysed_state)
        # x^t of training (differs from w only under server SWA): flatness distance is measured to it.
        self.global_w = self.flat.from_state_dict(ckpt.model_state)[0] if ckpt.has_swa else self.w
        self.digest = file_digest(path)

    def load_global(self, path: Path, analysed: bool = True) -> Tensor:
        """The flat model vector of another checkpoint of this run (x_swa when ``analysed`` and it exists,
        else x^t), checked against the model."""
        ckpt = Checkpoint.load(path)
        ckpt.check_model(self.reference_state, self.source.recipe.model.name)
        return self.flat.from_state_dict(ckpt.analysed_state if analysed else ckpt.model_state)[0]

    # -- data -------------------------------------------------------------------------------------------
    @cached_property
    def global_data(self) -> AnalysisData:
        bundle = self.source.setup.bundle
        if self.settings.split == "test":
            x, y = bundle.test.x, bundle.test.y
        else:
            index = torch.as_tensor(np.sort(np.concatenate(self.source.setup.client_indices)))
            x, y = bundle.train.x[index], bundle.train.y[index]
        n = self.settings.analysis_samples
        if 0 < n < len(y):
            pick = np.sort(np.random.default_rng(self.settings.seed).choice(len(y), size=n, replace=False))
            x, y = x[torch.as_tensor(pick)], y[torch.as_tensor(pick)]
        return AnalysisData(x, y, self.settings.batch_size).place(self.device, self.dtype)

    @cached_property
    def objective(self) -> Objective:
        """F over the analysis data."""
        return Objective(self.flat, self.buffers, self.global_data, self.settings.bn_mode)

    @cached_property
    def problem(self):
        """F at the checkpoint's w, as the function API takes it (``landscape.api.Problem``)."""
        from landscape.api import Problem

        return Problem(self.objective, self.w)

    @property
    def num_clients(self) -> int:
        return len(self.source.setup.client_indices)

    def client_data(self, client: int) -> AnalysisData:
        bundle = self.source.setup.bundle
        index = torch.as_tensor(self.source.setup.client_indices[client])
        return AnalysisData(bundle.train.x[index], bundle.train.y[index], self.settings.batch_size).place(
            self.device, self.dtype
        )

    def client_objective(self, client: int) -> Objective:
        """F_i over client i's (never augmented) training data."""
        return Objective(self.flat, self.buffers, self.client_data(client), self.settings.bn_mode)

    def sample_clients(self, count: int) -> list[int]:
        """All clients (count 0 or >= N) or a seeded sample of ``count``."""
        n = self.num_clients
        if count <= 0 or count >= n:
            return list(range(n))
        return sorted(int(i) for i in np.random.default_rng(self.settings.seed).choice(n, count, replace=False))

    # -- kept client models -----------------------------------------------------------------------------
    def kept_clients(self) -> dict[int, Tensor]:
        """This round's clients' final local models y_{i,K} (saved with --keep-clients)."""
        path = self.source.clients_checkpoint(self.round)
        if not path.is_file():
            raise LandscapeError(
                f"{self.source.name} has no client models for round {self.round}; "
                "train with --keep-clients to save them at checkpoints"
            )
        kept = load_client_models(path, self.reference_state, self.source.recipe.model.name)
        return {i: self.flat.from_state_dict(state)[0] for i, state in kept.items()}

    def previous_global(self) -> Tensor | None:
        """x^{t-1}, the model this round's clients started from, when that round was checkpointed."""
        path = self.source.checkpoints.get(self.round - 1)
        if path is None:
            return None
        return self.load_global(path, analysed=False)
