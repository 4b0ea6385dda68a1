"""The registry of analysis passes: a pass is one function ``(CheckpointContext, options) -> PassOutput``,
registered by name with everything else there is to know about it (``PassInfo``): the dataclass of its
options, whether it runs only when named (opt-in), what it needs of a run (``CLIENTS``, ``KEPT_CLIENTS``),
whether its work is split inside it across ranks, its cost model (``Cost`` from its options: the dry-run's
estimate) and the summary quantities compare, report and claims read of its results (``Quantity``).

Pass functions live in ``passes.py`` and ``surface.py`` (``catalog.py`` imports them all); ``scheduler.py``
runs them over checkpoints; ``results.py`` writes what they return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from landscape.core.registry import Registry


@dataclass
class PassOutput:
    scalars: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)  # the few numbers shown in the final table


PassFn = Callable[[Any, Any], PassOutput]  # (CheckpointContext, the pass's options) -> PassOutput

# What a pass may need of a training run besides its checkpoint: its clients (their data or their kept
# models; a plain state_dict has none) and the round's kept client models (train.keep_clients).
CLIENTS = "clients"
KEPT_CLIENTS = "kept clients"


@dataclass(frozen=True)
class Cost:
    """What a job of a pass costs, estimated from its options: Hessian-vector products, and its other work in
    full-data gradient equivalents (per-client work counted on the clients' share of the data)."""

    hvps: int = 0
    gradients: float = 0.0


class StoredResult(Protocol):
    """What a quantity reads of a stored result (``figures.rundata.PassRecord``)."""

    def value(self, key: str, default: Any = ...) -> Any: ...

    def array(self, key: str) -> Any: ...


@dataclass(frozen=True)
class Quantity:
    """One summary number of a pass's results, as the comparison tables, compare's CSV and claims show it:
    read from result key ``key`` (a JSON scalar; its standard error from ``se_key``) unless ``read_result``
    says how."""

    text: str  # its name in plain text (terminal tables, CSV, claim recipes)
    header: str  # its name in HTML (table headers)
    key: str
    se_key: str | None = None
    read_result: Callable[[StoredResult], tuple[Any, Any]] | None = None  # -> (value, standard error or None)
    pass_name: str = ""  # the pass whose results hold it (set by its registration)

    def read(self, result: StoredResult) -> tuple[Any, Any]:
        """(value, standard error or None) of this quantity in one stored result of its pass."""
        if self.read_result is not None:
            return self.read_result(result)
        return result.value(self.key, None), (result.value(self.se_key, None) if self.se_key else None)


# A quantity per radius shown (S_rho at rho): the tables show it at the radii the runs analysed or asked for.
PerRadius = Callable[[float], Quantity]


def _no_cost(options: Any) -> Cost:
    return Cost()


@dataclass(frozen=True)
class PassInfo:
    """A registered pass's metadata besides its function, options and one-line summary (``Entry``)."""

    opt_in: bool = False  # runs only when named (expensive): not part of the default `landscape analyze`
    needs: frozenset[str] = frozenset()  # CLIENTS, KEPT_CLIENTS; options may add KEPT_CLIENTS (``needs``)
    # what a plain state_dict, which has no clients, can run of a pass whose options may need them
    without_clients: str = ""
    # its work is split inside it across ranks (surface cells): under torchrun all ranks run it together
    collective: bool = False
    cost: Callable[[Any], Cost] = _no_cost  # the options -> the job's estimated cost
    quantities: tuple[Quantity | PerRadius, ...] = ()


class PassRegistry(Registry[PassFn]):
    """``Registry`` of pass functions whose entries carry a ``PassInfo`` too."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._info: dict[str, PassInfo] = {}

    def register(self, name: str, *, options: type | None = None, summary: str = "", opt_in: bool = False,
                 needs: Sequence[str] = (), without_clients: str = "", collective: bool = False,
                 cost: Callable[[Any], Cost] = _no_cost,
                 quantities: Sequence[Quantity | PerRadius] = ()) -> Callable[[PassFn], PassFn]:
        named = tuple(replace(q, pass_name=name) if isinstance(q, Quantity) else _named(q, name)
                      for q in quantities)
        decorate = super().register(name, options=options, summary=summary)

        def register_info(factory: PassFn) -> PassFn:
            decorate(factory)
            self._info[name] = PassInfo(opt_in, frozenset(needs), without_clients, collective, cost, named)
            return factory

        return register_info

    def info(self, name: str) -> PassInfo:
        self.get(name)  # an unknown name: one line naming the passes
        return self._info[name]

    def needs(self, name: str, options: Any) -> frozenset[str]:
        """What the pass needs of a run with these options: its registered needs, and KEPT_CLIENTS where the
        options say so (a true ``needs_kept_clients``: the client-plane surface)."""
        options_need = bool(getattr(options, "needs_kept_clients", False))
        return self.info(name).needs | ({KEPT_CLIENTS} if options_need else set())

    def quantities(self, name: str, rhos: Sequence[float]) -> list[Quantity]:
        """The pass's summary quantities, those per radius at each of ``rhos``."""
        return [one for q in self.info(name).quantities
                for one in ([q] if isinstance(q, Quantity) else [q(rho) for rho in rhos])]


def _named(per_radius: PerRadius, name: str) -> PerRadius:
    return lambda rho: replace(per_radius(rho), pass_name=name)


PASSES = PassRegistry("analysis pass")


def needs_kept_clients(name: str, options: Any) -> bool:
    """Whether the pass, with these options, reads the round's kept client models."""
    return KEPT_CLIENTS in PASSES.needs(name, options)


def needs_clients(name: str, options: Any) -> bool:
    """Whether the pass, with these options, reads the clients of a training run (data or kept models)."""
    return bool(PASSES.needs(name, options) & {CLIENTS, KEPT_CLIENTS})
