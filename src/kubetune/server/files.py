"""Checking an uploaded fine-tuning file the way training reads it: JSONL, one object a line, each row in a
format kubetune knows (messages, conversations, prompt/completion, alpaca, text) and well formed. The first
problem is reported with ``filename:line``, as ``kubetune data inspect`` names rows."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.formats import RowError, describe_keys, detect, inner_keys, normalize

__all__ = ["check_training_file", "MAX_REPORTED"]

MAX_REPORTED = 1


def check_training_file(path: Path, filename: str) -> tuple[int, str | None]:
    """Rows and format of an uploaded JSONL file.

    Returns:
        ``(rows, None)`` when every row is usable, else ``(rows_read, "filename:line: what is wrong")``.
    """
    keys = inner_keys({})
    fmt: str | None = None
    rows = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{filename}:{n}"
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                return rows, f"{where}: not valid JSON ({e.msg if hasattr(e, 'msg') else e}); a fine-tuning file is JSONL, one JSON object a line"
            if not isinstance(row, dict):
                return rows, f"{where}: {describe_keys(row)}"
            found = detect(row)
            if found is None:
                return rows, f"{where}: {describe_keys(row)}"
            if fmt is None:
                fmt = found
            elif found != fmt:
                return rows, f"{where}: a {found} row in a file of {fmt} rows (line 1's format); use one format per file"
            try:
                normalize(row, fmt, keys, train_on_inputs=False)
            except RowError as e:
                return rows, f"{where}: {e}"
            rows += 1
    if rows == 0:
        return 0, f"{filename}: no rows (the file is empty)"
    return rows, None
