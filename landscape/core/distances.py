"""The flatness distance of a round's client models, as the trainer and ``landscape.RunWriter`` log it in every
``metrics.jsonl`` row (docs/metrics.md "Flatness distance"; the flatness pass recomputes it in float64 from the
saved models, ``landscape.measure.flatness``).

- ``flatness_distance``: Delta_D = (1/|S|) sum_i ||y_i - ybar||^2 around the clients' mean ybar (the FedNSAM
  paper's), and ``flatness_distance_normalized`` = Delta_D / ||ybar||^2;
- ``flatness_distance_to_global``: (1/|S|) sum_i ||y_i - x^{t+1}||^2, the distance to the new global model (another
  quantity, under its own name), and ``..._normalized`` by ||x^{t+1}||^2;
- ``client_update_sq``: U = (1/|S|) sum_i ||y_i - s^t||^2, the clients' mean squared update from the point s^t
  they started from, and ``flatness_distance_relative`` = Delta_D / U in [0, 1] (the mean squared distance to
  the clients' own mean is at most that to any point): the scale-free companion of Delta_D. A method whose
  clients move less has a lower Delta_D with minima no closer; Delta_D / U is lower only where the clients'
  updates agree more (docs/metrics.md says why). Absent where s^t is unknown or no client moved.
"""

from __future__ import annotations

from torch import Tensor


def round_distances(models: Tensor, x_new: Tensor, start: Tensor | None) -> dict[str, float]:
    """The distance keys above for ``models`` [N, d] (the clients' final flat parameter vectors), ``x_new`` [d]
    (x^{t+1}) and ``start`` [d] (s^t, or None), computed in the tensors' dtype."""
    y_bar = models.mean(dim=0)
    distance = ((models - y_bar) ** 2).sum(dim=1).mean()
    to_global = ((models - x_new) ** 2).sum(dim=1).mean()
    row = {
        "flatness_distance": distance.item(),
        "flatness_distance_normalized": (distance / (y_bar**2).sum()).item(),
        "flatness_distance_to_global": to_global.item(),
        "flatness_distance_to_global_normalized": (to_global / (x_new**2).sum()).item(),
    }
    if start is not None:
        update_sq = ((models - start) ** 2).sum(dim=1).mean()
        row["client_update_sq"] = update_sq.item()
        if update_sq > 0:
            row["flatness_distance_relative"] = (distance / update_sq).item()
    return row
