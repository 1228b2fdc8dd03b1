"""``kubetune data inspect``: what a dataset looks like to training, before anything trains.

:func:`inspect_source` runs the same reading, checking, rendering and tokenization as a job (so what
it reports is what training gets) and returns a plain dict: format, row counts, malformed rows,
token-length statistics with a histogram, rows over the maximum length, and one rendered example split
into trained and untrained segments. :func:`render_text` formats that dict for a terminal.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..redact import redact_uri
from ..spec import TuneJob
from .encode import IGNORE, STATUS
from .readers import list_files, where

__all__ = ["inspect_source", "inspect_preference"]

HISTOGRAM_BINS = 10


def inspect_source(job: TuneJob, tokenizer: Any, source: Path, *, log: Callable[[str], None] = lambda m: None) -> dict:
    """Inspect ``source`` as ``job`` would prepare it (``job.dataset`` settings, ``training.max_seq_length``).

    Returns:
        A JSON-serialisable report with at least ``format``, ``rows`` and ``bad_rows``.

    Raises:
        DataError: as preparation would (``file:line`` of the first malformed row unless skipping).
    """
    import numpy as np

    from .cache import cache_root
    from .prepare import SourceInput, _num_proc, choose_template, encode_sources

    if job.method.preference:  # prompt / chosen / rejected pairs (method.objective dpo, orpo)
        return inspect_preference(job, tokenizer, source)

    ds = job.dataset
    sf = list_files(source, split=ds.split)
    inp = SourceInput(Path(source), ds.source, ds.format, dict(ds.columns), ds.split)
    template, template_error, template_lines = choose_template(tokenizer, ds.chat_template)
    work = Path(tempfile.mkdtemp(prefix=".inspect-", dir=cache_root()))
    try:
        table, report = encode_sources(
            tokenizer, template, [inp], [sf], job, work / "rows.arrow",
            template_error=template_error, num_proc=_num_proc(ds.num_proc, [sf]), log=log,
        )  # fmt: skip
        cols = {c: table.data.column(c).to_numpy() for c in ("_full_len", "_trained", "_status")}
        full_len, status = cols["_full_len"], cols["_status"]
        limit = job.training.max_seq_length
        src = report["sources"][0]
        out: dict[str, Any] = {
            "source": inp.label,  # the URI as given, credentials masked
            "format": src["format"],
            "files": len(sf.files),
            "rows": int(len(table)),
            "bad_rows": report["bad_rows"],
            "bad_examples": report["bad_examples"],
            "chat_template": getattr(template, "name", None) if report["chat_rows"] else None,
            "end_of_turn": getattr(template, "eot", None) if report["chat_rows"] else tokenizer.eos_token,
            "max_seq_length": limit,
            "tokens": _length_stats(full_len),
            "trained_tokens": int(cols["_trained"].sum()),
            "histogram": _histogram(full_len, limit),
            "over_max_length": int((full_len > limit).sum()),
            "length_handling": ds.length_handling,
            "nothing_trained": int((status == STATUS["nothing_trained"]).sum()),
            "empty_answers": report["empty_answers"],
            "prefix_inconsistent_rows": report["prefix_inconsistent"],
            "eos_inserted_rows": report["eos_inserted"],
            "notes": [ln.removeprefix("warning: ") for ln in template_lines] if report["chat_rows"] else [],
            "example": None,
        }
        ok = np.nonzero(status <= STATUS["truncated"])[0]
        if len(ok):
            i = int(ok[0])
            row = table[i]
            fi = int(table.data.column("_file")[i].as_py())
            out["example"] = {
                "where": where(str(sf.files[fi]), int(row["_line"]), sf.kinds[fi]),
                "segments": _segments(tokenizer, row["input_ids"], row["labels"]),
            }
        del table
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def inspect_preference(job: TuneJob, tokenizer: Any, source: Path) -> dict:
    """``kubetune data inspect`` for preference data: format, rows, malformed rows, lengths, and one pair with
    its prompt, chosen and rejected tokens (trained tokens marked)."""
    import numpy as np

    from .preference import PairEncoder, read_pairs
    from .prepare import choose_template

    ds = job.dataset
    template, template_error, template_lines = choose_template(tokenizer, ds.chat_template)
    encoder = PairEncoder(tokenizer, template, template_error=template_error or "the tokenizer has no chat template")
    rows, report = read_pairs(Path(source), ds.source, job, encoder, split=ds.split)
    limit = job.training.max_seq_length
    lengths = np.array([r["full_len"] for r in rows], dtype=np.int64)
    out: dict[str, Any] = {
        "source": redact_uri(ds.source),
        "format": report["format"],
        "objective": job.method.objective,
        "rows": len(rows),
        "bad_rows": report["bad_rows"],
        "bad_examples": report["bad_examples"],
        "chat_template": getattr(template, "name", None) if encoder.chat_rows else None,
        "max_seq_length": limit,
        "tokens": _length_stats(lengths),
        "trained_tokens": int(sum(len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows)),
        "histogram": _histogram(lengths, limit),
        "over_max_length": int((lengths > limit).sum()) if len(lengths) else 0,
        "prompt_too_long": sum(len(r["prompt_ids"]) >= limit for r in rows),
        "length_handling": ds.length_handling,
        "notes": [ln.removeprefix("warning: ") for ln in template_lines] if encoder.chat_rows else [],
        "example": None,
    }
    if rows:
        r = rows[0]
        decode = tokenizer.decode
        out["example"] = {
            "where": r["where"],
            "pair": {
                "prompt": [{"text": decode(r["prompt_ids"]), "trained": False}],
                "chosen": [{"text": decode(r["chosen_ids"]), "trained": True}],
                "rejected": [{"text": decode(r["rejected_ids"]), "trained": True}],
            },
        }
    return out


def _length_stats(lengths: Any) -> dict:
    import numpy as np

    if not len(lengths):
        return {"min": 0, "max": 0, "mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "total": 0}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99]).tolist()
    return {
        "min": int(lengths.min()),
        "max": int(lengths.max()),
        "mean": round(float(lengths.mean()), 1),
        "p50": int(p50),
        "p90": int(p90),
        "p99": int(p99),
        "total": int(lengths.sum()),
    }


def _histogram(lengths: Any, limit: int) -> list[dict]:
    """Rows per token-length bin; the last bin starts at the maximum length when rows exceed it."""
    import numpy as np

    if not len(lengths):
        return []
    low, top = int(lengths.min()), int(max(lengths.max(), 1))
    edges = np.unique(np.linspace(min(low, limit), min(top, limit), HISTOGRAM_BINS + 1).round().astype(int))
    if top > limit:
        edges = np.append(edges, top)
    if len(edges) < 2:
        edges = np.array([low, low + 1])
    counts, _ = np.histogram(lengths, bins=edges)
    return [{"from": int(a), "to": int(b), "rows": int(c)} for a, b, c in zip(edges[:-1], edges[1:], counts)]


def _segments(tokenizer: Any, ids: list[int], labels: list[int]) -> list[dict]:
    """The example as runs of untrained and trained tokens, decoded."""
    segs: list[dict] = []
    run: list[int] = []
    trained = None
    for tid, lab in zip(ids, labels):
        t = lab != IGNORE
        if trained is not None and t != trained:
            segs.append({"text": tokenizer.decode(run), "trained": trained})
            run = []
        run.append(tid)
        trained = t
    if run:
        segs.append({"text": tokenizer.decode(run), "trained": bool(trained)})
    return segs
