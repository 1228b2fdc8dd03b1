"""CLI commands for datasets: ``kubetune data inspect``.

Light at import (typer only); the data pipeline, tokenizers and datasets load inside the command.
"""

from __future__ import annotations

from typing import Any, List, Optional

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``data`` sub-app to the main ``kubetune`` app."""
    data = typer.Typer(help="Look at datasets the way training sees them.", no_args_is_help=True)
    data.command("inspect")(inspect)
    app.add_typer(data, name="data")


def inspect(
    source: str = typer.Argument(..., help="Dataset: a file, a directory, a save_to_disk folder, or a URI (hf://, s3://, https://)."),
    model: str = typer.Option("builtin://tiny-chat", "--model", "-m", help="Model whose tokenizer and chat template to use."),
    format: str = typer.Option(
        "auto", "--format", "-f", help="Row format: auto, messages, sharegpt, prompt_completion, alpaca, text, preference, preference_implicit."
    ),
    objective: str = typer.Option(
        "auto", "--objective", help="sft, dpo or orpo; auto: dpo when the rows are preference pairs (chosen/rejected), else sft."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    max_seq_length: Optional[int] = typer.Option(None, "--max-seq-length", help="Maximum length in tokens (default: the spec's default)."),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="Named chat template (default: the tokenizer's own)."),
    column: List[str] = typer.Option([], "--column", help="Map a column, kubetune name=yours, e.g. --column prompt=question (repeatable)."),
    split: Optional[str] = typer.Option(None, "--split", help="Split of a Hub dataset, saved DatasetDict or split-named files."),
    on_bad_rows: str = typer.Option("error", "--on-bad-rows", help="error: stop at the first malformed row; skip: count them."),
    train_on_inputs: bool = typer.Option(False, "--train-on-inputs", help="Train on prompt tokens too."),
) -> None:
    """Show a dataset's format, rows, malformed rows, token lengths and one example with its trained tokens."""
    import json

    from ..errors import SpecError
    from ..spec import load_spec

    dataset: dict = {"source": source, "format": format, "on_bad_rows": on_bad_rows, "train_on_inputs": train_on_inputs, "cache": False}
    if chat_template:
        dataset["chat_template"] = chat_template
    if split:
        dataset["split"] = split
    if column:
        cols = {}
        for item in column:
            key, sep, val = item.partition("=")
            if not sep or not key or not val:
                raise SpecError(f"--column '{item}': expected KUBETUNE_NAME=YOUR_NAME, e.g. --column prompt=question")
            cols[key] = val
        dataset["columns"] = cols
    spec: dict = {"name": "inspect", "model": {"source": model}, "dataset": dataset}
    if max_seq_length is not None:
        spec["training"] = {"max_seq_length": max_seq_length}
    from ..storage import fetch

    if objective == "auto":
        from pathlib import Path

        from ..data.preference import looks_like_preference
        from ..data.preference_formats import PREFERENCE_FORMATS

        job = load_spec(spec)
        preference = format in PREFERENCE_FORMATS or (
            format == "auto" and looks_like_preference(Path(fetch(job.dataset.source)), dict(job.dataset.columns), split=job.dataset.split)
        )
        objective = "dpo" if preference else "sft"
    spec["method"] = {"objective": objective}
    job = load_spec(spec)

    from transformers import AutoTokenizer

    from ..data.inspect import inspect_source

    tokenizer = AutoTokenizer.from_pretrained(fetch(job.model.pinned_source), trust_remote_code=job.model.trust_remote_code)
    report = inspect_source(job, tokenizer, fetch(job.dataset.source))
    if json_out:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    from rich.console import Console

    Console(highlight=False).print(render_report(report))


def render_report(report: dict) -> Any:
    """The report as rich renderables for a terminal (trained tokens highlighted in the example)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if report.get("objective") in ("dpo", "orpo"):
        return _render_preference(report)
    parts: list[Any] = []
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    tok = report["tokens"]
    rows = [
        ("source", str(report["source"])),
        ("format", f"{report['format']} ({report['files']} file{'s' if report['files'] != 1 else ''})"),
        ("rows", f"{report['rows']} usable, {report['bad_rows']} malformed"),
        ("chat template", f"{report['chat_template'] or '-'} (answers end with {report['end_of_turn']})"),
        ("tokens per row", f"min {tok['min']}  p50 {tok['p50']}  mean {tok['mean']}  p90 {tok['p90']}  p99 {tok['p99']}  max {tok['max']}"),
        ("tokens", f"{tok['total']} in all, {report['trained_tokens']} trained"),
        (
            "over max length",
            f"{report['over_max_length']} rows over {report['max_seq_length']} tokens (length_handling: {report['length_handling']})",
        ),
    ]
    if report["nothing_trained"]:
        rows.append(("nothing trained", f"{report['nothing_trained']} rows lose every trained token when cut"))
    if report["empty_answers"]:
        rows.append(("empty answers", f"{report['empty_answers']} rows (only the end-of-turn token is trained)"))
    for k, v in rows:
        head.add_row(k, v)
    parts.append(head)
    for ex in report["bad_examples"]:
        parts.append(Text(f"  malformed: {ex}", style="yellow"))
    for note in report["notes"]:
        parts.append(Text(f"  note: {note}", style="yellow"))
    if report["histogram"]:
        parts.append(Text("\ntoken lengths", style="bold"))
        peak = max(b["rows"] for b in report["histogram"]) or 1
        for b in report["histogram"]:
            bar = "█" * max(1 if b["rows"] else 0, round(30 * b["rows"] / peak))
            over = b["from"] >= report["max_seq_length"]
            parts.append(Text.assemble((f"  {b['from']:>6}-{b['to']:<6} ", ""), (bar, "red" if over else "cyan"), f" {b['rows']}"))
    ex = report.get("example")
    if ex:
        parts.append(Text.assemble(("\nexample ", "bold"), (ex["where"], "dim"), (" (trained tokens in green)", "dim")))
        body = Text()
        for seg in ex["segments"]:
            body.append(seg["text"], style="bold green" if seg["trained"] else "dim")
        parts.append(body)
    return Group(*parts)


def _render_preference(report: dict) -> Any:
    """A preference report: the pair's prompt (never trained), chosen and rejected answers (trained)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    tok = report["tokens"]
    for k, v in (
        ("source", str(report["source"])),
        ("format", f"{report['format']} (preference pairs for {report['objective']})"),
        ("rows", f"{report['rows']} usable pairs, {report['bad_rows']} malformed"),
        ("chat template", report["chat_template"] or "-"),
        ("tokens per pair", f"prompt + longer answer: min {tok['min']}  p50 {tok['p50']}  p90 {tok['p90']}  max {tok['max']}"),
        ("trained tokens", f"{report['trained_tokens']} (chosen and rejected answers; prompts are never trained)"),
        ("over max length", f"{report['over_max_length']} pairs over {report['max_seq_length']} tokens, "
                            f"{report['prompt_too_long']} whose prompt alone reaches it (dropped)"),
    ):
        head.add_row(k, v)
    parts: list[Any] = [head]
    for ex in report["bad_examples"]:
        parts.append(Text(f"  malformed: {ex}", style="yellow"))
    for note in report["notes"]:
        parts.append(Text(f"  note: {note}", style="yellow"))
    ex = report.get("example")
    if ex:
        parts.append(Text.assemble(("\nexample ", "bold"), (ex["where"], "dim"), (" (trained tokens in green)", "dim")))
        for side, label in (("prompt", "prompt (not trained)"), ("chosen", "chosen"), ("rejected", "rejected")):
            body = Text.assemble((f"{label}: ", "bold"))
            for seg in ex["pair"][side]:
                body.append(seg["text"], style="bold green" if seg["trained"] else "dim")
            parts.append(body)
    return Group(*parts)
