"""The recipe a run was trained with: the one its checkpoints record, not recipe.toml where that was edited after
training (issue 46, W4).

Every ``round-NNNN.pt`` that ``landscape train`` writes carries the resolved recipe it was trained with (TOML
text, ``Checkpoint.recipe_text``). ``run_recipe`` reads it from each checkpoint of a run without loading the
weights (``checkpoints.read_recipe_text``) and gives the run's recipe table (``Run.recipe_table``, from which
``Run.recipe`` is resolved, and what the report, compare and the figures label and tabulate):

- no checkpoint carries a recipe (none yet, a ``RunWriter``'s or an imported run's, a version before checkpoints
  carried it): recipe.toml, as recorded;
- every checkpoint agrees with recipe.toml but for the keys a resume may change (``RESUME_FREE_KEYS``: rounds,
  device, logging, ``dataset.root``, ...): recipe.toml;
- they agree among themselves, and recipe.toml differs from them in another key (it was edited after training):
  the recorded recipe, with recipe.toml's values of those free keys, and the line ``edited`` that says so
  (``RecipeEditedWarning``; the command line prints it as a ``note:``);
- a checkpoint that differs from the others while recipe.toml agrees with those is another run's (copied in):
  refused in one line naming it, as ``landscape analyze`` and ``--resume`` refuse it; checkpoints that differ
  among themselves while none agrees with recipe.toml are refused in one line naming two of them.

A checkpoint that cannot be read (damaged, unsafe, a FIFO) is left out here: whatever loads it says why.
``check_recipe`` is the one check of a loaded checkpoint against the run's recipe (analysis, ``Run.model``).
"""

from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError, RecipeEditedWarning
from landscape.store.checkpoints import CheckpointError, read_recipe_text

__all__ = ["RecipeEditedWarning", "RunRecipe", "check_recipe", "run_recipe", "warn_edited"]

if TYPE_CHECKING:
    from landscape.config.recipe import Recipe
    from landscape.store.directory import RunDir


@dataclass(frozen=True)
class RunRecipe:
    """A run's recipe as ``run_recipe`` finds it: ``table`` (its tables, what readers use), ``origin`` (where
    it comes from, for messages: recipe.toml, or the checkpoint it was recorded in), ``here`` (how a difference
    names it: 'in recipe.toml', 'in its checkpoints') and ``edited`` (the note when recipe.toml was edited
    after training; None when it was not)."""

    table: dict
    origin: str
    here: str = "in recipe.toml"
    edited: str | None = None


def free_keys() -> frozenset[str]:
    """The keys a checkpoint and its run may differ in (``config.recipe.RESUME_FREE_KEYS``)."""
    return recipes.RESUME_FREE_KEYS


def check_recipe(path: Path, text: str | None, recipe: Recipe | dict, run_name: str,
                 here: str = "in recipe.toml") -> None:
    """A checkpoint (``path``, carrying the recipe ``text``; None: it carries none, not checked) written by
    another recipe than the run's (``recipe``: a ``Recipe``, or the run's recipe tables, ``Run.recipe_table``;
    named ``here`` in the line: 'in recipe.toml') in a key that is not free (another seed's run copied in):
    refused in one line, since its analysis or model would be built from other data, partition or model. The
    one check for ``landscape analyze``, ``open_run(...).model()`` and ``run_recipe``."""
    if text is None:
        return
    difference = recipes.difference(text, recipe, free_keys(), here=here)
    if difference:
        raise LandscapeError(f"{path} was written by another recipe ({difference}); it is not a checkpoint of "
                             f"{run_name}: move it away, or analyse it where it came from")


def _recorded_texts(run_dir: RunDir, rounds: list[int]) -> list[tuple[Path, str]]:
    """(path, recipe text) of each checkpoint that carries one, by round; unreadable ones left out."""
    found = []
    for round in rounds:
        path = run_dir.checkpoint(round)
        try:
            text = read_recipe_text(path)
        except CheckpointError:
            continue  # its loader names the problem
        if text is not None:
            found.append((path, text))
    return found


def _with_free_keys(recorded: dict, toml: dict) -> dict:
    """The recorded tables with recipe.toml's values of the free keys (set where it sets them, else unset)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in recorded.items()}
    for key in sorted(free_keys()):
        section, _, name = key.rpartition(".")
        source = toml.get(section) if section else toml
        if isinstance(source, dict) and name in source:
            target = out.setdefault(section, {}) if section else out
            if isinstance(target, dict):
                target[name] = source[name]
        elif isinstance(out.get(section) if section else out, dict):
            (out[section] if section else out).pop(name, None)
    return out


def _tables(path: Path, text: str) -> dict:
    try:
        return recipes.tomllib.loads(text)
    except recipes.tomllib.TOMLDecodeError as e:
        raise LandscapeError(f"{path} records a recipe that does not read as TOML ({e})") from None


def run_recipe(run_dir: RunDir, rounds: list[int], toml: dict) -> RunRecipe:
    """The recipe of the run at ``run_dir`` (checkpointed ``rounds``; ``toml`` its recipe.toml's tables, as read)
    as the module's rules say. Tables are compared as written (a recipe an older version wrote compares too);
    nothing is resolved here."""
    texts = _recorded_texts(run_dir, rounds)
    # each text once: the checkpoints of one run differ at most in the free keys (rounds, after a resume)
    seen = {text: recipes.difference(text, toml, free_keys()) for text in dict.fromkeys(t for _, t in texts)}
    differing = [(path, text) for path, text in texts if seen[text]]
    if not differing:
        return RunRecipe(toml, str(run_dir.recipe))
    if len(differing) < len(texts):  # recipe.toml agrees with some: the others are not this run's
        check_recipe(*differing[0], toml, run_dir.path.name)
    last_path, last_text = texts[-1]
    recorded = _tables(last_path, last_text)
    for path, text in texts[:-1]:
        difference = None if text == last_text else recipes.difference(text, recorded, free_keys(),
                                                                         here=f"in {last_path.name}")
        if difference:
            raise LandscapeError(f"the checkpoints of {run_dir.path} disagree on the recipe they were trained "
                                 f"with: {path} ({difference}); move the one that is not this run's away")
    why = recipes.difference(last_text, toml, free_keys(), there="in its checkpoints")
    return RunRecipe(_with_free_keys(recorded, toml), f"the recipe recorded in {last_path}", "in its checkpoints",
                     f"{run_dir.path}'s recipe.toml was edited after training ({why}); the recorded recipe is used")


_PACKAGE = str(Path(__file__).resolve().parents[1])  # landscape/
_FUNCTOOLS = functools.__file__


def warn_edited(found: RunRecipe) -> None:
    """``found.edited`` (recipe.toml edited after training) as a ``RecipeEditedWarning`` attributed to the first
    caller outside landscape (the notebook's line that read the run); nothing when it was not edited."""
    if not found.edited:
        return
    frame, level = sys._getframe(1), 2  # level 2: the function that called this one
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename == _FUNCTOOLS):
        frame, level = frame.f_back, level + 1
    warnings.warn(RecipeEditedWarning(found.edited), stacklevel=level - 1 if frame is None else level)
