"""CLI commands for datasets: ``kubetune data inspect``.

Light at import (typer only); the data pipeline, tokenizers and datasets load inside the command.
"""

from __future__ import annotations

from typing import List, Optional

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
    format: str = typer.Option("auto", "--format", "-f", help="Row format: auto, messages, sharegpt, prompt_completion, alpaca, text."),
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
    job = load_spec(spec)

    from transformers import AutoTokenizer

    from ..data.inspect import inspect_source, render_text
    from ..worker import materialize

    tokenizer = AutoTokenizer.from_pretrained(materialize(job.model.source), trust_remote_code=job.model.trust_remote_code)
    report = inspect_source(job, tokenizer, materialize(job.dataset.source))
    if json_out:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    from rich.console import Console

    Console(highlight=False).print(render_text(report))
