"""``landscape list``: everything a recipe can name and the analysis passes, with their options' defaults."""

from __future__ import annotations

import click


@click.command("list")
def list_command() -> None:
    """List everything a recipe can name (algorithms, data sets, models, partitions) and the analysis passes,
    each with its options' defaults as recipe lines (TOML: paste them into the entry's table)."""
    from landscape.analyze.catalog import load_passes
    from landscape.config.recipe import registries

    headers = [(f"{registry.kind}s ([{section}] name = ...):", registry)
               for section, registry in registries().items()]
    headers.append(("analysis passes (landscape analyze --passes NAME --set NAME.option=...):",
                    load_passes()))
    for header, registry in headers:
        click.echo(header)
        for entry in registry.entries():
            click.echo(f"  {entry.name:<14} {entry.summary}")
            for line in _toml_lines(entry.option_defaults()):
                click.echo(" " * 17 + line)
        click.echo("")


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
