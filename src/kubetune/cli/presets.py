"""Training commands of the CLI: ``kubetune presets``.

Registered by :mod:`kubetune.cli`; imports stay light (YAML only) so ``kubetune --help`` stays fast.
"""

from __future__ import annotations

from typing import Optional

import typer

__all__ = ["register"]


def presets(
    name: Optional[str] = typer.Argument(None, help="Show one preset in full (lora, qlora, dora, full; objectives dpo, orpo)."),
) -> None:
    """List the method presets: the defaults each method.type starts from (a spec overrides them field by field)."""
    import yaml
    from rich.console import Console
    from rich.table import Table

    from ..errors import SpecError
    from ..presets import architectures, load_objective, load_preset, objective_names, preset_names, preset_values

    if name is not None:
        if name not in preset_names() + objective_names():
            raise SpecError(f"no preset '{name}'", hint="available: " + ", ".join(preset_names() + objective_names()))
        typer.echo(yaml.safe_dump(load_preset(name) if name in preset_names() else load_objective(name), sort_keys=False), nl=False)
        return
    names = preset_names()
    values = {n: preset_values(n) for n in names}
    # Wide enough for the whole table: a cut field name or value is useless (a narrow terminal wraps the lines).
    fields = list(dict.fromkeys(path for n in names for path in values[n]))
    shown = [[path, *(_show(values[n].get(path, "-")) for n in names)] for path in fields]
    needed = sum(max(len(row[i]) for row in [["FIELD", *names], *shown]) + 2 for i in range(len(names) + 1))
    out = Console(highlight=False, width=max(Console().width, needed))
    for n in names:
        out.print(f"[bold]{n:<6}[/] {load_preset(n).get('description', '')}")
    table = Table(box=None, pad_edge=False)
    for title in ("FIELD", *names):
        table.add_column(title, no_wrap=True)
    for row in shown:
        table.add_row(*row)
    out.print()
    out.print(table)
    out.print(
        "\nmethod.type picks the preset; set any field in the spec to override it "
        "(kubetune validate SPEC shows each value's source). target_modules attention|mlp presets exist for: "
        + ", ".join(architectures())
    )
    out.print("\nmethod.objective dpo | orpo adds its preset on top (kubetune presets dpo shows one in full):")
    for n in objective_names():
        out.print(f"[bold]{n:<6}[/] {load_objective(n).get('description', '')}")


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def register(app: typer.Typer) -> None:
    """Add the training commands to the kubetune app."""
    app.command("presets")(presets)
