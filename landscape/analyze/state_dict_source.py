"""Plain state_dicts as the source of an analysis (``StateDictSource``): the model from ``--model``, the
data from ``--dataset``, and no clients.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from landscape.analyze.analysis_data import AnalysisData, as_data, check_model_data
from landscape.analyze.registry import PASSES, needs_clients
from landscape.analyze.source import Source
from landscape.config.setup import DataSetup
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.store.checkpoints import Checkpoint, load_state_dict_file


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
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if path.is_file():
        source = StateDictSource(path.stem, [path], spec, path.parent / "analysis")
    else:
        files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in STATE_DICT_SUFFIXES)
        if not files:
            raise LandscapeError(f"{path} holds no state_dict files ({', '.join(STATE_DICT_SUFFIXES)})")
        source = StateDictSource(path.name, files, spec, path / "analysis")
    source.inputs  # noqa: B018 - computed for its checks
    return [source]
