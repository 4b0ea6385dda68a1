"""``landscape list``: everything a recipe can name and the analysis passes, with their options' defaults."""

from __future__ import annotations

import shutil
import textwrap

import click

from landscape.core.errors import LandscapeError

# the kinds `landscape list KIND` takes (plural or singular), in the order they are printed
KINDS = ("datasets", "partitions", "models", "algorithms", "passes")


@click.command("list")
@click.argument("what", nargs=-1)
def list_command(what: tuple[str, ...]) -> None:
    """List everything a recipe can name (algorithms, data sets, models, partitions) and the analysis passes,
    each with its options' defaults as recipe lines (TOML: paste them into the entry's table).

    WHAT narrows the list: kinds (datasets, partitions, models, algorithms, passes) or entries' names, e.g.
    `landscape list algorithms`, `landscape list fedsam hessian`."""
    sections = _sections()
    chosen = _choose(sections, what)
    rows = [entry for _, _, entries in chosen for entry in entries]
    column = 2 + max(len(entry.name) for entry in rows) + 2  # the summaries' column: after the longest name
    width = max(shutil.get_terminal_size((100, 24)).columns, column + 40)
    for header, _, entries in chosen:
        click.echo(header)
        for entry in entries:
            summary = textwrap.wrap(entry.summary, width - column) or [""]
            click.echo(f"  {entry.name:<{column - 2}}{summary[0]}".rstrip())
            for line in summary[1:]:
                click.echo(" " * column + line)
            for line in _toml_lines(entry.option_defaults()):  # the options two further in
                click.echo(" " * (column + 2) + line)
        click.echo("")


def _sections() -> list[tuple[str, str, list]]:
    """(header, kind, entries) of every registry a recipe names and of the passes, in KINDS' order."""
    from landscape.analyze.catalog import load_passes
    from landscape.config.recipe import registries

    found = [(f"{registry.kind}s ([{section}] name = ...):", f"{section}s", list(registry.entries()))
             for section, registry in registries().items()]
    found.append(("analysis passes (landscape analyze --passes NAME --set NAME.option=...):", "passes",
                  list(load_passes().entries())))
    return sorted(found, key=lambda section: KINDS.index(section[1]))


def _choose(sections: list[tuple[str, str, list]], what: tuple[str, ...]) -> list[tuple[str, str, list]]:
    """The sections and entries ``what`` names (kinds, singular or plural, and entries' names); all of them
    when it is empty. A word that names nothing is refused in one line."""
    if not what:
        return sections
    spellings = {word: kind for kind in KINDS for word in (kind, kind.removesuffix("es"), kind[:-1])}
    kinds = {spellings[word] for word in what if word in spellings}
    names = {entry.name for _, _, entries in sections for entry in entries}
    unknown = [word for word in what if word not in names and word not in spellings]
    if unknown:
        raise LandscapeError(f"nothing named '{unknown[0]}' to list; give kinds ({', '.join(KINDS)}) or the names "
                             "of entries (landscape list shows them all)")
    return [(header, kind, entries if kind in kinds else [e for e in entries if e.name in what])
            for header, kind, entries in sections
            if kind in kinds or any(e.name in what for e in entries)]


def _toml_lines(values: dict, prefix: str = "") -> list[str]:
    """``key = value`` lines as a recipe writes them (true, "gn", [200, 200], 0.1; tables as dotted keys)."""
    from landscape.config.recipe import toml_value

    lines = []
    for key, value in values.items():
        if isinstance(value, dict):  # an empty one is the empty inline table
            lines += _toml_lines(value, f"{prefix}{key}.") if value else [f"{prefix}{key} = {{}}"]
            continue
        try:
            lines.append(f"{prefix}{key} = {toml_value(value)}")
        except TypeError:  # e.g. None: TOML has no such value
            lines.append(f"# {prefix}{key}: {value!r} (no TOML form; not settable in a recipe)")
    return lines
