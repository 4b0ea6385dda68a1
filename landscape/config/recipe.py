"""TOML recipes: the frozen ``Recipe`` settings, read, validated, resolved and written back.

Overrides (``--set key=value``, flags, sweeps) live in ``landscape.config.overrides``; ``set_key``
(one key of a raw recipe dict) stays here for ``Recipe.with_values``.

A recipe has three top-level keys (``name``, ``seed``, ``imports``) and five tables. Four of them name a registry entry
(``[dataset]``, ``[partition]``, ``[model]``, ``[algorithm]``): their keys are a few common settings plus
the options that entry declares. ``[train]`` holds the round loop's settings. The resolved recipe written
into a run directory holds every key with its value, defaults included. Each table is checked by its schema
(``landscape.core.schema``): the common settings by the section's dataclass (``recipe_sections``), an entry's
own options by the entry's options dataclass; kinds, ranges and choices are in their annotations.

A resolved recipe is a frozen ``Recipe``: ``recipe.train.lr``, ``recipe.partition.clients``, the entry's own
options in ``recipe.algorithm.options["rho"]``. ``recipe.with_values({"train.rounds": 50})`` gives a new,
validated recipe; ``recipe.to_dict()`` the plain tables that recipe.toml holds.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.config.algorithms import ALGORITHMS
from landscape.config.sections import (
    ENTRY_SECTIONS,
    SECTIONS,
    TOP_LEVEL,
    AlgorithmSettings,
    DatasetSettings,
    ModelSettings,
    PartitionSettings,
    TopLevelSettings,
    TrainSettings,
    common_fields,
    load_settings,
    with_options,
)
from landscape.core import schema
from landscape.core.errors import LandscapeError, shown
from landscape.core.registry import Entry, Registry
from landscape.core.schema import unknown_key_message

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Recipe:
    """A resolved, validated recipe (every default written out). Frozen: derive another with ``with_values``."""

    name: str
    seed: int
    dataset: DatasetSettings
    partition: PartitionSettings
    model: ModelSettings
    algorithm: AlgorithmSettings
    train: TrainSettings
    imports: tuple[str, ...] = ()
    # A recorded recipe read without trusting its imports: the modules of ``imports`` that were not imported
    # (none of their code ran), and, when one of its entries only they provide (read as written), the one-line
    # refusal of building it (``require_entries``). Not part of what the recipe is: not compared, not written.
    unimported: tuple[str, ...] = field(default=(), compare=False, repr=False)
    unbuildable: str = field(default="", compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The plain tables of recipe.toml: ``{"name": ..., "seed": ..., "train": {...}, ...}`` (lists, not
        tuples; an entry's options after its common settings; ``imports`` only when there are some)."""
        out: dict[str, Any] = {"name": self.name, "seed": self.seed}
        if self.imports:
            out["imports"] = list(self.imports)
        for section in SECTIONS:
            settings = getattr(self, section)
            table = {k: getattr(settings, k) for k in common_fields(section)}
            table.update(getattr(settings, "options", {}))
            out[section] = {k: list(v) if isinstance(v, tuple) else v for k, v in table.items()}
        return out

    def get(self, dotted: str) -> Any:
        """The value of ``section.key`` (an entry's option included) or a top-level key; KeyError if none."""
        table: Any = self.to_dict()
        for part in dotted.split("."):
            table = table[part]
        return table

    def with_values(self, values: Mapping[str, Any]) -> Recipe:
        """A new recipe with ``section.key`` values replaced, validated again (a recorded recipe read without
        trusting its imports stays so: they are not imported now either)."""
        raw = self.to_dict()
        for key, value in values.items():
            set_key(raw, key, value)
        if self.unimported:
            return resolve(raw, recorded=True, trust_imports=False, defer=True, origin="this recipe")
        return resolve(raw)

    def require_entries(self) -> None:
        """Refuse (one line naming the modules and --trust-imports) to build a recorded recipe whose model, data
        set, partition or algorithm only its not-imported ``imports`` provide, unless they are imported now."""
        if self.unbuildable and any(m not in sys.modules for m in self.unimported):
            raise LandscapeError(self.unbuildable)


def registries(algorithms: bool = True) -> dict[str, Registry]:
    """The registries whose entries a recipe names (without the algorithms' when ``algorithms`` is false)."""
    # Imported here so that the recipe module stays importable without pulling in torch models at import.
    from landscape.data.datasets import DATASETS
    from landscape.data.partitions import PARTITIONS
    from landscape.models import MODELS

    found = {"dataset": DATASETS, "partition": PARTITIONS, "model": MODELS}
    if algorithms:
        found["algorithm"] = ALGORITHMS
    return found


# ----------------------------------------------------------------------------------------------------------
# reading and overriding


# A key of each table that every recipe has, with a value it takes: what ``--set train=1`` is told to set.
TABLE_EXAMPLES = {"dataset": "dataset.name=mnist1d", "partition": "partition.clients=10",
                  "model": "model.name=mlp", "algorithm": "algorithm.name=fedsam", "train": "train.lr=0.05"}


def set_key(raw: dict, dotted: str, value: Any) -> None:
    """Set ``section.key``, ``section.<entry name>.key`` or a top-level key in a raw recipe dict."""
    parts = dotted.split(".")
    if len(parts) > 3 or not all(parts):
        raise LandscapeError(f"recipe key '{shown(dotted)}' must be 'key', 'section.key' or 'section.<name>.key'")
    if len(parts) == 1 and parts[0] in SECTIONS:
        raise LandscapeError(f"recipe key '{dotted}' is a table ([{dotted}]): set one of its keys, e.g. "
                             f"{TABLE_EXAMPLES[dotted]}")
    if len(parts) > 1 and parts[0] in TOP_LEVEL:
        raise LandscapeError(f"recipe key '{parts[0]}' is a value, not a table: set {parts[0]}=VALUE")
    table = raw
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise LandscapeError(f"recipe key '{shown(part)}' in '{shown(dotted)}' must be a table")
    table[parts[-1]] = value


# ----------------------------------------------------------------------------------------------------------
# validation: every table by its schema (the section's settings dataclass; an entry's options by its own)


def _top_level(raw: dict) -> TopLevelSettings:
    allowed = list(TOP_LEVEL) + list(SECTIONS)
    for key in raw:
        if key not in allowed:
            raise LandscapeError(unknown_key_message(key, allowed, "top-level keys", "recipe key"))
    top = load_settings(TopLevelSettings, {k: raw[k] for k in TOP_LEVEL if k in raw}, "")
    check_name(top.name)
    return top


def _import_modules(modules: tuple[str, ...], recorded: bool, trust_imports: bool | None) -> tuple[str, ...]:
    """Import a recipe's ``imports`` when they are trusted (see ``resolve``); the modules left not imported."""
    from landscape.core.imports import import_recipe_modules, imports_trusted

    if not recorded or (imports_trusted() if trust_imports is None else trust_imports):
        import_recipe_modules(modules, search_cwd=not recorded)
    return tuple(m for m in modules if m not in sys.modules)


# Entry options that name a function of the user's own (package.module:function): its module is imported as the
# recipe's ``imports`` are (a recorded recipe's only when trusted).
FACTORY_OPTIONS = {("model", "factory"): ("factory",), ("dataset", "factory"): ("train", "test")}


def _factories(raw: dict) -> dict[str, str]:
    """The module of each function a raw recipe's entries name ({module: "model factory 'pkg.mod:make'"})."""
    found: dict[str, str] = {}
    for (section, entry), keys in FACTORY_OPTIONS.items():
        table = raw.get(section)
        if not isinstance(table, dict) or table.get("name") != entry:
            continue
        for key in keys:
            spec = table.get(key)
            if isinstance(spec, str) and spec.count(":") == 1 and spec.split(":")[0]:
                found.setdefault(spec.split(":")[0], f"{section} {key} '{spec}'")
    return found


def recipe_modules(raw: Any) -> tuple[str, ...]:
    """The modules a raw recipe imports when resolved as the user's own: its ``imports`` (the names given as
    strings), then the modules of the functions its entries name (a model or data factory)."""
    if not isinstance(raw, dict):
        return ()
    given = raw.get("imports", [])
    named = tuple(m for m in given if isinstance(m, str)) if isinstance(given, list) else ()
    return named + tuple(m for m in _factories(raw) if m not in named)


def _table(raw: dict, section: str) -> dict:
    given = raw.get(section, {})
    if not isinstance(given, dict):
        raise LandscapeError(f"recipe key '{section}' must be a table ([{section}])")
    for key, value in given.items():
        if isinstance(value, dict) and key in common_fields(section):
            raise LandscapeError(f"recipe key '{section}.{key}' is a value, not a table: set "
                                 f"{section}.{key}=VALUE")
    return given


def _entry_options(entry: Entry, values: dict, where: str, common: tuple[str, ...] = ()) -> dict[str, Any]:
    """An entry's own options from the values given (checked by its options dataclass: kinds, ranges, choices
    and its checks across keys), every default written out, in declaration order. ``common``: the section's
    settings, also allowed in the table (not in a ``[section.<entry>]`` one)."""
    names = list(entry.option_defaults())
    allowed = list(common) + [k for k in names if k not in common]
    for key in values:
        if key not in allowed:
            owner = f"[{where}] with {where}.name = '{entry.name}'" if common else f"[{where}]"
            raise LandscapeError(unknown_key_message(f"{where}.{key}", allowed, f"in {owner}", "recipe key"))
    options = entry.make_options(values, where, noun="recipe key")
    return {k: _frozen(getattr(options, k)) for k in names}


def _entry_section(section: str, given: dict, registry: Registry | None) -> Any:
    """An entry table (``[model]``, ...): its common settings, then the options of the entry it names. Without
    its registry (a recorded recipe read as written) the options are kept as written."""
    common = common_fields(section)
    plain = {k: v for k, v in given.items() if not isinstance(v, dict)}
    per_entry = {k: v for k, v in given.items() if isinstance(v, dict)}  # [section.<entry name>] tables
    settings = load_settings(SECTIONS[section], {k: v for k, v in plain.items() if k in common}, section)
    written = {k: _frozen(v) for k, v in plain.items() if k not in common}
    if registry is None:
        if per_entry:
            raise LandscapeError(f"[{section}] of a recorded recipe must hold plain values and a name")
        return with_options(settings, written)
    for other, values in per_entry.items():
        # Options for an entry this run may not use (sweeps): still checked, so typos are caught.
        _entry_options(registry.get(other), values, f"{section}.{other}")
    entry = registry.get(settings.name)
    options = {**per_entry.get(entry.name, {}), **written}  # the plain [section] keys win over [section.<name>]
    return with_options(settings, _entry_options(entry, options, section, common))


def _registry(section: str, given: dict, regs: dict[str, Registry], unimported: tuple[str, ...],
              missing: list[str]) -> Registry | None:
    """The registry a section is checked against: None for [algorithm] read without the algorithms, and for an
    entry that only the recipe's not-imported modules can provide (read as written; noted in ``missing``)."""
    name = given.get("name")
    registry = regs.get(section)
    if registry is not None and unimported and isinstance(name, str) and name not in registry:
        missing.append(f"{section} '{name}'")
        return None
    return registry


def _check_precision(train: TrainSettings) -> None:
    if train.precision == "bf16" and train.dtype != "float32":
        raise LandscapeError(f"train.precision = \"bf16\" autocasts a float32 model; it cannot be combined with "
                             f"train.dtype = \"{train.dtype}\" (use float32, or precision = \"float32\")")


def resolve(raw: dict, *, algorithms: bool = True, recorded: bool = False, trust_imports: bool | None = None,
            defer: bool = False, origin: str = "the recipe") -> Recipe:
    """Validate a raw recipe dict and return it with every default written out.

    ``algorithms=False`` reads the ``[algorithm]`` table as written, without loading the algorithms (analysis
    of a recorded, already resolved recipe needs the data and the model, never the training rule).

    ``imports`` run code. The user's own recipe (``recorded=False``) has them imported (the current folder
    searched too), each newly imported module named on stderr. A recorded recipe (``recorded=True``: a run's
    recipe.toml, a checkpoint's, called ``origin`` in messages) has them imported only when ``trust_imports``
    (None: ``landscape.core.imports.imports_trusted()``, the CLI's --trust-imports), without searching the current
    folder. Untrusted, nothing is imported: each registry section is checked against the entries registered
    now (built-in ones, and those of modules already imported in this process); a section naming an entry no
    registry holds is refused in one line naming the modules and --trust-imports, or with ``defer`` read as
    written, the refusal kept in ``Recipe.unbuildable`` for the moment it must be built."""
    from landscape.core.imports import untrusted

    if not isinstance(raw, dict):
        raise LandscapeError("a recipe must be a TOML table")
    top = _top_level(raw)
    regs = registries(algorithms)
    factories = _factories(raw)
    unimported = _import_modules(top.imports + tuple(m for m in factories if m not in top.imports), recorded,
                                 trust_imports)
    # entries of a recorded recipe that only its not-imported modules can provide
    missing: list[str] = [what for module, what in factories.items() if module in unimported]
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        given = _table(raw, section)
        if section in ENTRY_SECTIONS:
            registry = _registry(section, given, regs, unimported, missing)
            sections[section] = _entry_section(section, given, registry)
        else:
            sections[section] = load_settings(SECTIONS[section], given, section)
    unbuildable = untrusted(origin, unimported, missing) if missing else ""
    if missing and not defer:
        raise LandscapeError(unbuildable)
    _check_precision(sections["train"])
    return Recipe(name=top.name, seed=top.seed, imports=top.imports, unimported=unimported,
                  unbuildable=unbuildable, **sections)


def read_recipe(path: str | Path, *, algorithms: bool = True, trust_imports: bool | None = None,
                defer: bool = False) -> Recipe:
    """A recorded recipe file (a run's recipe.toml), resolved; its ``imports`` are imported only when trusted
    (``trust_imports``; None: the CLI's --trust-imports): see ``resolve(recorded=True)``."""
    return resolve(schema.read_toml(path, "recipe"), algorithms=algorithms, recorded=True,
                   trust_imports=trust_imports, defer=defer, origin=str(path))


# ----------------------------------------------------------------------------------------------------------
# writing


def _refuse_none(value: Any, where: str = "") -> None:
    """TOML has no null: a None anywhere is a TypeError (as tomli-w's for a value it cannot write)."""
    if value is None:
        raise TypeError(f"cannot write None to TOML{f' ({where})' if where else ''}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _refuse_none(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _refuse_none(v, where)


def to_toml(recipe: Recipe | Mapping[str, Any]) -> str:
    """TOML text of a recipe (or of plain tables), by tomli-w (``schema.dump_toml``): top-level keys first, then
    one table per section. A value TOML cannot hold (None, an object) is a TypeError."""
    tables = recipe.to_dict() if isinstance(recipe, Recipe) else recipe
    _refuse_none(tables)
    return schema.dump_toml(tables)


def toml_value(value: Any) -> str:
    """One value as TOML on one line (arrays inline: ``[200, 200]``), as ``landscape list`` prints a default to
    paste; a TypeError for what TOML cannot hold (None, a table)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None or isinstance(value, Mapping):
        raise TypeError(f"no one-line TOML form for {type(value).__name__}")
    return schema.dump_toml({"v": value}).removeprefix("v = ").rstrip("\n")


# Recipe keys that change where a run reads its data and computes, never its files (nor its numbers, but for
# the last bits: see train.threads; train.vectorize, train.memory_format: equal to float tolerance).
PLACE_KEYS = frozenset({"name", "train.device", "train.threads", "train.vectorize", "train.memory_format",
                        "dataset.root", "dataset.download"})

# Recipe keys that may differ between a checkpoint and the run it continues (a resume, and the recipe readers
# take from the checkpoints: ``store.recorded``): they change where and how often things are written, how long
# the run is (--rounds), or where and how the same round is computed (device, compile, threads, vectorize,
# memory_format: the last bits may differ; a resume with another thread count warns), never the rule of a round.
RESUME_FREE_KEYS = frozenset({"name", "train.rounds", "train.device", "train.compile", "train.checkpoint_every",
                              "train.eval_every", "train.keep_clients", "train.threads", "train.vectorize",
                              "train.memory_format", "dataset.root", "dataset.download", "train.log"})


def difference(recorded: str, recipe: Recipe | Mapping[str, Any], ignore: frozenset[str] = frozenset(), *, there: str = "there",
               here: str = "in recipe.toml") -> str | None:
    """The first key in which a recorded recipe (TOML text, e.g. a checkpoint's) differs from ``recipe`` (a
    ``Recipe``, or a recipe's tables as read: recipe.toml's), ignoring the keys in ``ignore``, as 'model.width is 32 there, 8 in recipe.toml' (``there`` and ``here`` name
    the two: 'is 32 in its checkpoints, 8 in recipe.toml'); None when they agree."""

    def flat(table: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in table.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    try:
        theirs = flat(tomllib.loads(recorded))
    except (tomllib.TOMLDecodeError, TypeError):
        return "its recorded recipe is unreadable"
    ours = flat(tomllib.loads(to_toml(recipe)))
    missing = object()
    for key in list(ours) + [k for k in theirs if k not in ours]:
        if key in ignore:
            continue
        a, b = theirs.get(key, missing), ours.get(key, missing)
        if a != b:
            theirs_shown = "not set" if a is missing else json.dumps(a)
            ours_shown = "not set" if b is missing else json.dumps(b)
            return f"{key} is {theirs_shown} {there}, {ours_shown} {here}"
    return None


# A run name becomes one folder under --out: a plain name, never a path.
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME = 200  # a folder name may hold 255 bytes on common file systems


def check_name(name: str, what: str = "name") -> None:
    """The recipe's ``name`` (or another run name, ``what`` in the message): empty (a systematic name is used)
    or a plain folder name."""
    if name and (not _PLAIN_NAME.match(name) or name in (".", "..") or len(name) > MAX_NAME):
        raise LandscapeError(f"{what} must be a plain folder name (letters, digits, '.', '_', '-'; no '/'; at most "
                             f"{MAX_NAME} characters), got {name!r}")


def run_name(recipe: Recipe) -> str:
    """A systematic run name: dataset-algorithm-partition-model-clients-seed."""
    part = recipe.partition
    pname = {"dirichlet": "dir", "dirichlet-client": "dirc", "dirichlet-client-reuse": "dirr",
             "pathological": "path"}.get(part.name, part.name)
    if "alpha" in part.options:
        pname += f"{part.options['alpha']:g}"
    if "classes_per_client" in part.options:
        pname += f"{part.options['classes_per_client']}"
    return "-".join([recipe.dataset.name, recipe.algorithm.name, pname, recipe.model.name, f"c{part.clients}",
                     f"s{recipe.seed}"])
