"""What the flatness incompatibility (``flatness.flatness_incompatibility``; docs/metrics.md "Flatness
incompatibility") is measured against and returns: the global objective F as the paper's plain average over
the clients (``ClientMean``), the perturbation a training algorithm applies (``AppliedPerturbation``) and the
result (``IncompatibilityResult``).

F = (1/N) sum_i F_i (the paper's; every client counts once, whatever its size), so grad F = (1/N) sum_i grad F_i.
The size-weighted F (one objective over the union of the clients' data) is another quantity, kept under that
name (the pass's ``global_objective = "size-weighted"``).

Applied perturbation: each SAM-type rule perturbs along a direction of its own (``Algorithm.
perturbation_direction`` in landscape.train.algorithms: FedVSSAM's steered h_i, FedSMOO's corrected gradient,
FedLESAM's estimate x^{tau_i} - x^t, FedNSAM's -m, ...), a function of the state the server broadcast, the
client's own state and its minibatch gradient. Delta_FI with it in place of plain SAM's, at the pass's radius:
    a_i^B = rho d_i(g_i^B) / ||d_i(g_i^B)||,   a_i = rho d_i(gradF_i) / ||d_i(gradF_i)||   (0 for d = 0)
    applied Delta_FI = mean_i E_B ||a_i^B - e*||^2 = heterogeneity + batch_part + 2 cross   (a_i, a_i^B for e_i,
e_i^B). ASAM's e = rho T^2 g / ||T g|| is taken by its direction, at radius rho, like every other.

Loss level on a sample of pairs (``loss_level_mask``, ``sampled_mean_se``): the local perturbed loss
(1/N) sum_i E_B F(x + e_i^B) needs one full evaluation of F per (client, draw) pair, N * M in all. With
``pairs`` = K > 0 and N * M > K, K pairs drawn uniformly without replacement (a generator of their own, seeded
by (seed, 102): no other draw moves) are evaluated and averaged. Every client has M draws, so a uniform pair
is a uniform client then one of its draws, a minibatch drawn at random: each value is F(x + e_c^B) with c
uniform over the N clients and B random, whose mean is the target (1/N) sum_i E_B F(x + e_i^B) with the
clients fixed (the target of every other SE of the result, ``flatness`` docstring) and whose variance (between
the clients' means and within a client's draws) the sample variance s^2 of the K values estimates; their mean
has SE s / sqrt(K) (ddof 1), a slight overstatement as the pairs are drawn without replacement. Where
N * M <= K or K = 0 every pair is evaluated, exactly as without sampling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.core.rng import derived_seed
from landscape.measure.gradient_cache import GradientCache, full_gradient

GLOBAL_OBJECTIVES = ("client-mean", "size-weighted")  # F: the clients' plain average (the paper's), or over the union
_STREAM_LOSS_PAIRS = 102  # the loss level's sample of (client, draw) pairs: a stream of its own (module docstring)


def shared_mode(objectives: Iterable[Any]) -> contextlib.AbstractContextManager:
    """The training flag the objectives evaluate under, set once for the block where they all share one model
    and BN mode (``Objective.bn_mode_context``): each evaluation inside then finds it set and switches no module
    (the same numbers; a flag switch per call costs as much as a small client's forward pass). Objectives of
    other kinds, or of several models or modes: each switches for itself, as without the block."""
    objectives = list(objectives)
    first = objectives[0] if objectives else None
    shared = first is not None and all(
        hasattr(o, "bn_mode_context") and getattr(o, "flat", None) is first.flat
        and getattr(o, "bn_mode", None) == first.bn_mode for o in objectives)
    return first.bn_mode_context() if shared else contextlib.nullcontext()


def joint_batches(objectives: Sequence[Any]) -> list[list[tuple[int, int, int]]] | None:
    """The forward passes that evaluate every client's F_i together: each a list of (objective index, start,
    stop) pieces, every piece one of its client's own analysis batches, packed in client order into passes of
    at most the analysis batch size (a batch never split). None where a client's losses could depend on the
    other samples of its forward pass, or where the objectives do not share one model, BN mode, loss and
    buffers: BatchNorm normalising by batch statistics (``train-batch-stats``) or recomputing them on each
    client's data (``recompute``), or objectives that are not ``Objective``s."""
    from landscape.measure.objective import Objective

    first = objectives[0] if objectives else None
    if not isinstance(first, Objective) or (first.has_batchnorm and first.bn_mode != "eval"):
        return None
    if not all(type(o) is type(first) and o.flat is first.flat and o.bn_mode == first.bn_mode
               and o.loss_fn is first.loss_fn and o.buffers.keys() == first.buffers.keys()
               and all(o.buffers[k] is v for k, v in first.buffers.items())
               and (o.data.device, o.data.dtype) == (first.data.device, first.data.dtype) for o in objectives):
        return None
    size = first.data.batch_size
    passes: list[list[tuple[int, int, int]]] = [[]]
    room = size
    for k, o in enumerate(objectives):
        for start, stop in o.data.batch_ranges():
            if passes[-1] and stop - start > room:
                passes.append([])
                room = size
            passes[-1].append((k, start, stop))
            room -= stop - start
    return passes


class ClientMean:
    """F = (1/N) sum_i F_i over ``objectives`` (every client of the run): ``loss`` and ``loss_and_grad`` as an
    Objective's; each grad F_i from ``gradients`` when given (the passes' shared cache).

    ``loss`` evaluates the clients together where their losses do not depend on each other's samples
    (``joint_batches``): forward passes of several clients' batches at once, each batch's summed loss taken
    from its own rows of the outputs, so that F costs what a forward pass over the union costs however small
    the clients are (a forward pass per client: 49 ms against 17 ms for F at 100 digits clients; issue 47).
    The arithmetic is each client's own (its batches' summed losses added in order, over its size, the
    clients' F_i added in order, over N); only a matrix product's last bits may differ from a forward pass of
    the client alone, as its kernel's blocking follows the number of rows (3 of 100 digits clients' F_i moved,
    by at most 2.4e-7 in a logit). Elsewhere each client is evaluated alone."""

    def __init__(self, objectives: Mapping[int, Any], gradients: GradientCache | None = None) -> None:
        if not objectives:
            raise LandscapeError("the clients' mean F needs at least one client objective")
        self.objectives = [objectives[c] for c in sorted(objectives)]
        self.gradients = gradients
        self.joint = joint_batches(self.objectives)

    def loss(self, w: Tensor) -> Tensor:
        if self.joint is not None:
            return self._joint_loss(w)
        with shared_mode(self.objectives):  # one flag switch for the N evaluations
            return sum(o.loss(w).double() for o in self.objectives) / len(self.objectives)

    def _joint_loss(self, w: Tensor) -> Tensor:
        """``loss`` by the forward passes of ``joint_batches`` (class docstring)."""
        first = self.objectives[0]
        totals = [torch.zeros((), dtype=torch.float64, device=w.device) for _ in self.objectives]
        buffers = first.buffers_for(w)
        with torch.no_grad(), first.bn_mode_context():
            for pieces in self.joint:
                batches = [self.objectives[k].data.batch(start, stop) for k, start, stop in pieces]
                x = batches[0][0] if len(batches) == 1 else torch.cat([xb for xb, _ in batches])
                outputs = first.flat.logits(w, x, buffers).split([len(yb) for _, yb in batches])
                for (k, _, _), out, (_, yb) in zip(pieces, outputs, batches):
                    totals[k] += first.summed_loss(out, yb).double()
        return sum(t / len(o.data) for t, o in zip(totals, self.objectives)) / len(self.objectives)

    def loss_and_grad(self, w: Tensor) -> tuple[Tensor, Tensor]:
        with shared_mode(self.objectives):
            loss, grad = full_gradient(self.objectives[0], w, self.gradients)
            loss, grad = loss.double(), grad.clone()
            for o in self.objectives[1:]:  # summed in client order, then divided: (1/N) sum_i
                f_i, g_i = full_gradient(o, w, self.gradients)
                loss, grad = loss + f_i.double(), grad.add_(g_i)
        return loss / len(self.objectives), grad / len(self.objectives)


@dataclass(frozen=True)
class AppliedPerturbation:
    """The perturbation a training algorithm applies at the start of a round (module docstring):
    ``direction(client, g)`` is d, the perturbation being along d, from the client's minibatch (or full)
    gradient g; None from it: the rule perturbs nothing (the applied figures are then NaN). ``rule`` names
    the algorithm; ``note`` says why there are no applied figures where ``direction`` is None."""

    rule: str
    direction: Callable[[int, Tensor], Tensor | None] | None
    note: str = ""


def algorithm_perturbation(algorithm: Any, x: Tensor, server_state: Mapping[str, Tensor],
                           client_states: Mapping[Any, Mapping[str, Tensor]], round: int) -> AppliedPerturbation:
    """The perturbation ``algorithm`` (a landscape.train.algorithms rule) applies at the start of round ``round``
    from x = x^t: its ``perturbation_direction`` with the server's broadcast A.broadcast(x, server_state, round)
    and each client's state ({client: {field: tensor}}, as a checkpoint holds them; a client without one
    starts as at its first participation), placed like x (a client's when its direction is asked)."""

    def place(table: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(x.device, x.dtype) if v.is_floating_point() else v.to(x.device) for k, v in table.items()}

    name = algorithm.name
    try:
        message = algorithm.broadcast(x, algorithm.ServerState.from_named(place(server_state)), round)
        states = {int(c): algorithm.ClientState.from_named(s) for c, s in client_states.items()}
    except ValueError as unknown:
        raise LandscapeError(f"a state {name} does not keep ({unknown})") from None
    except KeyError as missing:
        raise LandscapeError(f"the state lacks {missing}, which {name} keeps") from None
    except AttributeError:
        raise LandscapeError(f"the states of {name} must be tables of named tensors") from None
    placed: dict[int, Any] = {}  # the last client's state on x's device (one client at a time)

    def direction(client: int, g: Tensor) -> Tensor | None:
        if client not in placed:
            placed.clear()
            state = states.get(client)
            placed[client] = None if state is None else type(state).from_named(place(state.named()))
        try:
            return algorithm.perturbation_direction(message, placed[client], g)
        except RuntimeError as error:
            raise LandscapeError(f"{name}'s state does not fit the model: {str(error).splitlines()[0]}") from None

    return AppliedPerturbation(name, direction)


def perturbation_terms(e_draw: Tensor, e_i: Tensor, e_star: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """||e^B - e*||^2, ||e^B - e_i||^2 and <e^B - e_i, e_i - e*> of one draw (Delta_FI's terms)."""
    return (((e_draw - e_star) ** 2).sum(), ((e_draw - e_i) ** 2).sum(),
            torch.dot((e_draw - e_i).reshape(-1), (e_i - e_star).reshape(-1)))


def loss_level_mask(clients: int, batches: int, pairs: int, seed: int) -> np.ndarray:
    """[N, M] booleans, true at the (client, draw) pairs whose F(x + e_i^B) the loss level evaluates: every pair
    where ``pairs`` is 0 or N * M <= ``pairs``, else ``pairs`` of them drawn uniformly without replacement from
    a generator seeded by (seed, 102) (module docstring)."""
    if isinstance(pairs, bool) or not isinstance(pairs, (int, np.integer)) or pairs < 0:
        raise LandscapeError(f"loss_level_pairs must be an integer >= 0 (0: every pair) (got {pairs!r})")
    total = int(clients) * int(batches)
    if pairs == 0 or total <= pairs:
        return np.ones((clients, batches), dtype=bool)
    generator = np.random.default_rng(derived_seed(int(seed), _STREAM_LOSS_PAIRS))
    mask = np.zeros(total, dtype=bool)
    mask[generator.choice(total, size=int(pairs), replace=False)] = True
    return mask.reshape(clients, batches)


def sampled_mean_se(samples: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, float, float]:
    """[N, M] values, evaluated where ``mask`` is true -> per-client means over the evaluated draws (NaN where
    none), the mean of the K evaluated values (row by row) and its SE s / sqrt(K), ddof 1 (NaN for K < 2)."""
    values = samples[mask]
    k = values.size
    client = np.array([row[m].mean() if m.any() else np.nan for row, m in zip(samples, mask)])
    se = float(values.std(ddof=1) / np.sqrt(k)) if k > 1 else float("nan")
    return client, float(values.mean()) if k else float("nan"), se


def share(part: float, other: float) -> float:
    """part / (part + other); NaN when both are 0."""
    return part / (part + other) if part + other > 0 else float("nan")


@dataclass(frozen=True)
class IncompatibilityResult:
    """Everything of docs/metrics.md "Flatness incompatibility"; client_* arrays are indexed like ``clients``,
    *_samples arrays are [client, draw]; *_se are Monte-Carlo standard errors (``flatness`` docstring);
    applied_* the same figures with the algorithm's own perturbation (``AppliedPerturbation``; NaN without)."""

    rho: float
    batch_size: int
    batches: int
    seed: int
    clients: list[int]
    client_sizes: np.ndarray
    global_loss: float  # F(x)
    global_gradient_norm: float  # ||gradF||
    # perturbation level
    incompatibility: float  # Delta_FI = mean_i E_B ||e_i^B - e*||^2, in [0, 4 rho^2]
    incompatibility_se: float
    heterogeneity: float  # mean_i ||e_i - e*||^2 (exact)
    batch_part: float  # mean_i E_B ||e_i^B - e_i||^2 (friendly-adversary part)
    batch_part_se: float
    cross: float  # mean_i E_B <e_i^B - e_i, e_i - e*>; Delta_FI = heterogeneity + batch_part + 2 cross
    cross_se: float
    perturbation_heterogeneity_share: float  # heterogeneity / (heterogeneity + batch_part)
    client_incompatibility: np.ndarray
    client_heterogeneity: np.ndarray
    client_batch_part: np.ndarray
    client_cross: np.ndarray
    incompatibility_samples: np.ndarray  # [N, M] ||e_i^B - e*||^2
    # perturbation level, the algorithm's own perturbation a_i^B in place of e_i^B
    applied_rule: str  # the algorithm whose perturbation the applied_* figures measure ("" none)
    applied_note: str  # why the applied_* figures are NaN ("" when they are not)
    applied_incompatibility: float  # mean_i E_B ||a_i^B - e*||^2
    applied_incompatibility_se: float
    applied_heterogeneity: float  # mean_i ||a_i - e*||^2 (exact)
    applied_batch_part: float  # mean_i E_B ||a_i^B - a_i||^2
    applied_batch_part_se: float
    applied_cross: float  # mean_i E_B <a_i^B - a_i, a_i - e*>
    applied_cross_se: float
    applied_perturbation_heterogeneity_share: float  # applied_heterogeneity / (that + applied_batch_part)
    client_applied_incompatibility: np.ndarray
    client_applied_heterogeneity: np.ndarray
    client_applied_batch_part: np.ndarray
    client_applied_cross: np.ndarray
    applied_incompatibility_samples: np.ndarray  # [N, M] ||a_i^B - e*||^2
    # gradient level
    gradient_total: float  # mean_i E_B ||g_i^B - gradF||^2
    gradient_total_se: float
    gradient_heterogeneity: float  # mean_i ||delta_i||^2 (exact)
    gradient_noise: float  # mean_i E_B ||zeta_i^B||^2
    gradient_noise_se: float
    gradient_cross: float  # mean_i E_B <zeta_i^B, delta_i>; total = heterogeneity + noise + 2 cross
    gradient_cross_se: float
    heterogeneity_share: float  # gradient level: gradient_heterogeneity / (gradient_heterogeneity + gradient_noise)
    noise_share: float  # gradient_noise / (gradient_heterogeneity + gradient_noise)
    client_gradient_total: np.ndarray
    client_gradient_heterogeneity: np.ndarray
    client_gradient_noise: np.ndarray
    client_gradient_cross: np.ndarray
    client_gradient_norm: np.ndarray  # ||gradF_i||
    client_minibatch_gradient_norm: np.ndarray  # mean over draws of ||g_i^B||
    # loss level (NaN when loss_level=False)
    perturbed_global_loss: float  # F(x + e*)
    local_perturbed_loss: float  # mean_i E_B F(x + e_i^B) (over loss_level_pairs pairs where they are a sample)
    local_perturbed_loss_se: float
    loss_level_pairs: int  # the (client, draw) pairs evaluated: N * M (all), K (a sample), 0 without loss_level
    loss_gap: float  # F(x + e*) - mean_i E_B F(x + e_i^B)
    loss_gap_se: float
    full_local_perturbed_loss: float  # mean_i F(x + e_i) (exact)
    full_local_loss_gap: float  # F(x + e*) - mean_i F(x + e_i) (exact)
    client_perturbed_loss: np.ndarray  # E_B F(x + e_i^B) over the client's evaluated draws (NaN where none)
    client_full_perturbed_loss: np.ndarray  # F(x + e_i)
    perturbed_loss_samples: np.ndarray  # [N, M] F(x + e_i^B), NaN at the pairs not evaluated
    # friendly adversary
    friendly_rate: float  # fraction of ordered pairs (B, B'), B != B', with f^{B'}(x + e^B) < f^{B'}(x)
    friendly_rate_se: float
    client_friendly_rate: np.ndarray
    client_friendly_rate_se: np.ndarray
    friendly_pairs: int  # pairs compared in all: N * M * (M - 1)
