"""Flatness distance and flatness incompatibility (docs/metrics.md "Flatness distance", "Flatness incompatibility").

Flatness distance (the FedNSAM paper's): Delta_D = (1/|S|) sum_{i in S} ||y_i - ybar||^2 over the saved client
models y_i of a round, ybar = (1/|S|) sum_i y_i their mean (parameters only), also divided by ||ybar||^2. The
distance to the new global model x^{t+1} is another quantity (it differs wherever the server does not simply
average: server momentum, server_lr != 1): distance_to_global = (1/|S|) sum_i ||y_i - x^{t+1}||^2
= Delta_D + ||ybar - x^{t+1}||^2. The trainer logs both online.

Flatness incompatibility at x with radius rho (all perturbations have norm rho, or 0 for a zero gradient):

    e*    = rho gradF / ||gradF||            global SAM perturbation (F = (1/N) sum_i F_i, the paper's; or
                                              size-weighted, over the analysis data: ``incompatibility``)
    e_i   = rho gradF_i / ||gradF_i||         client i's full-local perturbation
    e_i^B = rho g_i^B / ||g_i^B||             client i's perturbation from one training minibatch B

    Delta_FI = mean_i E_B ||e_i^B - e*||^2 = heterogeneity + batch + 2 * cross,
      heterogeneity = mean_i ||e_i - e*||^2,  batch = mean_i E_B ||e_i^B - e_i||^2,
      cross = mean_i E_B <e_i^B - e_i, e_i - e*>           (the split holds exactly on the sample)

    E_B ||g_i^B - gradF||^2 = ||delta_i||^2 + E_B ||zeta_i^B||^2 + 2 E_B <zeta_i^B, delta_i>,
      delta_i = gradF_i - gradF (heterogeneity),  zeta_i^B = g_i^B - gradF_i (minibatch noise)

    perturbation_heterogeneity_share = heterogeneity / (heterogeneity + batch)
    applied_*: the same with the algorithm's own perturbation a_i^B for e_i^B (``incompatibility``)

    loss level:  F(x + e*) - mean_i E_B F(x + e_i^B)
    friendly-adversary rate: over ordered pairs (B, B') of distinct draws of one client,
      the fraction with f_i^{B'}(x + e_i^B) < f_i^{B'}(x).

Minibatches: for each client, ``batches`` independent draws of ``batch_size`` samples of its data, each draw
without replacement (the whole data, shuffled, when ``batch_size`` >= the client's size), from a generator
seeded by (seed, client) (``client_minibatch_indices``), so one client's draws do not depend on which other
clients are analysed, and the alignment pass draws the same minibatches with the same seed.

Standard errors are Monte-Carlo errors given the clients (the clients are fixed, the minibatches random).
For a client, the mean of one value per draw has SE s_i / sqrt(M) (s_i the sample std over its M draws,
ddof = 1); a mean over ordered pairs of distinct draws (a U-statistic) has the first-order (Hoeffding) SE
sqrt(Var_b(r_b + c_b) / M), r_b and c_b the mean over the pairs with b first and with b second. Over clients,
SE = sqrt(sum_i SE_i^2) / N. Terms that involve no minibatch (heterogeneity, e* ...) are exact: no SE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core import perturb
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.rng import derived_seed
from landscape.measure.gradient_cache import GradientCache, full_gradient
from landscape.measure.incompatibility import (
    AppliedPerturbation,
    IncompatibilityResult,
    loss_level_mask,
    perturbation_terms,
    sampled_mean_se,
    share,
    shared_mode,
)

_STREAM_ANALYSIS_BATCHES = 101  # keeps the analysis minibatch streams apart from training's streams


# ----------------------------------------------------------------------------------------------------------
# flatness distance


@dataclass(frozen=True)
class FlatnessDistanceResult:
    clients: list[int]  # ascending; client_distance is indexed like this list
    distance: float  # Delta_D = mean_i ||y_i - ybar||^2, ybar = mean_i y_i (the FedNSAM paper's definition)
    distance_normalized: float  # Delta_D / ||ybar||^2
    mean_norm_sq: float  # ||ybar||^2
    client_distance: np.ndarray  # ||y_i - ybar||^2
    distance_to_global: float  # mean_i ||y_i - x^{t+1}||^2 (another quantity: the new global model's distance)
    distance_to_global_normalized: float  # distance_to_global / ||x^{t+1}||^2
    global_norm_sq: float  # ||x^{t+1}||^2
    global_offset_sq: float  # ||ybar - x^{t+1}||^2 = distance_to_global - distance
    client_distance_to_global: np.ndarray  # ||y_i - x^{t+1}||^2
    # the scale-free companion (landscape.core.distances), NaN where s^t is not known:
    update_sq: float  # U = mean_i ||y_i - s^t||^2, the clients' mean squared update from their start s^t
    distance_relative: float  # Delta_D / U in [0, 1] (NaN for U = 0)
    client_update_sq: np.ndarray  # ||y_i - s^t||^2


def client_models(flat: FlatModel, clients_checkpoint: Mapping[str, Any]) -> dict[int, Tensor]:
    """Client id -> flat parameter vector, from a loaded ``round-NNNN.clients.pt`` ({"clients": {id: state}})."""
    if "clients" not in clients_checkpoint:
        raise LandscapeError("not a clients checkpoint: it holds no 'clients' entry (train with --keep-clients)")
    return {int(c): flat.from_state_dict(state)[0] for c, state in clients_checkpoint["clients"].items()}


def check_client_vectors(reference: Tensor, vectors: Mapping[int, Tensor], what: str) -> list[int]:
    if not vectors:
        raise LandscapeError(f"{what} needs at least one client model")
    for c, v in vectors.items():
        if v.shape != reference.shape:
            raise LandscapeError(
                f"client {c}'s model has {v.numel()} parameters, the reference model {reference.numel()}"
            )
    return sorted(vectors)


def flatness_distance(global_w: Tensor, client_ws: Mapping[int, Tensor],
                      start: Tensor | None = None) -> FlatnessDistanceResult:
    """Delta_D = (1/|S|) sum_i ||y_i - ybar||^2 around the clients' mean ybar (float64), the distance of the
    same clients to ``global_w`` = x^{t+1}, the new global model of the round (module docstring), and, given
    ``start`` = s^t, their mean squared update U and Delta_D / U."""
    clients = check_client_vectors(global_w, client_ws, "flatness distance")
    x = global_w.detach().double()
    ys = torch.stack([client_ws[c].detach().to(x.device).double() for c in clients])
    y_bar = ys.mean(dim=0)
    dist = ((ys - y_bar) ** 2).sum(dim=1)
    dist_global = ((ys - x) ** 2).sum(dim=1)
    mean_norm_sq, norm_sq = (y_bar**2).sum(), (x**2).sum()
    updates = (((ys - start.detach().to(x.device).double()) ** 2).sum(dim=1) if start is not None
               else torch.full_like(dist, float("nan")))
    update_sq = float(updates.mean())
    return FlatnessDistanceResult(
        clients=[int(c) for c in clients],
        distance=float(dist.mean()),
        distance_normalized=float(dist.mean() / mean_norm_sq),
        mean_norm_sq=float(mean_norm_sq),
        client_distance=dist.cpu().numpy(),
        distance_to_global=float(dist_global.mean()),
        distance_to_global_normalized=float(dist_global.mean() / norm_sq),
        global_norm_sq=float(norm_sq),
        global_offset_sq=float(((y_bar - x) ** 2).sum()),
        client_distance_to_global=dist_global.cpu().numpy(),
        update_sq=update_sq,
        distance_relative=float(dist.mean()) / update_sq if update_sq > 0 else float("nan"),
        client_update_sq=updates.cpu().numpy(),
    )


# ----------------------------------------------------------------------------------------------------------
# minibatches and standard errors (shared with alignment)


def client_minibatch_indices(size: int, batch_size: int, batches: int, seed: int, client: int) -> list[Tensor]:
    """``batches`` index draws of min(batch_size, size) distinct samples out of ``size``, seeded by (seed, client)."""
    generator = torch.Generator().manual_seed(derived_seed(int(seed), _STREAM_ANALYSIS_BATCHES, int(client)))
    take = min(int(batch_size), int(size))
    return [torch.randperm(int(size), generator=generator)[:take] for _ in range(batches)]


def client_minibatches(objective: Any, batch_size: int, batches: int, seed: int, client: int) -> list[tuple]:
    """The (x, y) minibatches of ``client_minibatch_indices`` from an Objective's data."""
    data = objective.data
    index = client_minibatch_indices(len(data), batch_size, batches, seed, client)
    return [data.take(i) for i in index]


def client_minibatch_gradients(objective: Any, w: Tensor, batch_size: int, batches: int, seed: int, client: int,
                               gradients: GradientCache | None = None) -> tuple[list[tuple], list[Tensor]]:
    """The minibatches of ``client_minibatches`` and the gradients g_i^B = grad f_i^B(w) on each, from
    ``gradients`` when given (computed there once per client, batch size, number of draws and seed)."""

    def compute() -> tuple[list[tuple], list[Tensor]]:
        minibatches = client_minibatches(objective, batch_size, batches, seed, client)
        return minibatches, [objective.batch_loss_and_grad(w, b)[1] for b in minibatches]

    if gradients is None:
        return compute()
    return gradients.remember(("minibatch gradients", objective, int(client), int(batch_size), int(batches),
                               int(seed)), w, compute)


def check_minibatch_settings(batch_size: int, batches: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise LandscapeError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 2:
        raise LandscapeError(f"batches must be an integer >= 2: pairs of minibatches are compared (got {batches!r})")


def draw_mean_se(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """[N, M] values per (client, draw) -> per-client means and SEs, overall mean and SE (module docstring)."""
    n, m = samples.shape
    means = samples.mean(axis=1)
    ses = samples.std(axis=1, ddof=1) / np.sqrt(m)
    return means, ses, float(means.mean()), float(np.sqrt((ses**2).sum()) / n)


def pair_mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """[N, M, M] values h(b, b') per client (diagonal ignored) -> per-client means over b != b' and SEs
    (first-order U-statistic), overall mean and SE."""
    n, m, _ = values.shape
    off = ~np.eye(m, dtype=bool)
    means = np.array([v[off].mean() for v in values])
    rows = np.array([(v * off).sum(axis=1) / (m - 1) for v in values])  # r_b: pairs with b first
    cols = np.array([(v * off).sum(axis=0) / (m - 1) for v in values])  # c_b: pairs with b second
    ses = (rows + cols).std(axis=1, ddof=1) / np.sqrt(m)
    return means, ses, float(means.mean()), float(np.sqrt((ses**2).sum()) / n)


# ----------------------------------------------------------------------------------------------------------
# flatness incompatibility


@dataclass(frozen=True)
class _At:
    """What every client's terms are measured against: x, grad F and e* at radius rho, and the draws."""

    global_objective: Any
    w: Tensor
    grad: Tensor
    e_star: Tensor
    rho: float
    batch_size: int
    batches: int
    seed: int
    loss_level: bool
    gradients: GradientCache | None


def _client_record(at: _At, c: int, obj: Any, direction: Callable[[Tensor], Tensor] | None,
                   evaluate: np.ndarray) -> dict[str, Tensor]:
    """Client c's terms, per draw (stacked) and exact, on the host; with ``direction`` the applied ones too;
    F(x + e_i^B) at the draws ``evaluate`` is true at (NaN at the others), with the loss level."""
    w, rho = at.w, at.rho
    nan = torch.full((), float("nan"), dtype=torch.float64, device=w.device)
    _, grad_i = full_gradient(obj, w, at.gradients)
    e_i = rho * perturb.normalized(grad_i)
    delta = grad_i - at.grad
    minibatches, draw_gradients = client_minibatch_gradients(obj, w, at.batch_size, at.batches, at.seed, c,
                                                             at.gradients)
    base = obj.batch_losses(w, minibatches)  # f_i^{B'}(x), the M draws in one forward
    rows: dict[str, list[Tensor]] = {k: [] for k in ("fi", "batch", "cross", "gtotal", "gnoise", "gcross",
                                                      "gnorm", "ploss", "friendly")}
    for b, g in enumerate(draw_gradients):
        e_b = rho * perturb.normalized(g)
        zeta = g - grad_i
        for key, value in zip(("fi", "batch", "cross"), perturbation_terms(e_b, e_i, at.e_star)):
            rows[key].append(value)
        rows["gtotal"].append(((g - at.grad) ** 2).sum())
        rows["gnoise"].append((zeta**2).sum())
        rows["gcross"].append(torch.dot(zeta.reshape(-1), delta.reshape(-1)))
        rows["gnorm"].append(g.norm())
        rows["ploss"].append(at.global_objective.loss(w + e_b).double() if at.loss_level and evaluate[b] else nan)
        moved = obj.batch_losses(w + e_b, minibatches)  # f_i^{B'}(x + e_i^B) for every draw B'
        rows["friendly"].append(moved < base)  # entry b (B' = B) is masked out later
    if direction is not None:  # the algorithm's own: a_i^B = rho d(g_i^B) / ||d(g_i^B)||, a_i from gradF_i
        a_i = rho * perturb.normalized(direction(grad_i))
        for g in draw_gradients:
            terms = perturbation_terms(rho * perturb.normalized(direction(g)), a_i, at.e_star)
            for key, value in zip(("afi", "abatch", "across"), terms):
                rows.setdefault(key, []).append(value)
    record = {k: torch.stack([v.double() for v in vals]) for k, vals in rows.items()}
    record.update(
        het=((e_i - at.e_star) ** 2).sum().double(),
        ghet=(delta**2).sum().double(),
        gradnorm=grad_i.norm().double(),
        full_ploss=at.global_objective.loss(w + e_i).double() if at.loss_level else nan,
    )
    if direction is not None:
        record["ahet"] = ((a_i - at.e_star) ** 2).sum().double()
    return {k: v.cpu() for k, v in record.items()}  # one host transfer per client


def _samples(per_client: list[dict[str, Tensor]], key: str) -> np.ndarray:
    return torch.stack([r[key] for r in per_client]).numpy()


def _exact(per_client: list[dict[str, Tensor]], key: str) -> np.ndarray:
    return np.array([float(r[key]) for r in per_client])


def _applied_rule(applied: AppliedPerturbation | None, client: int, g: Tensor) -> tuple[str, str, bool]:
    """(rule, note, measured) of the applied figures: measured unless no rule, or the rule perturbs nothing."""
    if applied is None:
        return "", "no algorithm given: plain SAM perturbations only", False
    if applied.direction is None:
        return applied.rule, applied.note, False
    if applied.direction(client, g) is None:
        return applied.rule, f"{applied.rule} applies no perturbation", False
    return applied.rule, "", True


def _applied_fields(per_client: list[dict[str, Tensor]], rule: str, note: str, measured: bool,
                    batches: int) -> dict[str, Any]:
    """The applied_* fields of the result: Delta_FI's figures with a_i^B (NaN when not ``measured``)."""
    fields: dict[str, Any] = {"applied_rule": rule, "applied_note": note}
    if not measured:
        n, nan = len(per_client), float("nan")
        return fields | dict.fromkeys(
            ("applied_incompatibility", "applied_incompatibility_se", "applied_heterogeneity", "applied_batch_part",
             "applied_batch_part_se", "applied_cross", "applied_cross_se",
             "applied_perturbation_heterogeneity_share"), nan) | {
            k: np.full(n, nan) for k in ("client_applied_incompatibility", "client_applied_heterogeneity",
                                         "client_applied_batch_part", "client_applied_cross")} | {
            "applied_incompatibility_samples": np.full((n, batches), nan)}
    fi_i, _, fi, fi_se = draw_mean_se(_samples(per_client, "afi"))
    batch_i, _, batch_mean, batch_se = draw_mean_se(_samples(per_client, "abatch"))
    cross_i, _, cross, cross_se = draw_mean_se(_samples(per_client, "across"))
    het_i = _exact(per_client, "ahet")
    return fields | dict(
        applied_incompatibility=fi, applied_incompatibility_se=fi_se, applied_heterogeneity=float(het_i.mean()),
        applied_batch_part=batch_mean, applied_batch_part_se=batch_se, applied_cross=cross,
        applied_cross_se=cross_se, applied_perturbation_heterogeneity_share=share(float(het_i.mean()), batch_mean),
        client_applied_incompatibility=fi_i, client_applied_heterogeneity=het_i, client_applied_batch_part=batch_i,
        client_applied_cross=cross_i, applied_incompatibility_samples=_samples(per_client, "afi"))


def flatness_incompatibility(
    global_objective: Any,
    client_objectives: Mapping[int, Any],
    w: Tensor,
    rho: float,
    *,
    batch_size: int,
    batches: int,
    seed: int = 0,
    loss_level: bool = True,
    loss_level_pairs: int = 0,
    gradients: GradientCache | None = None,
    applied: AppliedPerturbation | None = None,
) -> IncompatibilityResult:
    """Delta_FI and its decompositions at x (module docstring). ``global_objective`` is F: the clients' plain
    average (``incompatibility.ClientMean``, the paper's) or an Objective over F's data. ``batch_size`` is the
    training batch size; ``batches`` the Monte-Carlo minibatches per client (>= 2). ``loss_level=False`` skips
    the N * (M + 1) + 1 full passes of F (K + N + 1 on a sample) that the loss-level figures cost (they are
    then NaN): F(x + e_i^B) is F at client i's own perturbation, so no client's term serves another;
    ``loss_level_pairs`` = K > 0 evaluates a seeded sample of K of the N * M (client, draw) pairs where there
    are more (``incompatibility.loss_level_mask``; 0: every pair). ``gradients``: grad F, grad F_i and the
    g_i^B at x precomputed by other passes of the checkpoint (``gradient_cache``; the same numbers).
    ``applied``: the algorithm's own perturbation, measured beside plain SAM's (the applied_* figures)."""
    if not rho > 0:
        raise LandscapeError(f"rho must be > 0 (got {rho})")
    check_minibatch_settings(batch_size, batches)
    if not client_objectives:
        raise LandscapeError("flatness incompatibility needs at least one client objective")
    pairs = loss_level_mask(len(client_objectives), batches, loss_level_pairs, seed)
    w = w.detach()
    clients = sorted(client_objectives)
    every = [*client_objectives.values(), *getattr(global_objective, "objectives", [global_objective])]
    with shared_mode(every):  # the model's flag set once for the pass's thousands of small evaluations
        f0, grad = full_gradient(global_objective, w, gradients)
        e_star = rho * perturb.normalized(grad)
        f_star = float(global_objective.loss(w + e_star)) if loss_level else float("nan")
        at = _At(global_objective, w, grad, e_star, rho, batch_size, batches, seed, loss_level, gradients)
        rule, note, measured = _applied_rule(applied, clients[0], grad)
        per_client = [
            _client_record(at, c, client_objectives[c],
                           (lambda g, c=c: applied.direction(c, g)) if measured else None,  # type: ignore[union-attr]
                           pairs[k])
            for k, c in enumerate(clients)
        ]
    fi_i, _, fi, fi_se = draw_mean_se(_samples(per_client, "fi"))
    batch_i, _, batch_mean, batch_se = draw_mean_se(_samples(per_client, "batch"))
    cross_i, _, cross, cross_se = draw_mean_se(_samples(per_client, "cross"))
    gtot_i, _, gtot, gtot_se = draw_mean_se(_samples(per_client, "gtotal"))
    gnoise_i, _, gnoise, gnoise_se = draw_mean_se(_samples(per_client, "gnoise"))
    gcross_i, _, gcross, gcross_se = draw_mean_se(_samples(per_client, "gcross"))
    ploss_samples = _samples(per_client, "ploss")
    if pairs.all():  # every pair: the mean over draws, then clients, as every other figure
        ploss_i, _, ploss, ploss_se = draw_mean_se(ploss_samples)
    else:  # a sample of pairs: their mean and s / sqrt(K)
        ploss_i, ploss, ploss_se = sampled_mean_se(ploss_samples, pairs)
    rate_i, rate_se_i, rate, rate_se = pair_mean_se(_samples(per_client, "friendly"))
    het_i, ghet_i, full_i = _exact(per_client, "het"), _exact(per_client, "ghet"), _exact(per_client, "full_ploss")
    het, ghet = float(het_i.mean()), float(ghet_i.mean())
    return IncompatibilityResult(
        rho=float(rho), batch_size=int(batch_size), batches=int(batches), seed=int(seed),
        clients=[int(c) for c in clients],
        client_sizes=np.array([len(client_objectives[c].data) for c in clients]),
        global_loss=float(f0), global_gradient_norm=float(grad.norm()),
        incompatibility=fi, incompatibility_se=fi_se, heterogeneity=het, batch_part=batch_mean,
        batch_part_se=batch_se, cross=cross, cross_se=cross_se,
        perturbation_heterogeneity_share=share(het, batch_mean),
        client_incompatibility=fi_i, client_heterogeneity=het_i, client_batch_part=batch_i, client_cross=cross_i,
        incompatibility_samples=_samples(per_client, "fi"),
        **_applied_fields(per_client, rule, note, measured, batches),
        gradient_total=gtot, gradient_total_se=gtot_se, gradient_heterogeneity=ghet, gradient_noise=gnoise,
        gradient_noise_se=gnoise_se, gradient_cross=gcross, gradient_cross_se=gcross_se,
        heterogeneity_share=share(ghet, gnoise), noise_share=share(gnoise, ghet),
        client_gradient_total=gtot_i, client_gradient_heterogeneity=ghet_i, client_gradient_noise=gnoise_i,
        client_gradient_cross=gcross_i, client_gradient_norm=_exact(per_client, "gradnorm"),
        client_minibatch_gradient_norm=_samples(per_client, "gnorm").mean(axis=1),
        perturbed_global_loss=f_star, local_perturbed_loss=ploss, local_perturbed_loss_se=ploss_se,
        loss_level_pairs=int(pairs.sum()) if loss_level else 0,
        loss_gap=f_star - ploss, loss_gap_se=ploss_se, full_local_perturbed_loss=float(full_i.mean()),
        full_local_loss_gap=f_star - float(full_i.mean()), client_perturbed_loss=ploss_i,
        client_full_perturbed_loss=full_i, perturbed_loss_samples=ploss_samples,
        friendly_rate=rate, friendly_rate_se=rate_se, client_friendly_rate=rate_i, client_friendly_rate_se=rate_se_i,
        friendly_pairs=len(clients) * batches * (batches - 1),
    )
