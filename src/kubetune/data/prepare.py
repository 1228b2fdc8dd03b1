"""Turn a dataset source into tokenized ``input_ids``/``labels`` rows ready for the trainer.

Loss masking works on characters: each conversation is rendered once with the chat template, the
character spans of the trained answers (content plus the end-of-turn token) are found by rendering the
prefix before each answer, and tokens whose characters fall inside a span keep their label; all others
get -100.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import DataError
from ..spec import TuneJob

IGNORE = -100
_DATA_SUFFIXES = (".jsonl", ".json")


@dataclass
class Prepared:
    """Tokenized training (and evaluation) rows plus what happened to the input."""

    train: Any  # datasets.Dataset with input_ids, labels
    eval: Any | None
    stats: dict = field(default_factory=dict)


def prepare_datasets(
    job: TuneJob,
    tokenizer: Any,
    *,
    source: Path,
    eval_source: Path | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> Prepared:
    """Read, split, render and tokenize the job's dataset.

    Raises:
        DataError: unreadable file, unknown format, malformed row (with file:line).
    """
    from datasets import Dataset

    ds = job.dataset
    rows, bad = _read_rows(source, ds.on_bad_rows)
    if not rows:
        raise DataError(f"{source}: no rows found", hint="point dataset.source at a JSONL/JSON file with one example per row")
    fmt = _detect(rows, ds.format, source)
    rng = random.Random(job.training.seed)
    if ds.max_rows:
        rng.shuffle(rows)
        rows = rows[: ds.max_rows]
    eval_rows: list[tuple[str, int, dict]] = []
    if eval_source is not None:
        eval_rows, _ = _read_rows(eval_source, ds.on_bad_rows)
    elif ds.eval_split:
        order = list(range(len(rows)))
        rng.shuffle(order)
        n_eval = max(1, round(len(rows) * ds.eval_split))
        held = set(order[:n_eval])
        eval_rows = [rows[i] for i in sorted(held)]
        rows = [r for i, r in enumerate(rows) if i not in held]

    stats = {"format": fmt, "rows": len(rows), "eval_rows": len(eval_rows), "bad_rows": bad, "truncated": 0, "dropped": 0}

    def encode(items: list[tuple[str, int, dict]]) -> dict:
        out: dict[str, list] = {"input_ids": [], "labels": []}
        for where, line, row in items:
            ids, labels = _encode_row(row, fmt, tokenizer, job, f"{where}:{line}")
            if len(ids) > job.training.max_seq_length:
                if ds.length_handling == "drop":
                    stats["dropped"] += 1
                    continue
                stats["truncated"] += 1
                ids, labels = ids[: job.training.max_seq_length], labels[: job.training.max_seq_length]
            if all(x == IGNORE for x in labels):
                stats["dropped"] += 1
                continue
            out["input_ids"].append(ids)
            out["labels"].append(labels)
        return out

    train = Dataset.from_dict(encode(rows))
    evald = Dataset.from_dict(encode(eval_rows)) if eval_rows else None
    stats["train_tokens"] = sum(len(x) for x in train["input_ids"])
    log(f"prepared {len(train)} training rows ({fmt}), {len(evald) if evald else 0} eval rows, {stats['train_tokens']} tokens")
    return Prepared(train=train, eval=evald, stats=stats)


# --- reading ---------------------------------------------------------------------------------
def _files(source: Path) -> list[Path]:
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix in _DATA_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"{source}: directory has no {'/'.join(_DATA_SUFFIXES)} files")
        return files
    if not source.exists():
        raise DataError(f"{source}: dataset not found", hint="check dataset.source")
    return [source]


def _read_rows(source: Path, on_bad: str) -> tuple[list[tuple[str, int, dict]], int]:
    rows: list[tuple[str, int, dict]] = []
    bad = 0
    for f in _files(source):
        text = f.read_text(encoding="utf-8")
        if f.suffix == ".json" and text.lstrip().startswith("["):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{f}:{e.lineno}: invalid JSON: {e.msg}") from None
            rows.extend((str(f), i + 1, r) for i, r in enumerate(data))
            continue
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            except (json.JSONDecodeError, ValueError) as e:
                if on_bad == "skip":
                    bad += 1
                    continue
                raise DataError(f"{f}:{i}: malformed row: {e}", hint="fix the row or set dataset.on_bad_rows: skip") from None
            rows.append((str(f), i, row))
    return rows, bad


def _detect(rows: list[tuple[str, int, dict]], fmt: str, source: Path) -> str:
    if fmt != "auto":
        return fmt
    found = set()
    for where, line, row in rows:
        if "messages" in row:
            found.add("messages")
        elif "prompt" in row and "completion" in row:
            found.add("prompt_completion")
        else:
            raise DataError(f"{where}:{line}: row matches no supported format (keys: {', '.join(sorted(row)) or 'none'})")
    if len(found) > 1:
        raise DataError(f"{source}: rows of different formats: {', '.join(sorted(found))}")
    return found.pop()


# --- encoding --------------------------------------------------------------------------------
def _encode_row(row: dict, fmt: str, tokenizer: Any, job: TuneJob, where: str) -> tuple[list[int], list[int]]:
    if fmt == "messages":
        msgs = row.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
            raise DataError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        return _encode_chat(msgs, tokenizer, job.dataset.train_on_inputs, where)
    if fmt == "prompt_completion":
        prompt, completion = row.get("prompt"), row.get("completion")
        if isinstance(prompt, list) and isinstance(completion, list):
            return _encode_chat(prompt + completion, tokenizer, job.dataset.train_on_inputs, where)
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise DataError(f"{where}: 'prompt' and 'completion' must both be strings or both message lists")
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        labels = (list(p) if job.dataset.train_on_inputs else [IGNORE] * len(p)) + list(c)
        return list(p) + list(c), labels
    raise DataError(f"{where}: dataset.format '{fmt}' is not supported yet")


def _encode_chat(msgs: list[dict], tokenizer: Any, train_on_inputs: bool, where: str) -> tuple[list[int], list[int]]:
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    eos = tokenizer.eos_token or ""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        prefix = tokenizer.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True) if i else ""
        start = len(prefix)
        if not text.startswith(prefix):
            raise DataError(f"{where}: the chat template renders this conversation inconsistently prefix by prefix")
        end = text.find(eos, start + len(m["content"])) if eos else -1
        end = end + len(eos) if end >= 0 else start + len(m["content"])
        spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if train_on_inputs:
        return ids, list(ids)
    labels = []
    for tid, (a, b) in zip(ids, enc["offset_mapping"]):
        inside = any(a >= s and b <= e and b > a for s, e in spans)
        labels.append(tid if inside else IGNORE)
    return ids, labels
