"""Plain state_dicts as the source of an analysis (``StateDictSource``): the model from ``--model``, the
data from ``--dataset``, and no clients.

A plain ``torch.save(model.state_dict())`` file, or a folder of them, is a ``StateDictSource``: the model
comes from ``--model`` (a registered model name or ``package.module:factory``) and the data from ``--dataset``
(a registered data set or ``package.module:factory``); it has no clients, so only the passes that need none
run on it. Its results go to ``analysis/<file stem>/`` next to the files (``file_label``: the whole name where
another state_dict file beside it has the same stem), keyed by the model and data that
produced them (``StateDictSource.inputs``) besides the file's SHA-256 and the settings.

A folder of state_dicts is not a trajectory: each file is labelled by its name (its stem), and has a round only
where its name carries one (``file_round``, ``file_rounds``), never by its position among the files.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from landscape.analyze.model_code import model_code
from landscape.analyze.registry import PASSES, needs_clients
from landscape.analyze.source import Source
from landscape.config.setup import DataSetup
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.rounds import LISTED, Rounds
from landscape.measure.analysis_data import AnalysisData, as_data, check_model_data
from landscape.store.checkpoints import Checkpoint, load_state_dict_file


def model_sha256(factory: Callable, module: nn.Module) -> str:
    """SHA-256 of what a model factory makes the numbers of (``model_code.model_code``): the sources of the
    factory, of the module's classes outside torch and of the user's functions and classes their code reads,
    the library objects they read by name, the values (module constants) they read, and ``repr(module)``."""
    return hashlib.sha256(model_code(factory, module).encode()).hexdigest()


def data_sha256(x: Tensor, y: Tensor) -> str:
    """SHA-256 of the analysis data: for the inputs, then the targets, the dtype and the shape as text and
    the raw bytes in row-major order."""
    h = hashlib.sha256()
    for t in (x, y):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


# The round a state_dict file's name carries: a trailing integer after a round word (round, rnd, r, epoch, ep, step,
# iter) that starts the stem or follows - _ . or a space, with at most one - or _ between (round-3, mlp-r2,
# epoch_10, epoch0, step1000), or a stem of digits only (0050). Other names carry none (resnet50, model-v2, final).
_FILE_ROUND = re.compile(r"(?:^|[-_. ])(?:round|rnd|r|epoch|ep|step|iter)[-_]?(\d+)$|^(\d+)$", re.IGNORECASE)
LISTED_FILES = 12  # the files an error names, at most


def file_round(stem: str) -> int | None:
    """The round a file's name (its stem) carries (``_FILE_ROUND``), or None."""
    match = _FILE_ROUND.search(stem)
    return None if match is None else int(match.group(1) or match.group(2))


def file_rounds(files: list[Path]) -> dict[Path, int]:
    """Each file's round by its name (``file_round``) when every file carries one and no two the same; else {}:
    the files are then labelled and ordered by their names alone."""
    rounds = {f: file_round(f.stem) for f in files}
    values = list(rounds.values())
    return {} if None in values or len(set(values)) < len(values) else rounds  # type: ignore[return-value]


def _client_option(name: str, options: object) -> str | None:
    """``<pass>.<option>=<value>`` of the first option of ``options`` that asks for clients: a client count
    (``clients``) above 0 (0 is all clients, -1 none: on a state_dict, none), client ids (``clients = "3,7"``) or
    a ``client:<i>``; None where none does."""
    if not dataclasses.is_dataclass(options):
        return None
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        count = isinstance(value, int) and not isinstance(value, bool) and value > 0
        ids = isinstance(value, str) and bool(value)
        if (field.name == "clients" and (count or ids)) or (isinstance(value, str) and value.startswith("client:")):
            return f"{name}.{field.name}={value}"
    return None


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
        rounds = file_rounds(files)
        ordered = sorted(files, key=lambda f: (rounds.get(f, 0), f.name))  # by round where named, else by name
        # the keys are the files' places in that order, used only inside the analysis (``where``, ``select``)
        super().__init__(name, None, dict(enumerate(ordered)), analysis_dir, None)
        self.rounds = {key: rounds[f] for key, f in enumerate(ordered) if f in rounds}  # key -> its name's round
        self._labels = {key: file_label(f) for key, f in enumerate(ordered)}  # each folder listed once, not per call
        self.spec = spec
        self._data: dict[str, tuple[Tensor, Tensor]] = {}
        self._bundle = None
        self._module: nn.Module | None = None
        self._inputs: dict | None = None

    def result_dir(self, round: int) -> Path:
        return self.analysis_dir / self.label(round)

    def clients_checkpoint(self, round: int) -> Path:
        return self.analysis_dir / "no-clients"  # never a file: a state_dict has no clients

    def load(self, round: int) -> Checkpoint:
        named = {"round": self.rounds[round]} if round in self.rounds else {}  # never the file's place
        return Checkpoint(self.checkpoints[round], {"model": load_state_dict_file(self.checkpoints[round]), **named})

    def label(self, key: int) -> str:
        """A file's label in tables, records and messages, and its results' folder: ``file_label``."""
        return self._labels[key]

    def where(self, key: int) -> dict:
        """What names a file's results (their JSON, the summary's rows): ``file``, its label, and ``round`` only
        where the files' names carry rounds (``file_rounds``)."""
        return {"file": self.label(key), **({"round": self.rounds[key]} if key in self.rounds else {})}

    def select(self, spec: Rounds | str) -> list[int]:
        """``--checkpoints`` of these files: a ``Rounds`` (``last``: the last by round where their names carry
        rounds, else by name; ``last N``; ``all``; a round or a list of rounds, each a file's name or the round
        its name carries), or, this source's own extension of that grammar, a comma list of the files' labels (or
        names) and rounds (``mlp-r2,10``)."""
        if isinstance(spec, str):
            try:
                spec = Rounds.parse(spec)
            except LandscapeError:
                return self._named(spec)
        if spec.kind != LISTED:  # the keys are the files' places in their order
            if not spec.covered_by(self.checkpoints):
                raise LandscapeError(f"--checkpoints {spec} asks for {spec.count} files; {self._files_text()}")
            return spec.select(self.checkpoints)
        return self._named(str(spec))

    def _named(self, spec: str) -> list[int]:
        """The files a comma list of their labels, names or rounds picks (a digit text is a file's label
        before it is a round: a file named 3.pt among others without rounds)."""
        wanted = [part.strip() for part in spec.split(",") if part.strip()]
        if not wanted:
            raise LandscapeError(f"--checkpoints {spec!r} names no file; {self._files_text()}")
        return list(dict.fromkeys(self._key(part) for part in wanted))

    def _key(self, text: str) -> int:
        names = {name: key for key, path in self.checkpoints.items() for name in (path.stem, path.name)}
        by_round = {r: key for key, r in self.rounds.items()}
        if text in names:
            return names[text]
        if text.isdigit() and int(text) in by_round:
            return by_round[int(text)]
        what = "file or round" if self.rounds else "file"
        raise LandscapeError(f"--checkpoints {text}: {self.name} has no {what} '{text}'; {self._files_text()}")

    def _files_text(self) -> str:
        shown = [self.label(k) + (f" (round {self.rounds[k]})" if k in self.rounds else "")
                 for k in list(self.checkpoints)[:LISTED_FILES]]
        more = f", ... ({len(self.checkpoints)} files)" if len(self.checkpoints) > LISTED_FILES else ""
        names = "names or rounds" if self.rounds else "names"
        return f"its files: {', '.join(shown)}{more} (give last, all, or a comma list of their {names})"

    @property
    def from_factory(self) -> bool:
        """Whether the data comes from a data factory (whatever the split) rather than a registered data set."""
        return ":" in self.spec.dataset

    def data_text(self, split: str) -> str:
        """The analysis data in words: a data factory's data, or the split of the registered data set (all of it:
        a state_dict has no clients)."""
        if self.from_factory:
            return f"data from {self.spec.dataset}"
        return f"the {'test' if split == 'test' else 'training'} set of {self.spec.dataset}"

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
        from landscape.core.imports import call_factory
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
            from landscape.core.imports import load_object

            module = self.build_module()
            x, y = self.analysis_set("train")  # a factory's data: whatever the split
            factory = load_object(self.spec.model, "model factory") if ":" in self.spec.model else None
            self._inputs = {"model": self.spec.model,
                            "model_sha256": model_sha256(factory, module) if factory is not None else None,
                            "dataset": self.spec.dataset,
                            "data_sha256": data_sha256(x, y) if ":" in self.spec.dataset else None}
        return self._inputs

    @property
    def _given(self) -> Path:
        """The path the files were given by: the file, or their folder."""
        return self.checkpoints[0] if len(self.checkpoints) == 1 else self.analysis_dir.parent

    @property
    def _kind(self) -> str:
        return "a plain state_dict" if len(self.checkpoints) == 1 else "a folder of plain state_dicts"

    def check_pass(self, name: str, options: object) -> None:
        """Refused in one line, before anything is computed: a pass that reads clients (``registry.needs_clients``:
        naming the passes that run on a state_dict), an option that asks for clients (``_client_option``: its
        result would be named by clients it never had), and what needs the rounds of a run (a PCA plane of the
        trajectory, a filter-reference of ``round:<r>``): files are not rounds of a run."""
        if needs_clients(name, options):
            what = getattr(options, "described", name)  # options that ask for clients: surface --directions
            usable = [f"{p} ({PASSES.get(p).without_clients})" if PASSES.get(p).without_clients else p
                      for p in PASSES.names() if not needs_clients(p, None)]
            raise LandscapeError(f"{what} needs the clients of a training run, and {self._given} is a plain "
                                 f"state_dict, which has no clients (no client data, no kept client models); the "
                                 f"passes that run on a state_dict: {', '.join(usable)}")
        option = _client_option(name, options)
        if option is not None:
            value = option.partition("=")[2]
            missing = f" (client {value[7:]} does not exist)" if value.startswith("client:") else ""
            raise LandscapeError(f"{option} asks for clients{missing}, and {self._given} is {self._kind}: no "
                                 f"clients (no client data, no kept client models); leave {option.partition('=')[0]} "
                                 "out")
        self._check_rounds_option(options)

    def _check_rounds_option(self, options: object) -> None:
        """A PCA plane of the trajectory or a filter-reference ``round:<r>`` on state_dict files: refused."""
        kind = self._kind
        if getattr(options, "directions", None) == "pca":
            raise LandscapeError(f"surface --directions pca needs the trajectory of a training run (its global model "
                                 f"at successive rounds), and {self._given} is {kind}, not the rounds of a run: "
                                 "record the run with landscape.RunWriter in your training loop, or make a run "
                                 "directory of the files with `landscape import`, and analyse that; or use "
                                 "--directions random")
        reference = str(getattr(options, "reference", ""))
        if reference.startswith("round:"):
            raise LandscapeError(f"surface.reference={reference} names a round of a training run, and {self._given} "
                                 f"is {kind}, which has no rounds: use normalization filter or euclidean")

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
                from landscape.core.imports import call_factory

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


def file_label(path: Path) -> str:
    """A state_dict file's label and results' folder: its name without the suffix (``mine``), or its whole name
    (``mine.pt``) where another state_dict file beside it has the same stem (``mine.pth``), so that two files that
    differ only in suffix never share a folder of results."""
    twins = [p for p in path.parent.glob(f"{glob.escape(path.stem)}.*")
             if p.name != path.name and p.suffix in STATE_DICT_SUFFIXES and p.stem == path.stem and p.is_file()]
    return path.name if twins else path.stem


def state_dict_sources(path: Path, spec: ForeignModel) -> list[Source]:
    """One source of the state_dict file ``path``, or of every state_dict file in the folder ``path``. The
    model and the data are checked here (``StateDictSource.inputs``: both factories imported and called once),
    before anything is looked up as done."""
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if path.is_file():
        source = StateDictSource(file_label(path), [path], spec, path.parent / "analysis")
    else:
        files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in STATE_DICT_SUFFIXES)
        if not files:
            raise LandscapeError(f"{path} holds no state_dict files ({', '.join(STATE_DICT_SUFFIXES)})")
        source = StateDictSource(path.name, files, spec, path / "analysis")
    source.inputs  # noqa: B018 - computed for its checks
    return [source]
