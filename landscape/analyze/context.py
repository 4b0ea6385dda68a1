"""What an analysis pass sees: one checkpoint of one run, its model as a flat vector, and its data.

``find_sources`` turns the path given to ``landscape analyze`` (a run directory, a folder of runs, a run's
``checkpoints/`` folder, a loose folder of checkpoints, or one checkpoint file) into sources and rounds.
A checkpoint carries the resolved recipe it was trained with, so a folder of checkpoints copied away from
its run still analyses: the data and partition are rebuilt from the recipe (both are seeded).

A plain ``torch.save(model.state_dict())`` file, or a folder of them, is a ``StateDictSource``: the model
comes from ``--model`` (a registered model name or ``package.module:factory``) and the data from ``--dataset``
(a registered data set or ``package.module:factory``); it has no clients, so only the passes that need none
run on it. Its results go to ``analysis/<file stem>/`` next to the files, keyed by the model and data that
produced them (``StateDictSource.inputs``) besides the file's SHA-256 and the settings.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from landscape.analyze.analysis_data import AnalysisData, as_data, check_model_data
from landscape.analyze.objective import Objective, Problem
from landscape.analyze.registry import PASSES, needs_clients
from landscape.analyze.settings import AnalysisSettings
from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.setup import DataSetup, build_module, prepare_data, resolve_device, torch_dtype
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.store.checkpoints import (
    Checkpoint,
    load_client_models,
    load_state_dict_file,
    non_finite_weights,
)
from landscape.store.runs import RunDir

_ROUND_FILE = re.compile(r"^round-(\d{4,})\.pt$")


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
            self.recipe.require_entries()  # a data set or partition only its untrusted imports provide: refused
            self._setup = prepare_data(self.recipe)
        return self._setup

    def clients_checkpoint(self, round: int) -> Path:
        return self.checkpoints[round].with_name(f"round-{round:04d}.clients.pt")

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
        """A checkpoint that carries another recipe than this run's (another seed's run copied in, an edited
        recipe.toml) is refused, as resuming refuses it: its analysis would rebuild other data and partition."""
        from landscape.store.lifecycle import RESUME_FREE_KEYS

        if checkpoint.recipe_text is None:
            return
        difference = recipes.difference(checkpoint.recipe_text, self.recipe, RESUME_FREE_KEYS)
        if difference:
            raise LandscapeError(f"{checkpoint.path} was written by another recipe ({difference}); it is not a "
                                 f"checkpoint of {self.name}: move it away, or analyse it where it came from")

    @property
    def train_batch_size(self) -> int:
        """The clients' minibatch size (the minibatch metrics use it by default)."""
        return self.recipe.train.batch_size

    def analysis_set(self, split: str) -> tuple[Tensor, Tensor]:
        """(inputs, targets) of the split: train = the union of all clients' training data; test = the test set."""
        bundle = self.setup.bundle
        if split == "test":
            return bundle.test.x, bundle.test.y
        index = torch.as_tensor(np.sort(np.concatenate(self.setup.client_indices)))
        return bundle.train.x[index], bundle.train.y[index]


def _source_text(obj: object) -> str:
    """``inspect.getsource(obj)``; "" where there is none (a builtin, code typed at a prompt)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def model_sha256(factory: Callable, module: nn.Module) -> str:
    """SHA-256 of what a model factory makes the numbers of: the factory's source, the source of each class
    outside torch among the returned module's submodules (its own class first, then in ``modules()`` order)
    and ``repr(module)`` (the layers and their settings), joined by NUL bytes."""
    classes = list(dict.fromkeys(type(m) for m in module.modules()))
    own = [_source_text(c) for c in classes if c.__module__.split(".")[0] != "torch"]
    text = "\0".join([_source_text(factory), *own, repr(module)])
    return hashlib.sha256(text.encode()).hexdigest()


def data_sha256(x: Tensor, y: Tensor) -> str:
    """SHA-256 of the analysis data: for the inputs, then the targets, the dtype and the shape as text and
    the raw bytes in row-major order."""
    h = hashlib.sha256()
    for t in (x, y):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


@dataclass(frozen=True)
class ForeignModel:
    """How to analyse plain state_dicts: the model and the data, each a registered name or a factory
    (``package.module:function``, called with no arguments: a model returns an ``nn.Module``, a data factory
    (inputs, targets) tensors, a ``Dataset`` or a ``DataLoader``)."""

    model: str
    dataset: str


class StateDictSource(Source):
    """Plain state_dict files (one, or a folder of them): no recipe, no clients.

    The model factory is called once (``build_module`` hands out copies of what it returned), the data
    factory once (its tensors are kept). A result is keyed by ``inputs`` too: another model, model code or
    data on the same file is computed again, never taken for done."""

    def __init__(self, name: str, files: list[Path], spec: ForeignModel, analysis_dir: Path) -> None:
        super().__init__(name, None, dict(enumerate(files)), analysis_dir, None)
        self.spec = spec
        self._data: dict[str, tuple[Tensor, Tensor]] = {}
        self._bundle = None
        self._module: nn.Module | None = None
        self._inputs: dict | None = None

    def result_dir(self, round: int) -> Path:
        return self.analysis_dir / self.checkpoints[round].stem

    def clients_checkpoint(self, round: int) -> Path:
        return self.analysis_dir / "no-clients"  # never a file: a state_dict has no clients

    def load(self, round: int) -> Checkpoint:
        return Checkpoint(self.checkpoints[round], {"model": load_state_dict_file(self.checkpoints[round]),
                                                    "round": round})

    def _registered_bundle(self):
        from landscape.data.datasets import DATASETS, load_dataset

        if self._bundle is None:
            DATASETS.get(self.spec.dataset)  # a one-line error naming the registered ones
            self._bundle = load_dataset(self.spec.dataset, root="data", download=False, augment=False,
                                        num_clients=1, seed=0, options={})
        return self._bundle

    def build_module(self) -> nn.Module:
        """A copy of the model the factory (or the registry) made once."""
        if self._module is None:
            self._module = self._make_module()
        return copy.deepcopy(self._module)

    def _make_module(self) -> nn.Module:
        from landscape.config.imports import call_factory
        from landscape.models import MODELS, build_model

        if ":" in self.spec.model:
            module = call_factory(self.spec.model, "model factory")
            if not isinstance(module, nn.Module):
                raise LandscapeError(f"model factory '{self.spec.model}' returned {type(module).__name__}, not an "
                                     "nn.Module")
            return module
        MODELS.get(self.spec.model)
        if ":" in self.spec.dataset:
            raise LandscapeError(f"a registered model ('{self.spec.model}') is built for a registered data set; "
                                 f"give --model package.module:factory with the data factory '{self.spec.dataset}'")
        bundle = self._registered_bundle()
        return build_model(self.spec.model, bundle.input_shape, bundle.num_classes, {})

    @property
    def inputs(self) -> dict:
        """What a result of these files is keyed by besides the file's SHA-256 and the settings: ``model`` and
        ``dataset`` (the specs as given), ``model_sha256`` (``model_sha256`` of a factory; None for a registered
        model, its name says it) and ``data_sha256`` (``data_sha256`` of the factory's tensors; None for a
        registered data set: its name and the split setting say it). Computing it imports and calls both
        factories (once): a bad --model or --dataset is a one-line error before anything is taken for done."""
        if self._inputs is None:
            from landscape.config.imports import load_object

            module = self.build_module()
            x, y = self.analysis_set("train")  # a factory's data: whatever the split
            factory = load_object(self.spec.model, "model factory") if ":" in self.spec.model else None
            self._inputs = {"model": self.spec.model,
                            "model_sha256": model_sha256(factory, module) if factory is not None else None,
                            "dataset": self.spec.dataset,
                            "data_sha256": data_sha256(x, y) if ":" in self.spec.dataset else None}
        return self._inputs

    def check_pass(self, name: str, options: object) -> None:
        """A pass that reads clients (``registry.needs_clients``) is refused in one line naming the passes
        that run on a state_dict."""
        if not needs_clients(name, options):
            return
        what = getattr(options, "described", name)  # options that ask for clients: surface --directions
        usable = [f"{p} ({PASSES.info(p).without_clients})" if PASSES.info(p).without_clients else p
                  for p in PASSES.names() if not needs_clients(p, None)]
        given = self.checkpoints[0] if len(self.checkpoints) == 1 else self.analysis_dir.parent
        raise LandscapeError(f"{what} needs the clients of a training run, and {given} is a plain state_dict, "
                             f"which has no clients (no client data, no kept client models); the passes that "
                             f"run on a state_dict: {', '.join(usable)}")

    @property
    def model_name(self) -> str:
        return self.spec.model

    def dtype_of(self, checkpoint: Checkpoint) -> torch.dtype:
        return checkpoint.dtype

    @property
    def run_dtype(self) -> torch.dtype | None:
        return None

    def check_recipe(self, checkpoint: Checkpoint) -> None:
        pass  # a state_dict carries no recipe

    @property
    def train_batch_size(self) -> int:
        return 32

    @property
    def setup(self) -> DataSetup:
        raise LandscapeError(f"{self.name} is a plain state_dict: it has no clients or partition")

    def analysis_set(self, split: str) -> tuple[Tensor, Tensor]:
        """The data set's split, or the factory's data (whatever the split), checked where it enters
        (``as_data``) and against the model's first forward pass (``check_model_data``): one line naming the
        data set or the factory."""
        key = "factory" if ":" in self.spec.dataset else split
        if key not in self._data:
            if key == "factory":
                from landscape.config.imports import call_factory

                data = as_data(call_factory(self.spec.dataset, "data factory"),
                               name=f"data factory '{self.spec.dataset}'")
            else:
                part = self._registered_bundle().test if split == "test" else self._registered_bundle().train
                data = AnalysisData(part.x, part.y, name=f"data set '{self.spec.dataset}' ({split} split)")
            flat = FlatModel(self.build_module())
            check_model_data(flat, flat.buffers(), data, None)
            self._data[key] = (data.x, data.y)
        return self._data[key]


STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin")


def state_dict_sources(path: Path, spec: ForeignModel) -> list[Source]:
    """One source of the state_dict file ``path``, or of every state_dict file in the folder ``path``. The
    model and the data are checked here (``StateDictSource.inputs``: both factories imported and called once),
    before anything is looked up as done."""
    if path.is_file():
        source = StateDictSource(path.stem, [path], spec, path.parent / "analysis")
    else:
        files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in STATE_DICT_SUFFIXES)
        if not files:
            raise LandscapeError(f"{path} holds no state_dict files ({', '.join(STATE_DICT_SUFFIXES)})")
        source = StateDictSource(path.name, files, spec, path / "analysis")
    source.inputs  # noqa: B018 - computed for its checks
    return [source]


def _source_from_run(path: Path) -> Source:
    run_dir = RunDir(path)
    # its imports run only when trusted (--trust-imports); else what they provide is refused once it is built
    recipe = recipes.read_recipe(run_dir.recipe, algorithms=False, defer=True)
    ckpts = {r: run_dir.checkpoint(r) for r in run_dir.rounds()}
    return Source(path.name, recipe, ckpts, path / "analysis", run_dir)


def _source_from_checkpoints(folder: Path, files: list[Path]) -> Source:
    ckpts = {int(_ROUND_FILE.match(f.name).group(1)): f for f in files}
    last = Checkpoint.load(ckpts[max(ckpts)], finite=False)  # its recipe: the rounds analysed are checked at load
    if last.recipe_text is None:
        raise LandscapeError(f"{last.path} carries no recipe and is not inside a run directory")
    recipe = recipes.resolve(recipes.tomllib.loads(last.recipe_text), algorithms=False, recorded=True, defer=True,
                             origin=f"the recipe in {last.path}")
    return Source(folder.name, recipe, ckpts, folder / "analysis", None)


def find_sources(path: Path, foreign: ForeignModel | None = None) -> tuple[list[Source], int | None]:
    """Runs to analyse under ``path``; the round when ``path`` is one checkpoint file. With ``foreign``,
    ``path`` is a state_dict file or a folder of them."""
    path = Path(path)
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if foreign is not None:
        return state_dict_sources(path, foreign), None
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
        raise LandscapeError(f"the checkpoints to analyse (--checkpoints; rounds in a recipe) are last, all or a comma "
                             f"list of round numbers (got '{spec}')") from None
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
    # progress(done, total or None) of the work inside a pass (products, surface cells); set by the scheduler
    progress: Callable[[int, int | None], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        path = self.source.checkpoints[self.round]
        ckpt = self.source.load(self.round)
        self.device = resolve_device(self.settings.device)
        auto = self.settings.dtype == "auto"
        self.dtype = self.source.dtype_of(ckpt) if auto else torch_dtype(self.settings.dtype)
        module = self.source.build_module().to(self.device, self.dtype)
        self.flat = FlatModel(module)
        self.reference_state = module.state_dict()
        ckpt.check_model(self.reference_state, self.source.model_name, self.source.run_dtype)
        self.source.check_recipe(ckpt)
        # Evaluation and analysis use x_swa once server SWA has produced it.
        self.w, self.buffers = self.flat.from_state_dict(ckpt.analysed_state)
        # x^t of training (differs from w only under server SWA): flatness distance is measured to it.
        self.global_w = self.flat.from_state_dict(ckpt.model_state)[0] if ckpt.has_swa else self.w
        # The one check of the analysed weights, for every pass: finite in the analysis dtype (a checkpoint's
        # tensors were checked at load; a state_dict's weights, and a dtype's range, are checked here).
        for weights, state in ((self.w, ckpt.analysed_state), (self.global_w, ckpt.model_state)):
            error = None if bool(torch.isfinite(weights).all()) else non_finite_weights(
                path, {n: state[n] for n in self.flat.names}, self.dtype)
            if error is not None:
                raise error
        self.digest = file_digest(path)

    def load_global(self, path: Path, analysed: bool = True) -> Tensor:
        """The flat model vector of another checkpoint of this run (x_swa when ``analysed`` and it exists,
        else x^t), checked against the model."""
        ckpt = Checkpoint.load(path)
        ckpt.check_model(self.reference_state, self.source.model_name)
        return self.flat.from_state_dict(ckpt.analysed_state if analysed else ckpt.model_state)[0]

    # -- data -------------------------------------------------------------------------------------------
    @cached_property
    def global_data(self) -> AnalysisData:
        x, y = self.source.analysis_set(self.settings.split)
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
        """F at the checkpoint's w, as the function API takes it."""
        return Problem(self.objective, self.w)

    @property
    def num_clients(self) -> int:
        """The run's clients (0 for a plain state_dict)."""
        return 0 if isinstance(self.source, StateDictSource) else len(self.source.setup.client_indices)

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
        kept = load_client_models(path, self.reference_state, self.source.model_name, self.source.run_dtype,
                                  self.num_clients)
        return {i: self.flat.from_state_dict(state)[0] for i, state in kept.items()}

    def previous_global(self) -> Tensor | None:
        """x^{t-1}, the global model of training before this round (checkpoint ``round-(t-1)``; never x_swa),
        when that round was checkpointed. The clients started from it only where the algorithm broadcasts it
        unchanged: ``broadcast_start`` gives the point they did start from."""
        path = self.source.checkpoints.get(self.round - 1)
        if path is None:
            return None
        return self.load_global(path, analysed=False)

    def broadcast_start(self) -> Tensor | None:
        """s^t, the model this round's clients started their local steps from, when round t-1 was checkpointed:
        s^t = A.start_point(A.broadcast(x^{t-1}, server_state^{t-1}, t-1)), with A the run's algorithm rebuilt
        from its recipe (``build_algorithm``, as the trainer builds it) and x^{t-1} and its server state from
        checkpoint ``round-(t-1)``. It is x^{t-1} for FedAvg and every rule that sends the global model, the
        look-ahead x^{t-1} + lam m^{t-2} for fedacg and fednsam-code. Computed on the CPU in the checkpoint's
        dtype (the training arithmetic), then placed like ``w``."""
        path = self.source.checkpoints.get(self.round - 1)
        if path is None:
            return None
        if self.source.recipe is None:
            raise LandscapeError(f"{self.source.name} is a plain state_dict: it has no algorithm to start clients")
        # The algorithm rules (never the training loop): what the server sent is defined by them alone.
        from landscape.train.algorithms import ParamLayout, build_algorithm

        ckpt = Checkpoint.load(path)
        ckpt.check_model(self.reference_state, self.source.model_name)
        state = ckpt.model_state
        x = torch.cat([state[n].reshape(-1) for n in self.flat.names])
        server_state = ckpt.payload.get("server_state")
        if not isinstance(server_state, dict):
            raise LandscapeError(f"{path} holds no server state: the clients' start point of round {self.round} "
                                 "cannot be rebuilt")
        algorithm = build_algorithm(self.source.recipe, ParamLayout(tuple(self.flat.names),
                                                                    tuple(map(tuple, self.flat.shapes))))
        try:
            typed = algorithm.ServerState.from_named(server_state)  # the state by its field names
            start = algorithm.start_point(algorithm.broadcast(x, typed, self.round - 1))
        except ValueError as unknown:
            raise LandscapeError(f"{path} holds a server state {self.source.recipe.algorithm.name} does not keep "
                                 f"({unknown}): the clients' start point of round {self.round} cannot be rebuilt"
                                 ) from None
        except KeyError as missing:
            raise LandscapeError(f"{path} lacks the server state {missing} that {self.source.recipe.algorithm.name} "
                                 f"broadcasts: the clients' start point of round {self.round} cannot be rebuilt"
                                 ) from None
        return start.to(self.device, self.dtype)
