"""``landscape analyze``'s request made whole (``analysis_request``): the flags, an analysis recipe and ``--set``
merged by precedence (``--set`` over the flags given on the command line over the recipe over the flags'
defaults), the passes chosen and their options checked, ready for ``analyze.scheduler.run_analysis`` (or the
dry run's plan). The command line parses, calls this and prints; a notebook can call it too."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from landscape.analyze.catalog import default_passes, load_passes, pass_options
from landscape.analyze.recipes import load_analysis_recipe
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.core.errors import LandscapeError, shown
from landscape.core.imports import imports_trusted
from landscape.core.rounds import ALL, Rounds


@dataclass(frozen=True)
class AnalysisRequest:
    """What one analysis runs: the checkpoints (``rounds``: a ``Rounds``; of plain state_dicts also a comma list of
    their names, ``StateDictSource.select``), the passes in order, each pass's checked options, the settings, and
    the model and data of plain state_dicts (``foreign``, or None)."""

    rounds: Rounds | str
    passes: list[str]
    options: dict[str, Any]
    settings: AnalysisSettings
    foreign: Any


def analysis_request(*, path: Path, flags: dict[str, Any], given: set[str], recipe: Path | None,
                     checkpoints: str, passes: str | None, assignments: tuple[str, ...],
                     surface_flags: dict[str, str], model_spec: str | None,
                     dataset_spec: str | None) -> AnalysisRequest:
    """The request of ``landscape analyze`` on ``path``: ``flags`` the analysis settings as the flags hold them
    (defaults included), ``given`` the names of those given on the command line, ``recipe`` an analysis recipe's
    path, ``assignments`` the ``--set`` texts, ``surface_flags`` the surface pass's flags that were given.

    Where the runs' imports are trusted (``--trust-imports``), their recipes are read first, so that the passes
    their modules declare are known when the pass names and options are checked."""
    foreign = _state_dict_model(model_spec, dataset_spec)
    if foreign is None and imports_trusted():
        find_sources(Path(path))  # reading the recipes trusted imports their modules
    analysis = load_analysis_recipe(recipe) if recipe is not None else None
    chosen = dict(flags)
    set_settings, set_options = _set_kinds(assignments)
    if analysis is not None:
        chosen.update({k: v for k, v in analysis.settings.items() if k not in given})
        if analysis.passes is not None and passes is None:
            passes = ",".join(analysis.passes)
    chosen.update(set_settings)
    rounds = _checkpoints(checkpoints, "checkpoints" in given, analysis, foreign is not None)
    samples = chosen["analysis_samples"]  # of the flag: named so (--set and recipe values: AnalysisSettings)
    if "analysis_samples" not in set_settings and isinstance(samples, int) and not isinstance(samples, bool) \
            and samples < 0:
        raise LandscapeError(f"--analysis-samples must be >= 0 (got {chosen['analysis_samples']})")
    names = _pass_names(passes, surface_flags, set_options, foreign is not None)
    _check_declared(names, None if foreign is not None else Path(path))
    values = _pass_values(names, analysis.options if analysis else {}, surface_flags, set_options)
    options = {name: pass_options(name, values[name]) for name in names}
    return AnalysisRequest(rounds, names, options, AnalysisSettings(**chosen), foreign)


def _checkpoints(flag: str, given: bool, recipe: Any, state_dict: bool) -> Rounds | str:
    """The checkpoints to analyse, parsed here (``Rounds``): --checkpoints where given, else the analysis recipe's
    rounds, else last (every file of plain state_dicts: a folder of them is analysed whole unless --checkpoints
    picks some). Of plain state_dicts, a spec that is no ``Rounds`` stays text: a comma list of the files'
    names, checked against the files (``StateDictSource.select``); a run refuses it in one line."""
    if given:
        spec, where = flag, "--checkpoints"
    elif recipe is not None and recipe.rounds is not None:
        spec, where = recipe.rounds, f"{recipe.path}: rounds"
    else:
        return Rounds(ALL) if state_dict else Rounds.parse(flag, "--checkpoints")
    try:
        return Rounds.parse(spec, where)
    except LandscapeError:
        if state_dict:
            return spec
        raise


def _state_dict_model(model_spec: str | None, dataset_spec: str | None) -> Any:
    """The model and data of a plain state_dict (--model and --dataset, both or neither), or None."""
    from landscape.analyze.state_dict_source import ForeignModel

    if (model_spec is None) != (dataset_spec is None):
        raise LandscapeError("a plain state_dict needs both --model and --dataset")
    return ForeignModel(model_spec, dataset_spec) if model_spec is not None else None


def state_dict_passes() -> list[str]:
    """The default passes that need nothing of a run but its model (a plain state_dict has no clients)."""
    registry = load_passes()
    return [name for name in default_passes() if not registry.get(name).needs]


def _pass_names(passes: str | None, surface_flags: dict[str, str], set_options: list[tuple[str, Any]],
                state_dict: bool) -> list[str]:
    """The passes to run: --passes (a comma list), else the surface pass when a surface flag is given and
    each pass that runs only when named (``opt_in``: the surface pass) whose option --set gives (naming its
    options names it), else the default passes (on a plain state_dict, which has no clients, those that need
    none)."""
    if passes is not None:
        names = [p.strip() for p in passes.split(",") if p.strip()]
        if not names:
            raise LandscapeError(f"--passes {shown(passes)!r} names no pass; give a comma list of: "
                                 f"{', '.join(load_passes().names())} (or leave --passes out for the "
                                 "default)")
        return names
    registry = load_passes()
    named = [name for name in dict.fromkeys(key.partition(".")[0] for key, _ in set_options)
             if name in registry and registry.get(name).opt_in]
    chosen = list(dict.fromkeys((["surface"] if surface_flags else []) + named))
    if chosen:
        return chosen
    return state_dict_passes() if state_dict else default_passes()


def _check_declared(names: list[str], path: Path | None) -> None:
    """Each pass named is declared: one line otherwise, naming the modules the runs' recipes import (not imported
    without --trust-imports) where they may declare it."""
    registry = load_passes()
    unknown = [name for name in names if name not in registry]
    if not unknown:
        return
    hint = ""
    if path is not None and not imports_trusted():
        modules = sorted({m for source in _readable_sources(path) for m in source.recipe.imports})
        if modules:
            hint = (f"; the runs' recipes import {', '.join(modules)}, which may declare it: pass --trust-imports "
                    "if you trust that code")
    raise LandscapeError(f"unknown analysis pass '{unknown[0]}'; choose from: {', '.join(registry.names())}{hint}")


def _readable_sources(path: Path) -> list[Any]:
    """The runs under ``path`` (none where there are none to read: the analysis itself then says why)."""
    try:
        return find_sources(path)[0]
    except LandscapeError:
        return []


def _set_kinds(assignments: tuple[str, ...]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The --set keys by their kind (``overrides.classify_assignment``, one grammar for every command): analysis
    settings (analyze.<setting>) and pass options (<pass>.<option>); a training recipe key is refused naming the
    commands that take it."""
    from landscape.config.overrides import ANALYSIS_SETTING, classify_assignment, parse_assignment
    from landscape.core.schema import unknown_key_message

    allowed = [f.name for f in fields(AnalysisSettings)]
    settings: dict[str, Any] = {}
    options: list[tuple[str, Any]] = []
    for key, value in map(parse_assignment, assignments):
        if classify_assignment(key, load_passes().names, "analyze") != ANALYSIS_SETTING:
            options.append((key, value))
        elif key.partition(".")[2] not in allowed:
            raise LandscapeError(unknown_key_message(key, allowed, "in [analyze]", "analysis setting"))
        else:
            settings[key.partition(".")[2]] = value
    return settings, options


def _pass_values(names: list[str], recipe_options: dict[str, dict], surface_flags: dict[str, str],
                 assignments: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each chosen pass's option values as given: the analysis recipe's, the surface flags, then --set."""
    values: dict[str, dict] = {name: dict(recipe_options.get(name, {})) for name in names}
    if surface_flags:
        if "surface" not in values:
            raise LandscapeError("--directions, --grid, --span and --data set the surface pass; add it: "
                                 "--passes surface")
        values["surface"].update(surface_flags)
    for key, value in assignments:
        pass_name, _, option = key.partition(".")
        if pass_name not in values or not option:
            raise LandscapeError(f"--set takes PASS.KEY=VALUE for a chosen pass ({', '.join(names)}); "
                                 f"got '{key}'")
        values[pass_name][option] = value
    return values
