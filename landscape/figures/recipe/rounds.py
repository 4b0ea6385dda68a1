"""The rounds a figure's runs will have, from their training recipes, checked before anything is trained.

``logged_rounds`` (a metrics.jsonl key), ``checkpoint_rounds`` and ``analysed_rounds`` (a pass of a figure
recipe, ``landscape.figures.recipe.figure``) say which rounds a run will have; ``check_pass_rounds`` checks
a figure's rounds against them and ``round_list`` shows rounds in a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds, RoundsUnavailable
from landscape.figures.recipe.figure import FigureRecipe

EVAL_KEYS = ("test_loss", "test_acc")  # logged every train.eval_every rounds and at the last one


def logged_rounds(key: str, train: Any) -> list[int]:
    """The rounds whose metrics.jsonl row carries ``key`` in a run trained with ``train`` (a recipe's
    ``TrainSettings``): every round 1..T; test_loss and test_acc every ``eval_every`` rounds and at T;
    swa_models only with ``train.swa``."""
    if key == "swa_models" and not train.swa:
        return []
    every = train.eval_every if key in EVAL_KEYS else 1
    return [r for r in range(1, train.rounds + 1) if r % every == 0 or r == train.rounds]


def checkpoint_rounds(train: Any) -> list[int]:
    """The rounds a run trained with ``train`` has checkpoints of: 0 (the initial model), every
    ``checkpoint_every`` rounds and the last round T."""
    every = range(train.checkpoint_every, train.rounds + 1, train.checkpoint_every)
    return sorted({0, train.rounds, *every})


def analysed_rounds(pass_name: str, spec: Rounds | str, train: Any) -> list[int]:
    """The rounds at which a figure's ``pass_name`` (rounds ``spec``, a ``Rounds``) has results in a run trained
    with ``train``: the chosen checkpoints it has (``Rounds.among``); for a pass that reads kept client models
    (flatness) those that have them (none without ``train.keep_clients``, never round 0)."""
    from landscape.analyze.passes import PASSES
    from landscape.analyze.registry import KEPT_CLIENTS

    chosen = Rounds.parse(spec, f"analyze.{pass_name}.rounds").among(checkpoint_rounds(train))
    if KEPT_CLIENTS in PASSES.get(pass_name).needs:  # the flatness pass: the round's kept clients
        chosen = [r for r in chosen if r > 0] if train.keep_clients else []
    return chosen


def round_list(rounds: Sequence[int]) -> str:
    """'0, 2, 3' or '1..40' (runs of three or more consecutive rounds shortened); 'no round' when empty."""
    parts, start = [], 0
    for i in range(1, len(rounds) + 1):
        if i == len(rounds) or rounds[i] != rounds[i - 1] + 1:
            run = rounds[start:i]
            parts.append(f"{run[0]}..{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)))
            start = i
    return "rounds " + ", ".join(parts) if parts else "no round"


def check_pass_rounds(recipe: FigureRecipe, trained: dict[str, list[tuple[int | None, Any]]]) -> None:
    """The rounds each pass of the figure is to analyse are checkpoints of every run (``Rounds.select``: each
    listed round, or as many as ``last N`` asks for): one line naming the recipe, the pass, the round and the
    run's checkpoints otherwise. ``trained``: run id -> (seed, training settings) of each of its runs."""
    for pass_name, spec in recipe.pass_rounds.items():
        for run_id, entries in trained.items():
            for seed, train in entries:
                have = checkpoint_rounds(train)
                try:
                    spec.select(have)
                except RoundsUnavailable as e:
                    which = run_id if seed is None else f"{run_id} seed {seed}"
                    what = (f"round {e.lacking[0]} is not a checkpoint" if e.lacking else
                            f"{spec} asks for {e.asked} checkpoints, more than those")
                    raise LandscapeError(
                        f"{recipe.path}: analyze.{pass_name}.rounds: {what} of run {which} (checkpoints at "
                        f"{round_list(have)}; train.rounds = {train.rounds}, "
                        f"train.checkpoint_every = {train.checkpoint_every})") from None
