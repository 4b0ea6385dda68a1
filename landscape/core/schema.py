"""One schema loader for every TOML kind (training, analysis, figure and claim recipes, pass and algorithm
options): a frozen dataclass is the schema, pydantic checks a table against it, and a failure is one line.

A schema is a plain ``@dataclass(frozen=True)``: its annotations say the kinds (``int``, ``float``, ``bool``,
``str``, ``tuple[float, ...]``, a nested schema, ``Literal["a", "b"]`` for choices) and ``rule(...)`` (a
``pydantic.Field``) its ranges, with the words a message shows::

    @dataclass(frozen=True)
    class Train:
        lr: Annotated[float, rule(gt=0)] = 0.1
        local_steps: Annotated[int, rule("0: use local_epochs", ge=0)] = 0
        participation: Annotated[float, rule(gt=0, le=1, text="must be in (0, 1]")] = 0.25
        lr_schedule: Literal["constant", "cosine"] = "constant"

``load(Train, {"lr": 0}, "train")`` raises ``LandscapeError("train.lr must be > 0 (got 0)")``. Checks are
strict as TOML is typed: an integer is a number, but ``"0.1"`` is not, ``1`` is not ``true``, ``1.0`` is not an
integer, NaN and infinities are refused; an unknown key is refused naming the keys allowed and the closest one.
TOML arrays become tuples (frozen values). ``choices(Train, "lr_schedule")`` gives the Literal's values (click
choices and the reference docs derive from it); ``read_toml`` reads a file, ``dump_toml`` writes one (tomli-w).
``holds(test)`` beside a ``rule`` checks a value beyond its range (refused with the rule's text); ``check``
checks an instance made directly rather than loaded (from its ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic
import tomli_w
from pydantic import ConfigDict

from landscape.core.errors import LandscapeError, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

T = TypeVar("T")

_CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)


def rule(hint: str = "", *, text: str = "", **constraints: Any) -> Any:
    """A field's range (``gt``, ``ge``, ``lt``, ``le``, ``min_length``, ...) and its words: ``text`` replaces
    the generated rule ("must be in (0, 1]"), ``hint`` is added after it ("must be >= 0 (0: every core)")."""
    return pydantic.Field(description=text or None, title=hint or None, **constraints)


def holds(test: Callable[[Any], bool]) -> Any:
    """A field's check beyond its kind, range and choices, beside its words: in ``Annotated[str, rule(text=
    "must be two different client ids like '3,7'"), holds(is_pair)]`` a value ``test`` finds false is refused
    with the rule's text."""

    def after(value: Any) -> Any:
        if not test(value):
            raise ValueError("refused by the field's check")
        return value

    return pydantic.AfterValidator(after)


@functools.cache
def _model(cls: type) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = pydantic.Field(default_factory=f.default_factory)
        else:
            default = ...
        fields[f.name] = (_nested(hints[f.name]), default)
    return pydantic.create_model(f"{cls.__name__}Schema", __config__=_CONFIG, **fields)


def _nested(annotation: Any) -> Any:
    """A field whose kind is a schema dataclass is checked as that schema (strict mode would want an
    instance)."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _model(annotation)
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return typing.Annotated[(_nested(args[0]), *annotation.__metadata__)]
    if origin is tuple and args and any(dataclasses.is_dataclass(a) for a in args):
        return tuple[tuple(_nested(a) if a is not Ellipsis else a for a in args)]
    return annotation


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _build(cls: type[T], model: pydantic.BaseModel) -> T:
    hints = typing.get_type_hints(cls, include_extras=True)
    values = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        values[name] = _rebuild(hints[name], value)
    return cls(**values)


def _rebuild(annotation: Any, value: Any) -> Any:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(value, pydantic.BaseModel) and dataclasses.is_dataclass(annotation):
        return _build(annotation, value)
    if isinstance(value, tuple) and typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if item is not None and dataclasses.is_dataclass(item):
            return tuple(_rebuild(item, v) for v in value)
    return value


def load(cls: type[T], raw: Any, where: str = "", *, noun: str = "key") -> T:
    """``raw`` (a TOML table) checked against the schema ``cls`` and returned as one: every default filled in,
    arrays as tuples. ``where`` prefixes the keys in messages ('train' -> 'train.lr'; '' for top-level keys),
    ``noun`` names them ('recipe key', 'figure recipe key')."""
    if not isinstance(raw, Mapping):
        raise LandscapeError(f"{where or 'the file'} must be a table (got {shown(repr(raw))})")
    try:
        model = _model(cls).model_validate(_frozen(dict(raw)))
    except pydantic.ValidationError as e:
        raise LandscapeError(_message(cls, e.errors()[0], where, noun)) from None
    try:
        return _build(cls, model)
    except (TypeError, ValueError) as e:  # a schema's own __post_init__ check, e.g. two keys that conflict
        raise LandscapeError(f"{where or 'the file'}: {e}") from None


def check(value: Any, where: str = "", *, noun: str = "key") -> None:
    """A schema instance made directly, not by ``load`` (``AnalysisSettings(seed=-1)`` from a flag), checked
    against its annotations: the one line ``load`` gives, or nothing. Call it from ``__post_init__``."""
    raw = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    raw = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
           for k, v in raw.items()}
    try:
        _model(type(value)).model_validate(_frozen(raw))
    except pydantic.ValidationError as e:
        raise LandscapeError(_message(type(value), e.errors()[0], where, noun)) from None


_KINDS = {
    "int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type": "a string",
    "tuple_type": "a list", "list_type": "a list", "dict_type": "a table", "model_type": "a table",
    "finite_number": "finite", "int_from_float": "an integer",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _field_info(cls: type, loc: tuple) -> tuple[type | None, pydantic.fields.FieldInfo | None]:
    """The schema and field a location names (nested schemas followed), or (None, None)."""
    model: Any = _model(cls)
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)) or part not in model.model_fields:
            return model, None
        info = model.model_fields[part]
        annotation = info.annotation
        args = typing.get_args(annotation)
        model = args[0] if typing.get_origin(annotation) is tuple and args else annotation
    return model, info


def _dotted(where: str, loc: tuple) -> str:
    text = where
    for part in loc:
        text = f"{text}[{part}]" if isinstance(part, int) else (f"{text}.{part}" if text else str(part))
    return text


def _message(cls: type, error: Mapping[str, Any], where: str, noun: str) -> str:
    loc = tuple(p for p in error["loc"] if p not in ("function-after", "function-before"))
    dotted = _dotted(where, loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, _ = _field_info(cls, loc[:-1])
        allowed = list(parent.model_fields) if isinstance(parent, type) and issubclass(parent, pydantic.BaseModel) else []
        owner = _dotted(where, loc[:-1])
        return unknown_key_message(dotted, allowed, f"in [{owner}]" if owner else "top-level", noun)
    if kind == "missing":
        return f"{dotted} is required"
    _, info = _field_info(cls, loc)
    got = f" (got {shown(repr(error.get('input')))})"
    if info is not None and info.description and kind not in _KINDS:
        return f"{dotted} {info.description}{got}"
    hint = f" ({info.title})" if info is not None and info.title else ""
    ctx = error.get("ctx") or {}
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        return f"{dotted} must be {_BOUNDS[kind]} {bound}{hint}{got}"
    if kind == "literal_error":
        options = ", ".join(str(a) for a in _literal_values(info.annotation if info else None)) or ctx.get("expected")
        return f"{dotted} must be one of {options}{got}"
    if kind in ("too_short", "too_long"):
        limit = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        return f"{dotted} must have {'at least' if kind == 'too_short' else 'at most'} {limit} item(s){hint}{got}"
    if kind in _KINDS:
        return f"{dotted} must be {_KINDS[kind]}{got}"
    return f"{dotted}: {error['msg'][:1].lower()}{error['msg'][1:]}{got}"


def _literal_values(annotation: Any) -> tuple:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return ()


def choices(cls: type, name: str) -> tuple:
    """The values a ``Literal`` field of a schema takes (click choices and the reference derive from it)."""
    return _literal_values(typing.get_type_hints(cls, include_extras=True)[name])


def unknown_key_message(dotted: str, allowed: list[str], where: str, noun: str = "recipe key") -> str:
    """The message for an unknown key: the keys allowed ``where`` ('in [train]', 'top-level'), then the closest
    of them (difflib) when one is close."""
    prefix, _, key = dotted.rpartition(".")
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
    return f"unknown {noun} '{shown(dotted)}'; allowed {where}: {', '.join(allowed)}{hint}"


def read_toml(path: str | Path, what: str = "recipe") -> dict:
    """The tables of a TOML file: one line naming the file when it is missing, not a regular file (a folder,
    /dev/zero, a pipe), not text, empty or not TOML. A UTF-8 byte-order mark (some editors write one) is
    skipped. ``what`` names the kind in messages ('recipe', 'figure recipe', 'claim file')."""
    p = Path(path)
    if not p.exists():
        raise LandscapeError(f"{what} file not found: {p}")
    if not p.is_file():
        from landscape.core.reading import special_kind  # torch is imported only for this message

        raise LandscapeError(f"{p} is {special_kind(p) or 'not a regular file'}, not a regular file (a {what} is a "
                             "TOML file)")
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
        raise LandscapeError(f"{p} is empty (no {what} keys)")
    return tables


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_toml(tables: Mapping[str, Any] | Any) -> str:
    """TOML text of plain tables or a schema instance (tuples as arrays; None values, which TOML cannot hold,
    left out), by tomli-w."""
    return tomli_w.dumps(_plain(tables))
