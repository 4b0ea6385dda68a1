"""The registry of analysis passes (the one registry, ``landscape.core.registry``): a pass is declared by name with everything there is to know about it
besides its computation (``PassSpec``): the dataclass of its options, whether it runs only when named
(opt-in), what it needs of a run (``CLIENTS``, ``KEPT_CLIENTS``), whether its work is split inside it across
ranks, its cost model (``Cost`` from its options: the dry-run's estimate) and the summary quantities compare,
report and claims read of its results (``Quantity``), and which numbers of its results the notebook's
``results()`` table holds (``measures``; the rest is ``bookkeeping``); its function
``(CheckpointContext, options) -> PassOutput`` attaches to the spec when its module is imported.

Each pass is one module of ``landscape.analyze.passes`` (its options, its declaration and its function, which
imports its computation when it runs); importing that package declares them all, so figures, reports and claims
read the specs without loading any computation; ``scheduler.py`` runs them over checkpoints; ``results.py``
writes what they return.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from landscape.core.registry import Entry, Registry
from landscape.store.results.records import Indexed


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
    """What a quantity reads of a stored result (``store.run.PassRecord``)."""

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
    pass_name: str = ""  # the pass whose results hold it (set by its declaration)

    def read(self, result: StoredResult) -> tuple[Any, Any]:
        """(value, standard error or None) of this quantity in one stored result of its pass."""
        if self.read_result is not None:
            return self.read_result(result)
        return result.value(self.key, None), (result.value(self.se_key, None) if self.se_key else None)


# A quantity per radius shown (S_rho at rho): the tables show it at the radii the runs analysed or asked for.
PerRadius = Callable[[float], Quantity]


def _no_cost(options: Any) -> Cost:
    return Cost()


@dataclass(frozen=True, kw_only=True)
class PassSpec(Entry):
    """A declared pass (an ``Entry`` of the one registry): its name, options and summary, its metadata below
    and, once its module is imported, its function (``factory``: ``(CheckpointContext, options) ->
    PassOutput``).

    ``options`` is a schema dataclass (``landscape.core.schema``): its annotations give each option's kind,
    range (``rule``) and choices (``Literal``), and its ``__post_init__`` the checks across options."""

    opt_in: bool = False  # runs only when named (expensive): not part of the default `landscape analyze`
    # the analysis settings it reads beyond those every pass reads (of ``settings.READ_BY_DECLARATION``: backend,
    # hvp); the others its results record at their defaults, so they neither name its results nor set them apart
    reads: frozenset[str] = frozenset()
    needs: frozenset[str] = frozenset()  # CLIENTS, KEPT_CLIENTS; options may add KEPT_CLIENTS (``needs``)
    # what a plain state_dict, which has no clients, can run of a pass whose options may need them
    without_clients: str = ""
    # its work is split inside it across ranks (surface cells): under torchrun all ranks run it together
    collective: bool = False
    cost: Callable[[Any], Cost] = _no_cost  # the options -> the job's estimated cost
    quantities: tuple[Quantity | PerRadius, ...] = ()
    # The numbers of its results that ``results()`` tabulates (``passes._common.measured`` spells them):
    # {key: its name in the table}, a dotted key of the result or a key of its summary (whose numbers are
    # always tabulated, by their own name unless named here), one name per concept; None: every number of the
    # result (a pass that does not say). Not hashed (a dict): a spec hashes as before.
    measures: Mapping[str, str] | None = field(default=None, hash=False)
    # Numbers its results hold as short arrays that ``results()`` tabulates too, one quantity per entry (the
    # adaptive S_rho per radius: ``store.results.records.Indexed``).
    indexed: tuple[Indexed, ...] = ()
    # The result's other numbers (dotted keys; a key covers the values under it): the settings it echoes,
    # seeds, counts of work and samples, sizes, and numbers another pass's quantity gives. Not tabulated.
    bookkeeping: frozenset[str] = frozenset()
    # values -> values with one spelling each, before they are checked (--set surface.grid=41 -> "41")
    spelling: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # what the options ask of the machine that is to run them (a surface grid's memory), checked when
    # options are made for work (``catalog.pass_options``), not when stored results are read
    machine_check: Callable[[Any], None] | None = None
    # what the options ask of the machine for a model of ``dim`` trainable parameters of ``itemsize`` bytes, with
    # the analysis device's free bytes (None: unknown) (a Hessian's Lanczos basis, the trace's probes): refused
    # in one line with the memory they need, checked when the checkpoint is known (``catalog.check_sizes``: the
    # dry-run's plan, and before a job runs)
    size_check: Callable[[Any, int, int, int | None], None] | None = None
    # {option: value}: what a stored result that lacks an option (written before the option existed) was computed
    # with, where that is not the option's default (incompatibility.loss_level_pairs: every pair, 0). Such a
    # result is named and compared by this value, so the default's new computation never takes it for done.
    # Not hashed (a dict).
    recorded_before: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def make_options(self, values: Any, where: str | None = None, *, noun: str = "pass option") -> Any:
        """The options from recipe, ``--set`` or recorded values (``Entry.make_options``: one line naming
        the option, ``hessian.top_k must be >= 1 (got 0)``), after two spellings are made one: a number where
        a list goes is a one-element list (``--set sharpness.rhos=0.05``), and the pass's own ``spelling``."""
        if self.options is not None and isinstance(values, Mapping):
            lists = {k for k, v in self.option_defaults().items() if isinstance(v, tuple)}
            values = {k: (v,) if k in lists and not isinstance(v, (list, tuple)) else v for k, v in values.items()}
            values = self.spelling(values) if self.spelling is not None else values
        return super().make_options(values, where, noun=noun)


def _named(quantity: Quantity | PerRadius, name: str) -> Quantity | PerRadius:
    """A declared quantity with its pass's name (a per-radius one: each quantity it makes)."""
    if isinstance(quantity, Quantity):
        return replace(quantity, pass_name=name)
    return lambda rho: replace(quantity(rho), pass_name=name)


class PassRegistry(Registry[PassSpec]):
    """The analysis passes by name: each a ``PassSpec``, declared first, its function attached later."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind, PassSpec)

    def declare(self, name: str, *, needs: Sequence[str] = (), quantities: Sequence[Quantity | PerRadius] = (),
                **metadata: Any) -> PassSpec:
        """Declare the pass ``name`` with its metadata (``PassSpec``'s fields but ``factory``); each quantity
        carries the pass's name."""
        return super().declare(name, needs=frozenset(needs), quantities=tuple(_named(q, name) for q in quantities),
                               **metadata)

    def needs(self, name: str, options: Any) -> frozenset[str]:
        """What the pass needs of a run with these options: its declared needs, and KEPT_CLIENTS where the
        options say so (a true ``needs_kept_clients``: the client-plane surface)."""
        options_need = bool(getattr(options, "needs_kept_clients", False))
        return self.get(name).needs | ({KEPT_CLIENTS} if options_need else set())

    def quantities(self, name: str, rhos: Sequence[float]) -> list[Quantity]:
        """The pass's summary quantities, those per radius at each of ``rhos``."""
        return [one for q in self.get(name).quantities
                for one in ([q] if isinstance(q, Quantity) else [q(rho) for rho in rhos])]


PASSES = PassRegistry("analysis pass")


def needs_kept_clients(name: str, options: Any) -> bool:
    """Whether the pass, with these options, reads the round's kept client models."""
    return KEPT_CLIENTS in PASSES.needs(name, options)


def needs_clients(name: str, options: Any) -> bool:
    """Whether the pass, with these options, reads the clients of a training run (data or kept models)."""
    return bool(PASSES.needs(name, options) & {CLIENTS, KEPT_CLIENTS})
