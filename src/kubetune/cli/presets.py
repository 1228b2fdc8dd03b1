"""Training commands of the CLI: ``kubetune presets``.

Registered by :mod:`kubetune.cli`; imports stay light (YAML only) so ``kubetune --help`` stays fast.
"""

from __future__ import annotations

from typing import Optional

import typer

__all__ = ["register"]


def presets(
    name: Optional[str] = typer.Argument(None, help="Show one preset in full (lora, qlora, dora, full; objectives dpo, orpo)."),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="FORMAT", help="table (the list's default), yaml (one preset's default) or json: every preset, or the one named, as data."),
) -> None:
    """List the method presets: the defaults each method.type starts from (a spec overrides them field by field)."""
    from rich.console import Console
    from rich.table import Table

    from ..errors import SpecError
    from ..presets import architectures, load_objective, load_preset, objective_names, preset_names, preset_values
    from ._output import check_output_format, print_data

    fmt = check_output_format(output or ("yaml" if name else "table"), ("table", "json", "yaml"))
    if name is not None:
        if name not in preset_names() + objective_names():
            raise SpecError(f"no preset '{name}'", hint="available: " + ", ".join(preset_names() + objective_names()))
        if fmt == "table":
            raise SpecError("-o table lists every preset; one preset is shown as yaml or json", hint=f"kubetune presets {name} -o json")
        print_data(load_preset(name) if name in preset_names() else load_objective(name), fmt)
        return
    if fmt != "table":  # every preset and objective as data: {"methods": {name: preset}, "objectives": {name: preset}}
        print_data({"methods": {n: load_preset(n) for n in preset_names()}, "objectives": {n: load_objective(n) for n in objective_names()}}, fmt)
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
