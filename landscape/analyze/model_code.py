"""The code a model's numbers come from, as text to hash (``model_code``): what ``model_sha256`` keys a plain
state_dict's results by, so that an edit to any code or value ``forward`` runs makes them computed again.

Starting from the model factory and the methods of each class outside torch among the module's submodules,
``model_code`` follows every global name their code reads (``co_names`` of the code and of the functions and
classes it defines inside), their default arguments and the values their closures hold:

- a function or class of the user's own code (its module's top-level package is the factory's, or a class's of
  the model) contributes its source and is followed in turn (a helper that calls another helper, a module-level
  function ``forward`` calls);
- a function, class or module of a library (torch, numpy, the standard library, any other package) contributes
  its qualified name only (``act = torch.relu`` edited to ``torch.tanh`` changes the text; torch's own source
  is the installed version's, and its version is not part of the key);
- a value (a number, a string, a tuple, a tensor, an array, a list or a dict) contributes its ``repr``, for a
  tensor or array its dtype, shape and bytes (a module constant ``SCALE = 1.0`` edited to ``2.0`` changes it);
  other objects contribute their type's qualified name.

Names are resolved in the defining module's globals; a name also met as an attribute (``x.view``) that happens to
name a global is included too, which only makes the key stricter. What the code reads through other ways
(``getattr`` with a computed name, a file, an environment variable) is not seen.
"""

from __future__ import annotations

import hashlib
import inspect
import types
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

_VALUES = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))
_LISTED = 10_000  # a list, tuple or dict longer than this contributes its length and type, not its repr


def _source_text(obj: object) -> str:
    """``inspect.getsource(obj)``; "" where there is none (a builtin, code typed at a prompt)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _top(module_name: str | None) -> str:
    return (module_name or "").split(".")[0]


def _qualified(obj: object) -> str:
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "")
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}"


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code objects it defines inside (nested functions, comprehensions, lambdas, classes)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _value_text(value: object) -> str:
    """A value's text, the same in every process: a tensor's or array's dtype, shape and bytes; a container's
    items by this rule (bounded); a number's or string's ``repr``; anything else its qualified name (never a
    ``repr`` that holds an address)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() and t.device.type != "meta" else b""
        return f"tensor {t.dtype}{tuple(t.shape)} {hashlib.sha256(data).hexdigest()}"
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        data = array.tobytes() if array.dtype != object else repr(array.tolist()).encode()
        return f"array {array.dtype}{array.shape} {hashlib.sha256(data).hexdigest()}"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        if len(value) > _LISTED:
            return f"{type(value).__name__} of {len(value)}"
        items = (f"{_value_text(k)}: {_value_text(v)}" for k, v in value.items()) if isinstance(value, dict) else \
            sorted(map(_value_text, value)) if isinstance(value, (set, frozenset)) else map(_value_text, value)
        return f"{type(value).__name__}({', '.join(items)})"
    if isinstance(value, _VALUES):
        return repr(value)
    return _qualified(value) if callable(value) else f"object {_qualified(type(value))}"


def _wrapped(member: staticmethod | classmethod | property) -> list[Callable]:
    """The functions a class member wraps: a static or class method's function, a property's accessors."""
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if f is not None]
    return [member.__func__]


class _Collector:
    """Walks the code reachable from a model factory and classes (see the module docstring)."""

    def __init__(self, own: set[str]) -> None:
        self.own = own  # the top-level packages of the user's code
        self.seen: set[int] = set()
        self.parts: list[str] = []

    def is_own(self, obj: object) -> bool:
        module = getattr(obj, "__module__", None)
        return bool(module) and _top(module) in self.own and _top(module) != "torch"

    def visit(self, obj: object) -> None:
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod, property)):
            for inner in _wrapped(obj):
                self.visit(inner)
        elif isinstance(obj, types.ModuleType):
            self.parts.append(f"module {obj.__name__}")
        elif isinstance(obj, (types.FunctionType, type)) and self.is_own(obj):
            self.parts.append(_source_text(obj) or _qualified(obj))
            if isinstance(obj, type):
                self._class(obj)
            else:
                self._function(obj)
        elif isinstance(obj, nn.Module):  # a layer held as a global (ACT = nn.Tanh()): its settings, its class
            self.parts.append(repr(obj))
            self.visit(type(obj))
        elif callable(obj) and not isinstance(obj, (torch.Tensor, np.ndarray)):
            self.parts.append(_qualified(obj))  # a library's function, class or builtin: its name
        else:
            self._value(obj)

    def _value(self, obj: object) -> None:
        if not isinstance(obj, (*_VALUES, list, tuple, dict, set, frozenset, torch.Tensor, np.ndarray)):
            self.parts.append(f"object {_qualified(type(obj))}")
            return
        self.parts.append(_value_text(obj))
        if isinstance(obj, (list, tuple, dict)) and len(obj) <= _LISTED:
            for item in obj.values() if isinstance(obj, dict) else obj:
                if not isinstance(item, _VALUES):
                    self.visit(item)  # functions held in a table: ACTIVATIONS = {"tanh": squash}

    def _class(self, cls: type) -> None:
        for base in cls.__mro__[1:]:
            if self.is_own(base):
                self.visit(base)
        for member in vars(cls).values():
            if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                self.visit(member)

    def _function(self, function: types.FunctionType) -> None:
        names = {name for code in _codes(function.__code__) for name in code.co_names}
        scope = function.__globals__
        for name in sorted(names):
            if name in scope:
                self.parts.append(f"global {name}")
                self.visit(scope[name])
        for value in (*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()):
            self.visit(value)
        for cell in function.__closure__ or ():
            try:
                self.visit(cell.cell_contents)
            except ValueError:  # an empty cell (a name assigned later)
                continue


def model_code(factory: Callable, module: nn.Module) -> str:
    """The text ``model_sha256`` hashes for a factory and the module it returned: the sources and values
    reachable from the factory and the methods of the module's classes outside torch (module docstring),
    then ``repr(module)``, joined by NUL bytes."""
    classes = [c for c in dict.fromkeys(type(m) for m in module.modules()) if _top(c.__module__) != "torch"]
    own = {_top(getattr(factory, "__module__", None))} | {_top(c.__module__) for c in classes}
    collector = _Collector(own - {""})
    collector.parts.append(_source_text(factory))
    if isinstance(factory, types.FunctionType):
        collector.seen.add(id(factory))
        collector._function(factory)
    else:
        collector.visit(factory)
    for cls in classes:
        collector.visit(cls)
    return "\0".join([*collector.parts, repr(module)])
