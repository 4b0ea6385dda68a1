"""The words of the figures, shared by the matplotlib and plotly renderers: axis labels of the metrics, run
labels for legends, the settings a figure shows, the captions of the matplotlib figures, and plotly titles
wrapped to a width (``wrap_title``: plotly never wraps one).

Captions. A matplotlib figure of runs keeps short plain titles; what it shows beyond them (the runs and their
directories, the rounds, how seeds are aggregated, the settings its results were read with) is its caption:
``figure_caption`` words it, ``set_caption`` attaches it to the Figure, and
``landscape.figures.surface.draw.save_figure`` writes it beside the image as ``<file>.caption.txt``
(``caption_path``). The report's plotly titles still carry their settings (``with_settings``).
"""

from __future__ import annotations

import html
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from landscape.analyze.passes import RESULT_NAMES
from landscape.config.algorithms import algorithm_label
from landscape.figures.seeds import flat_recipe, groups
from landscape.store.results.selection import Selection, caption

# A run is a ``rundata.RunData`` (not imported: rundata imports this module, and the package has no import
# cycle).
RunData = Any

# y-axis labels (with units) of the metrics.jsonl keys
METRIC_LABELS = {
    "train_loss": "train loss (cross-entropy, nats)",
    "test_loss": "test loss (cross-entropy, nats)",
    "test_acc": "test accuracy (fraction)",
    "flatness_distance": r"flatness distance $\Delta_D$ ($\|y_i - \bar y\|^2$, mean over clients)",
    "flatness_distance_normalized": r"$\Delta_D / \|\bar y\|^2$",
    "flatness_distance_to_global":
        r"distance to the new global model ($\|y_i - x^{t+1}\|^2$, mean over clients)",
    "flatness_distance_to_global_normalized": r"$\|y_i - x^{t+1}\|^2$ / $\|x^{t+1}\|^2$",
    "client_update_sq": r"mean squared client update $\|y_i - s^t\|^2$",
    "flatness_distance_relative": r"relative flatness distance $\Delta_D / \overline{\|y_i - s^t\|^2}$",
    "update_norm": r"server update norm $\|x^{t+1} - x^t\|$",
    "uplink_floats": "uplink floats per round",
    "seconds": "seconds per round (s)",
    "lr": "learning rate",
}

_LABEL_IGNORES = {"name", "train.device", "dataset.root", "dataset.download"}


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def run_label(recipe: dict) -> str:
    """'FedSAM alpha=0.1': the algorithm's name and the partition's heterogeneity (a Dirichlet split other than
    the reference codes' and the per-class one is named: 'FedSAM dirichlet-client alpha=0.1'; ``run_labels``
    tells apart runs that share a label)."""
    algorithm = str(recipe.get("algorithm", {}).get("name", "?"))
    label = algorithm_label(algorithm)
    partition = recipe.get("partition", {})
    kind = partition.get("name")
    if kind in ("dirichlet", "dirichlet-client-reuse") and "alpha" in partition:
        label += f" alpha={_fmt(partition['alpha'])}"
    elif kind == "dirichlet-client" and "alpha" in partition:
        label += f" {kind} alpha={_fmt(partition['alpha'])}"
    elif kind == "pathological" and "classes_per_client" in partition:
        label += f" {partition['classes_per_client']} classes/client"
    elif kind:
        label += f" {kind}"
    return label


def run_labels(recipes: Sequence[dict], names: Sequence[str]) -> list[str]:
    """Labels per run, unique: runs sharing a label get the recipe keys they differ in (e.g. seed=1), and
    the directory name when even those are the same."""
    base = [run_label(r) for r in recipes]
    labels = list(base)
    for label in set(base):
        group = [i for i, b in enumerate(base) if b == label]
        if len(group) < 2:
            continue
        flats = [flat_recipe(recipes[i]) for i in group]
        keys = sorted(set().union(*flats) - _LABEL_IGNORES)
        differing = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
        tails = Counter(k.rsplit(".", 1)[-1] for k in differing)
        short = {k: k.rsplit(".", 1)[-1] if tails[k.rsplit(".", 1)[-1]] == 1 else k for k in differing}
        for i, flat in zip(group, flats):
            extra = ", ".join(f"{short[k]}={_fmt(flat.get(k))}" for k in differing)
            labels[i] = f"{label} {extra}" if extra else label
    counts = Counter(labels)
    return [f"{label} ({name})" if counts[label] > 1 else label for label, name in zip(labels, names)]


def settings_caption(runs: Sequence[RunData], output: str) -> str:
    """The settings of the ``output`` results a figure of ``runs`` shows, where they are not those asked for
    (the defaults, or a figure recipe's): '' when they are; shared settings once; else run by run."""
    return caption([(run.label, run.shown(output)) for run in runs if run.analysed_rounds(output)],
                   "as in the recipe" if any(run.selection.exact for run in runs) else "defaults")


def settings_lines(runs: Sequence[RunData], outputs: Sequence[str]) -> list[str]:
    """Which settings the results read of ``runs`` have: the selection, then each output read with other
    settings than asked (``settings_caption``)."""
    selection = runs[0].selection if runs else Selection(RESULT_NAMES)
    if selection.exact:
        head = "settings: those the figure recipe analyses with"
    elif selection.filters:
        head = f"settings: {selection.describe()} (the rest at their defaults where computed)"
    else:
        head = "settings: the defaults where computed (training split, BN mode eval, global surface data)"
    lines = [head]
    for output in dict.fromkeys(outputs):
        text = settings_caption(runs, output)
        if text:
            lines.append(f"{output} read with {text}")
    return lines


def with_settings(title: str, settings: str, sep: str = " ", *, matplotlib: bool = True,
                  width: int = 60) -> str:
    """A title with the settings it shows in brackets: the report's plotly titles (``matplotlib=False``). The
    matplotlib figures put their settings in their captions instead (``figure_caption``); for a matplotlib title
    a '$' is escaped (it starts maths) and settings on a line of their own are wrapped at ``width``
    characters."""
    if matplotlib:
        settings = settings.replace("$", "\\$")
        if sep == "\n" and len(settings) > width:
            settings = "\n".join(textwrap.wrap(settings, width, break_on_hyphens=False))
    return f"{title}{sep}[{settings}]" if settings else title


def _visible(text: str) -> int:
    """The characters of an HTML title that show (no tags; an entity is one)."""
    return len(html.unescape(re.sub(r"<[^>]*>", "", text)))


def wrap_title(title: str, width: int) -> str:
    """An HTML title with every line longer than ``width`` visible characters broken at spaces ('<br>'):
    plotly never wraps a title, and a long one runs off both sides of its plot."""
    lines = []
    for line in title.split("<br>"):
        current: list[str] = []
        for word in line.split(" "):
            if current and _visible(" ".join([*current, word])) > width:
                lines.append(" ".join(current))
                current = []
            current.append(word)
        lines.append(" ".join(current))
    return "<br>".join(lines)


# -- captions of the matplotlib figures ------------------------------------------------------------------------

CAPTION_SUFFIX = ".caption.txt"
_CAPTION = "_landscape_caption"  # the attribute of a matplotlib Figure that holds its caption


def caption_path(image: str | Path) -> Path:
    """The caption file of a figure file: ``accuracy.png`` (or ``.pdf``) -> ``accuracy.caption.txt``."""
    image = Path(image)
    return image.with_name(image.stem + CAPTION_SUFFIX)


def set_caption(fig: Any, text: str) -> Any:
    """Attach the caption ``text`` to a matplotlib Figure (``save_figure`` writes it beside the image);
    returns the figure."""
    setattr(fig, _CAPTION, text.strip())
    return fig


def caption_of(fig: Any) -> str:
    """The caption attached to a Figure ('' when none)."""
    return getattr(fig, _CAPTION, "")


def rounds_span(rounds: Iterable[int]) -> str:
    """'round 30', 'rounds 0-30' (every round between), 'rounds 10, 20, 30'; '' for none."""
    ordered = sorted({int(r) for r in rounds})
    if not ordered:
        return ""
    if len(ordered) == 1:
        return f"round {ordered[0]}"
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"rounds {ordered[0]}-{ordered[-1]}"
    return "rounds " + ", ".join(map(str, ordered))


def runs_text(runs: Sequence[RunData]) -> str:
    """The runs a figure draws, each by its label and directory, the seeds of a configuration together:
    'FedAvg (fedavg); FedSAM n=3 (fedsam-seed0, fedsam-seed1, fedsam-seed2)'."""
    parts = []
    for group in groups(list(runs)):
        names = ", ".join(run.name for run in group.runs)
        parts.append(f"{group.label} n={group.n} ({names})" if group.n > 1 else f"{group.label} ({names})")
    return "; ".join(parts)


def figure_caption(what: str, runs: Sequence[RunData], rounds: str | Sequence[str], *,
                   outputs: Sequence[str] = (), notes: Sequence[str] = ()) -> str:
    """A figure's caption, plain text, one sentence a line: what it shows; its runs (``runs_text``); the rounds
    (a text, or one per panel); ``notes`` (how seeds are aggregated, what a panel draws instead); and, where it
    reads analysis results (``outputs``), the settings they were read with (``settings_lines``)."""
    lines = [_sentence(what), _sentence(f"Runs: {runs_text(runs)}")]
    spans = [rounds] if isinstance(rounds, str) else list(rounds)
    spans = [span for span in spans if span]
    if spans:
        lines.append(_sentence("; ".join(spans)))
    lines += [_sentence(note) for note in notes if note]
    if outputs:
        lines.append(_sentence("; ".join(settings_lines(runs, outputs)).replace("settings: ", "Settings: ", 1)))
    return "\n".join(lines)


def _sentence(text: str) -> str:
    """``text`` with a capital first letter and a full stop."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
