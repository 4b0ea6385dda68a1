"""TOML recipes: the frozen ``Recipe`` settings, read, validated, resolved and written back.

Overrides (``--set key=value``, flags, sweeps) live in ``landscape.config.recipe_overrides``; ``set_key``
(one key of a raw recipe dict) stays here for ``Recipe.with_values``.

A recipe has two top-level keys (``name``, ``seed``) and five tables. Four of them name a registry entry
(``[dataset]``, ``[partition]``, ``[model]``, ``[algorithm]``): their keys are a few common settings plus
the options that entry declares. ``[train]`` holds the round loop's settings. The resolved recipe written
into a run directory holds every key with its value, defaults included.

A resolved recipe is a frozen ``Recipe``: ``recipe.train.lr``, ``recipe.partition.clients``, the entry's own
options in ``recipe.algorithm.options["rho"]``. ``recipe.with_values({"train.rounds": 50})`` gives a new,
validated recipe; ``recipe.to_dict()`` the plain tables that recipe.toml holds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from landscape.config.recipe_sections import (
    SECTIONS,
    TOP_LEVEL,
    AlgorithmSettings,
    DatasetSettings,
    ModelSettings,
    PartitionSettings,
    TrainSettings,
    coerce_value,
    unknown_key_message,
)
from landscape.core.errors import LandscapeError, shown
from landscape.core.registry import Registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _common_fields(section: str) -> dict[str, dataclasses.Field]:
    """The settings every entry of a section has (the entry's own options excluded)."""
    return {f.name: f for f in dataclasses.fields(SECTIONS[section]) if f.name != "options"}


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
            table = {k: getattr(settings, k) for k in _common_fields(section)}
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
        from landscape.train.algorithms import ALGORITHMS

        found["algorithm"] = ALGORITHMS
    return found


# ----------------------------------------------------------------------------------------------------------
# reading and overriding


def read_toml(path: str | Path) -> dict:
    """The tables of a TOML file: one line naming the file when it is missing, not a regular file (a folder,
    /dev/zero, a pipe), not text, empty or not TOML. A UTF-8 byte-order mark (some editors write one) is
    skipped."""
    p = Path(path)
    if not p.exists():
        raise LandscapeError(f"recipe file not found: {p}")
    if not p.is_file():
        raise LandscapeError(f"{p} is not a regular file (a recipe is a TOML file)")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise LandscapeError(f"{p}: not a text (TOML) file") from None
    except OSError as e:
        raise LandscapeError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LandscapeError(f"{p}: not valid TOML ({shown(str(e), 200)})") from None
    if not text.strip():
        raise LandscapeError(f"{p} is empty (no recipe keys)")
    return tables


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
# validation


def _resolve_section(section: str, given: dict, registry: Registry | None, check_options: bool = True) -> dict:
    common_fields = _common_fields(section)
    defaults = {f.name: f.default for f in common_fields.values()}
    plain = {k: v for k, v in given.items() if not isinstance(v, dict)}
    per_entry = {k: v for k, v in given.items() if isinstance(v, dict)}  # [section.<entry name>] tables
    name = plain.get("name", defaults.get("name"))
    if not check_options:  # a recorded recipe read without this section's registry: its values as written
        if per_entry or not isinstance(name, str):
            raise LandscapeError(f"[{section}] of a recorded recipe must hold plain values and a name")
        return {**plain, "name": name}
    for key in per_entry:
        if key in common_fields:
            raise LandscapeError(f"recipe key '{section}.{key}' is a value, not a table: set "
                                 f"{section}.{key}=VALUE")
    if registry is None:
        if per_entry:  # [train] has no entries: a table under it is an unknown key
            raise LandscapeError(unknown_key_message(f"{section}.{next(iter(per_entry))}", list(common_fields),
                                              f"in [{section}]"))
        return _resolve_values(section, plain, common_fields, {}, None)
    if not isinstance(name, str):
        raise LandscapeError(f"{section}.name must be a string (got {name!r})")
    for other, values in per_entry.items():
        # Options for an entry this run may not use (sweeps): still checked, so typos are caught.
        entry = registry.get(other)
        _resolve_values(f"{section}.{other}", values, {}, entry.option_defaults(), entry)
    entry = registry.get(name)
    merged = {**per_entry.get(name, {}), **plain}  # the plain [section] keys win over [section.<name>]
    return _resolve_values(section, merged, common_fields, entry.option_defaults(), entry)


def _resolve_values(where: str, given: dict, common_fields: dict, option_defaults: dict, entry) -> dict:
    defaults = {name: f.default for name, f in common_fields.items()}
    allowed = list(common_fields) + [k for k in option_defaults if k not in common_fields]
    for key in given:
        if key not in allowed:
            owner = f"[{where}] with {where}.name = '{entry.name}'" if entry is not None and common_fields else f"[{where}]"
            raise LandscapeError(unknown_key_message(f"{where}.{key}", allowed, f"in {owner}"))
    out: dict[str, Any] = {}
    for key in allowed:
        default = defaults[key] if key in common_fields else option_defaults[key]
        value = coerce_value(f"{where}.{key}", default, given[key]) if key in given else default
        meta = common_fields[key].metadata if key in common_fields else {}
        if "check" in meta and not meta["check"](value):
            raise LandscapeError(f"{where}.{key} {meta['rule']} (got {shown(repr(value))})")
        out[key] = list(value) if isinstance(value, tuple) else value
    if entry is not None:
        # The entry's own options dataclass may check its values (e.g. rho >= 0) in __post_init__.
        try:
            entry.make_options({k: out[k] for k in option_defaults})
        except (TypeError, ValueError) as e:
            raise LandscapeError(f"{where} '{entry.name}': {e}") from None
    return out


def resolve(raw: dict, *, algorithms: bool = True, recorded: bool = False, trust_imports: bool | None = None,
            defer: bool = False, origin: str = "the recipe") -> Recipe:
    """Validate a raw recipe dict and return it with every default written out.

    ``algorithms=False`` reads the ``[algorithm]`` table as written, without loading the algorithms (analysis
    of a recorded, already resolved recipe needs the data and the model, never the training rule).

    ``imports`` run code. The user's own recipe (``recorded=False``) has them imported (the current folder
    searched too), each newly imported module named on stderr. A recorded recipe (``recorded=True``: a run's
    recipe.toml, a checkpoint's, called ``origin`` in messages) has them imported only when ``trust_imports``
    (None: ``landscape.config.imports.imports_trusted()``, the CLI's --trust-imports), without searching the current
    folder. Untrusted, nothing is imported: each registry section is checked against the entries registered
    now (built-in ones, and those of modules already imported in this process); a section naming an entry no
    registry holds is refused in one line naming the modules and --trust-imports, or with ``defer`` read as
    written, the refusal kept in ``Recipe.unbuildable`` for the moment it must be built."""
    if not isinstance(raw, dict):
        raise LandscapeError("a recipe must be a TOML table")
    allowed = list(TOP_LEVEL) + list(SECTIONS)
    for key in raw:
        if key not in allowed:
            raise LandscapeError(unknown_key_message(key, allowed, "top-level keys"))
    regs = registries(algorithms)
    out: dict[str, Any] = {}
    missing: list[str] = []  # entries of a recorded recipe that only its not-imported modules can provide
    for key, default in TOP_LEVEL.items():
        out[key] = coerce_value(key, default, raw[key]) if key in raw else default
    check_name(out["name"])
    if not all(isinstance(m, str) for m in out["imports"]):
        raise LandscapeError(f"imports must be a list of module names (got {out['imports']!r})")
    from landscape.config.imports import import_recipe_modules, imports_trusted, untrusted

    trusted = not recorded or (imports_trusted() if trust_imports is None else trust_imports)
    if trusted:
        import_recipe_modules(out["imports"], search_cwd=not recorded)
    unimported = tuple(m for m in out["imports"] if m not in sys.modules)
    if not 0 <= out["seed"] < 2**32:  # data set splits and partitions take 32-bit seeds
        raise LandscapeError(f"seed must be in 0..{2**32 - 1} (got {out['seed']})")
    for section in SECTIONS:
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise LandscapeError(f"recipe key '{section}' must be a table ([{section}])")
        checked = section != "algorithm" or algorithms
        name = given.get("name") if isinstance(given.get("name"), str) else None
        if checked and unimported and section in regs and name is not None and name not in regs[section]:
            missing.append(f"{section} '{name}'")  # only its imports can provide it: read as written
            checked = False
        out[section] = _resolve_section(section, given, regs.get(section), check_options=checked)
    if missing and not defer:
        raise LandscapeError(untrusted(origin, unimported, missing))
    train = out["train"]
    if train["precision"] == "bf16" and train["dtype"] != "float32":
        raise LandscapeError(f"train.precision = \"bf16\" autocasts a float32 model; it cannot be combined with "
                             f"train.dtype = \"{train['dtype']}\" (use float32, or precision = \"float32\")")
    sections = {}
    for section, values in out.items():
        if section not in SECTIONS:
            continue
        common = _common_fields(section)
        fields = {k: _frozen(v) for k, v in values.items() if k in common}
        if "options" in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            options = {k: _frozen(v) for k, v in values.items() if k not in common}
            fields["options"] = MappingProxyType(options)
        sections[section] = SECTIONS[section](**fields)
    unbuildable = untrusted(origin, unimported, missing) if missing else ""
    return Recipe(name=out["name"], seed=out["seed"], imports=tuple(out["imports"]), unimported=unimported,
                  unbuildable=unbuildable, **sections)


def read_recipe(path: str | Path, *, algorithms: bool = True, trust_imports: bool | None = None,
                defer: bool = False) -> Recipe:
    """A recorded recipe file (a run's recipe.toml), resolved; its ``imports`` are imported only when trusted
    (``trust_imports``; None: the CLI's --trust-imports): see ``resolve(recorded=True)``."""
    return resolve(read_toml(path), algorithms=algorithms, recorded=True, trust_imports=trust_imports,
                   defer=defer, origin=str(path))


# ----------------------------------------------------------------------------------------------------------
# writing


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(recipe: Recipe | dict) -> str:
    """TOML text of a recipe (or of plain tables): top-level keys first, then one table per section."""
    if isinstance(recipe, Recipe):
        recipe = recipe.to_dict()
    lines = [f"{k} = {_toml_value(v)}" for k, v in recipe.items() if not isinstance(v, dict)]
    for k, v in recipe.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def difference(recorded: str, recipe: Recipe, ignore: frozenset[str] = frozenset()) -> str | None:
    """The first key in which a recorded recipe (TOML text, e.g. a checkpoint's) differs from ``recipe``,
    ignoring the keys in ``ignore``, as 'model.width is 32 there, 8 in recipe.toml'; None when they agree."""

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
            there = "not set" if a is missing else json.dumps(a)
            here = "not set" if b is missing else json.dumps(b)
            return f"{key} is {there} there, {here} in recipe.toml"
    return None


# A run name becomes one folder under --out: a plain name, never a path.
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_NAME = 200  # a folder name may hold 255 bytes on common file systems


def check_name(name: str) -> None:
    """The recipe's ``name``: empty (a systematic name is used) or a plain folder name."""
    if name and (not _PLAIN_NAME.match(name) or name in (".", "..") or len(name) > MAX_NAME):
        raise LandscapeError(f"name must be a plain folder name (letters, digits, '.', '_', '-'; no '/'; at most "
                             f"{MAX_NAME} characters), got {name!r}")


def run_name(recipe: Recipe) -> str:
    """A systematic run name: dataset-algorithm-partition-model-clients-seed."""
    part = recipe.partition
    pname = {"dirichlet": "dir", "dirichlet-client": "dirc", "pathological": "path"}.get(part.name, part.name)
    if "alpha" in part.options:
        pname += f"{part.options['alpha']:g}"
    if "classes_per_client" in part.options:
        pname += f"{part.options['classes_per_client']}"
    return "-".join([recipe.dataset.name, recipe.algorithm.name, pname, recipe.model.name, f"c{part.clients}",
                     f"s{recipe.seed}"])
