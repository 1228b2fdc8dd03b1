"""Fixtures for the data tests: the tiny-chat tokenizer, a tokenizer with every registry template's
special tokens, and a helper that writes rows to a file and prepares them like a job does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from kubetune.spec import load_spec

IGNORE = -100


@pytest.fixture
def tokenizer(tiny_model):
    """A fresh tiny-chat tokenizer (ChatML template, EOS <|im_end|>); tests may change its template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def multi_tokenizer(tiny_model):
    """The tiny-chat tokenizer plus the special tokens of every registry template, and no template."""
    from transformers import AutoTokenizer

    from kubetune.data.templates import CHAT_TEMPLATES

    tok = AutoTokenizer.from_pretrained(tiny_model)
    extra = sorted({t for tpl in CHAT_TEMPLATES.values() for t in tpl.special_tokens} - set(tok.all_special_tokens))
    tok.add_special_tokens({"additional_special_tokens": extra})
    tok.chat_template = None
    return tok


def write_rows(path: Path, rows: list[Any]) -> Path:
    """Rows as JSON Lines (a str row is written as is, for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return path


def make_job(source: Path | str, *, dataset: dict | None = None, training: dict | None = None):
    spec = {
        "name": "data-test",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(source), "cache": False, **(dataset or {})},
        "training": {"max_seq_length": 256, **(training or {})},
    }
    return load_spec(spec)


@pytest.fixture
def prepare(tokenizer) -> Callable:
    """``prepare(source, dataset={...}, training={...}, tok=None)`` -> Prepared, as the worker would."""
    from kubetune.data import prepare_datasets

    def run(source, *, dataset=None, training=None, tok=None, eval_source=None, mix_sources=None, log=None):
        job = make_job(source, dataset=dataset, training=training)
        return prepare_datasets(
            job,
            tok or tokenizer,
            source=Path(job.dataset.source),
            eval_source=Path(eval_source) if eval_source else None,
            mix_sources=mix_sources,
            log=log or (lambda m: None),
        )

    return run


def trained_runs(tok, ids: list[int], labels: list[int]) -> list[str]:
    """The trained tokens of a row as decoded runs of consecutive trained tokens."""
    runs, cur = [], []
    for tid, lab in zip(ids, labels):
        if lab != IGNORE:
            assert lab == tid
            cur.append(tid)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs
