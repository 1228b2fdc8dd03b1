"""Prepare a job's datasets: read, check, render, mask, tokenize, mix, split, pack and cache.

:func:`prepare_datasets` is the story; the helpers below it each do one step:

1. resolve every source (``dataset.source`` plus ``dataset.mix``) to files, and look up the cache;
2. stream each source through the :class:`~.encode.Encoder` (in worker processes when it pays) into
   one Arrow file, stopping at the first malformed row (``file:line``) unless ``on_bad_rows: skip``;
3. drop rows that are too long (``length_handling: drop``) or have nothing left to train, mix sources
   by weight, apply ``max_rows`` and the evaluation split, all with the job's seed;
4. pack rows into sequences when ``training.packing`` is on;
5. write the result to the cache and return memory-mapped datasets with the statistics.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import DataError
from ..redact import redact_uri
from ..spec import TuneJob
from .encode import STATUS, ChunkResult, EncodeSettings, Encoder
from .formats import FORMATS
from .readers import SourceFiles, content_digest, iter_items, list_files, where

__all__ = ["Prepared", "prepare_datasets", "SourceInput", "encode_sources", "choose_template"]

CHUNK_ROWS = 1000  # rows per tokenizer call and per task sent to a worker process...
CHUNK_BYTES = 16 << 20  # ...and about this many bytes of row text at most (big rows go a few at a time)
PARALLEL_MIN_BYTES = 8 << 20  # below this much source data one process is faster than starting a pool
MAX_PROCS = 8
BAD_EXAMPLES = 5  # bad rows quoted in the statistics when they are skipped
_FORMAT_NAMES = list(FORMATS)


@dataclass
class Prepared:
    """Tokenized training (and evaluation) rows plus what happened to the input.

    ``train``/``eval`` are ``datasets.Dataset`` objects with ``input_ids`` and ``labels`` (-100: not
    trained), and ``seq_lengths`` when packed.
    """

    train: Any
    eval: Any | None
    stats: dict = field(default_factory=dict)


@dataclass
class SourceInput:
    """One local dataset to read, with the settings that apply to it."""

    path: Path
    label: str  # the URI or path as the spec named it, credentials masked: it is shown, logged and cached
    format: str = "auto"
    columns: dict = field(default_factory=dict)
    split: str = "train"
    weight: float | None = None

    def __post_init__(self) -> None:
        self.label = redact_uri(self.label)  # stats.json in the data cache and result.json record it


def prepare_datasets(
    job: TuneJob,
    tokenizer: Any,
    *,
    source: Path,
    eval_source: Path | None = None,
    mix_sources: list[Path] | None = None,
    log: Callable[[str], None] = lambda m: None,
    warn: Callable[[str], None] | None = None,
) -> Prepared:
    """Read, check, split, render, tokenize (and pack) the job's datasets, reusing the cache when possible.

    Args:
        job: the job; ``job.dataset`` and ``training.max_seq_length``/``packing``/``seed`` apply.
        tokenizer: the model's tokenizer. A named ``dataset.chat_template`` is installed on it.
        source: the local path of ``dataset.source``.
        eval_source: the local path of ``dataset.eval_source``, if any.
        mix_sources: local paths of ``dataset.mix`` entries, in order; fetched here when not given.
        log: receives progress lines.
        warn: receives warnings (default: ``log`` with a ``warning:`` prefix).

    Returns:
        :class:`Prepared` with memory-mapped datasets and statistics (see docs/datasets.md).

    Raises:
        DataError: unreadable file, unknown or mixed formats, a malformed row (``file:line``), no rows left.
    """
    started = time.time()
    ds, t = job.dataset, job.training
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        (warn or (lambda m: log(f"warning: {m}")))(msg)

    inputs = _source_inputs(job, source, mix_sources)
    files = [list_files(i.path, split=i.split) for i in inputs]
    eval_input, eval_files = None, None
    if eval_source is not None:
        eval_files, eval_split = _eval_files(Path(eval_source))
        eval_input = SourceInput(Path(eval_source), ds.eval_source or str(eval_source), ds.format, dict(ds.columns), eval_split)
    template, template_error, template_lines = choose_template(tokenizer, ds.chat_template)

    from .cache import commit_entry, entry_lock, load_entry, make_key, prune, tokenizer_fingerprint

    key = make_key(
        {
            "data": [content_digest(sf) for sf in files],
            "eval": content_digest(eval_files) if eval_files else None,
            "sources": [(i.format, sorted(i.columns.items()), i.split, i.weight) for i in inputs],
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "dataset": ds.model_dump(mode="json", exclude={"source", "eval_source", "mix", "cache", "num_proc"}),
            "max_seq_length": t.max_seq_length,
            "packing": t.packing,
            "seed": t.seed,
        }
    )
    with entry_lock(key):
        cached = load_entry(key) if ds.cache else None
        if cached is not None:
            train, evald, stats = cached
            stats.update(cache="hit", seconds=round(time.time() - started, 3))
            log(f"reusing prepared data from the cache ({len(train)} training rows, key {key[:12]})")
            return Prepared(train=train, eval=evald, stats=stats)

        num_proc = _num_proc(ds.num_proc, files + ([eval_files] if eval_files else []))
        work = Path(tempfile.mkdtemp(prefix=".work-", dir=_cache_root()))
        try:
            train_all, report = encode_sources(
                tokenizer, template, inputs, files, job, work / "train.arrow",
                template_error=template_error, num_proc=num_proc, log=log,
            )  # fmt: skip
            if report["chat_rows"]:
                for line in template_lines:
                    (_warn if line.startswith("warning: ") else log)(line.removeprefix("warning: "))
            eval_all, eval_report = None, None
            if eval_input is not None:
                eval_all, eval_report = encode_sources(
                    tokenizer, template, [eval_input], [eval_files], job, work / "eval.arrow",  # type: ignore[list-item]
                    template_error=template_error, num_proc=num_proc, log=log, index_base=len(inputs),
                )  # fmt: skip
            train_idx, eval_idx, used = _select_rows(train_all, inputs, job, has_eval_source=eval_all is not None)
            stats = _statistics(train_all, train_idx, report, inputs, used, job)
            stats["chat_template"] = getattr(template, "name", None) if report["chat_rows"] else None
            train = train_all.select(train_idx).select_columns(["input_ids", "labels"])
            if eval_all is not None:
                eval_idx = _usable(eval_all)
                stats["eval_bad_rows"] = eval_report["bad_rows"]  # type: ignore[index]
            evald = (eval_all or train_all).select(eval_idx).select_columns(["input_ids", "labels"]) if len(eval_idx) else None
            stats["eval_rows"] = len(eval_idx)
            if t.packing:
                from .packing import pack

                train = pack(train, t.max_seq_length)
                stats["packed_sequences"] = len(train)
                stats["packing_efficiency"] = round(stats["train_tokens"] / max(1, len(train) * t.max_seq_length), 4)
            _report_warnings(stats, report, job, _warn)
            stats.update(
                warnings=warnings, num_proc=num_proc, cache="miss", cache_key=key,
                seconds=round(time.time() - started, 3),
            )  # fmt: skip
            stats["rows_per_second"] = round(report["rows_read"] / max(stats["seconds"], 1e-9), 1)
            commit_entry(key, train, evald, stats)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        prune(protect=key)
        train, evald, stats = load_entry(key)  # type: ignore[misc]
        stats["cache"] = "miss"
    log(
        f"prepared {stats['rows']} training rows ({stats['format']}), {stats['eval_rows']} eval rows, "
        f"{stats['train_tokens']} tokens ({stats['trained_tokens']} trained) in {stats['seconds']}s"
        + (f", packed into {stats['packed_sequences']} sequences" if t.packing else "")
    )
    return Prepared(train=train, eval=evald, stats=stats)


# --- sources ---------------------------------------------------------------------------------
def _source_inputs(job: TuneJob, source: Path, mix_sources: list[Path] | None) -> list[SourceInput]:
    ds = job.dataset
    inputs = [SourceInput(Path(source), ds.source, ds.format, dict(ds.columns), ds.split, ds.weight)]
    if ds.mix and mix_sources is None:
        from ..storage import fetch  # the same fetching as dataset.source (local, hf://, s3://, ...)

        mix_sources = [fetch(m.source) for m in ds.mix]
    for m, path in zip(ds.mix, mix_sources or []):
        inputs.append(SourceInput(Path(path), m.source, m.format, dict(m.columns), m.split, m.weight))
    return inputs


def _eval_files(path: Path) -> tuple[SourceFiles, str]:
    """An evaluation source and its split: validation (else test, eval, train) when it has splits."""
    import json

    order = ("validation", "valid", "val", "dev", "test", "eval", "train")
    marker = Path(path) / "dataset_dict.json"
    if marker.is_file():  # a saved DatasetDict
        splits = json.loads(marker.read_text(encoding="utf-8")).get("splits", [])
        split = next((s for s in order if s in splits), splits[0] if splits else "train")
        return list_files(path, split=split), split
    last: DataError | None = None
    for split in ("validation", "test", "eval", "train"):
        try:
            return list_files(path, split=split), split
        except DataError as e:
            if "no files for split" not in e.message:
                raise
            last = e
    raise last  # type: ignore[misc]


def choose_template(tokenizer: Any, name: str | None) -> tuple[Any, str | None, list[str]]:
    """The chat template for conversations, or None plus the error to give if a conversation shows up.

    Returns:
        ``(template, error, lines)``: ``lines`` are the messages about the choice, reported only when the
        data has conversations.

    Raises:
        DataError: ``name`` is unknown or needs tokens the tokenizer lacks.
    """
    from .templates import resolve_template

    lines: list[str] = []
    if name is None and not getattr(tokenizer, "chat_template", None):
        return None, "the dataset has conversations but the tokenizer has no chat template", lines
    return resolve_template(tokenizer, name, log=lines.append), None, lines


def _cache_root() -> Path:
    from .cache import cache_root

    return cache_root()


def _num_proc(requested: int | None, files: Iterable[SourceFiles]) -> int:
    if requested is not None:
        return requested if sys.platform == "linux" else 1
    if sys.platform != "linux":  # worker processes share the tokenizer by fork
        return 1
    size = 0
    for sf in files:
        for p in sf.files:
            size += sum(q.stat().st_size for q in p.rglob("*") if q.is_file()) if p.is_dir() else p.stat().st_size
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, MAX_PROCS) if size >= PARALLEL_MIN_BYTES and cpus > 1 else 1


# --- encoding --------------------------------------------------------------------------------
def encode_sources(
    tokenizer: Any,
    template: Any,
    inputs: list[SourceInput],
    files: list[SourceFiles],
    job: TuneJob,
    out: Path,
    *,
    template_error: str | None = None,
    num_proc: int = 1,
    log: Callable[[str], None] = lambda m: None,
    index_base: int = 0,
) -> tuple[Any, dict]:
    """Encode every source, in order, into one Arrow file and return it memory-mapped with a report.

    Raises:
        DataError: the first malformed row (unless skipped), mixed formats in one source, no rows.
    """
    import pyarrow as pa
    from datasets import Dataset

    from .encode import SCHEMA

    ds = job.dataset
    paths: list[str] = []
    kinds: list[str] = []
    report: dict[str, Any] = {
        "rows_read": 0, "bad_rows": 0, "bad_examples": [], "chat_rows": 0, "empty_answers": 0,
        "prefix_inconsistent": 0, "eos_inserted": 0, "sources": [],
    }  # fmt: skip
    with open(out, "wb") as sink, pa.ipc.new_stream(sink, SCHEMA()) as writer:
        for k, (inp, sf) in enumerate(zip(inputs, files)):
            offset = len(paths)
            paths += [str(p) for p in sf.files]
            kinds += sf.kinds
            settings = EncodeSettings(inp.format, tuple(sorted(inp.columns.items())), ds.train_on_inputs, job.training.max_seq_length, ds.length_handling)
            encoder = Encoder(
                tokenizer, template, settings, source_index=index_base + k,
                template_error=template_error or "the tokenizer has no chat template",
            )  # fmt: skip
            src = {"source": inp.label, "format": inp.format if inp.format != "auto" else None, "rows": 0, "bad_rows": 0, "weight": inp.weight}
            first_at: dict[int, str] = {}
            for res in _encode_stream(encoder, iter_items(sf, offset, split=inp.split), num_proc, log):
                if res.fatal:
                    raise DataError(f"{inp.label}: {res.fatal}", hint=_template_hint())
                for fi, line, problem in res.bad:
                    loc = where(paths[fi], line, kinds[fi])
                    if ds.on_bad_rows == "error":
                        raise DataError(f"{loc}: {problem}", hint="fix the row, or skip malformed rows (they are counted): dataset.on_bad_rows: skip, or --on-bad-rows skip")
                    src["bad_rows"] += 1
                    if len(report["bad_examples"]) < BAD_EXAMPLES:
                        report["bad_examples"].append(f"{loc}: {problem}")
                batch = res.batch
                if batch is None or batch.num_rows == 0:
                    continue
                _check_one_format(batch, first_at, paths, kinds, inp)
                writer.write_batch(batch)
                src["rows"] += batch.num_rows
                report["empty_answers"] += res.empty_answers
                report["prefix_inconsistent"] += res.prefix_inconsistent
                report["eos_inserted"] += res.eos_inserted
                report["chat_rows"] += res.chat_rows
            if src["rows"] == 0:
                raise DataError(
                    f"{inp.label}: no usable rows" + (f" ({src['bad_rows']} malformed rows skipped)" if src["bad_rows"] else ""),
                    hint="point the source at JSONL/JSON/CSV/Parquet rows in a supported format (see docs/datasets.md)",
                )
            if src["format"] is None:
                src["format"] = _FORMAT_NAMES[min(first_at, key=lambda f: first_at[f])] if first_at else None
            if src["format"] is None:
                src["format"] = inp.format
            report["rows_read"] += src["rows"] + src["bad_rows"]
            report["bad_rows"] += src["bad_rows"]
            report["sources"].append(src)
            log(f"read {inp.label}: {src['rows']} rows ({src['format']})" + (f", {src['bad_rows']} malformed rows skipped" if src["bad_rows"] else ""))
    return Dataset.from_file(str(out)), report


def _template_hint() -> str:
    from .templates import CHAT_TEMPLATES

    return f"set dataset.chat_template to one of {', '.join(CHAT_TEMPLATES)} (chatml suits most base models)"


def _check_one_format(batch: Any, first_at: dict[int, str], paths: list[str], kinds: list[str], inp: SourceInput) -> None:
    """Rows of different formats in one source are an error, never silently mixed."""
    import numpy as np

    fmts = batch.column("_fmt").to_numpy()
    uniq, idx = np.unique(fmts, return_index=True)
    for f, i in zip(uniq.tolist(), idx.tolist()):
        if f not in first_at:
            fi, line = batch.column("_file")[i].as_py(), batch.column("_line")[i].as_py()
            first_at[f] = where(paths[fi], line, kinds[fi])
    if len(first_at) > 1:
        found = "; ".join(f"{_FORMAT_NAMES[f]} (first at {loc})" for f, loc in sorted(first_at.items(), key=lambda x: x[1]))
        raise DataError(
            f"{inp.label}: rows of different formats: {found}",
            hint="keep one format per source: convert the rows, or list the files as separate sources under dataset.mix",
        )


_ACTIVE: Encoder | None = None  # the encoder worker processes inherit by fork


def _run_chunk(items: list) -> ChunkResult:
    return _ACTIVE.encode(items)  # type: ignore[union-attr]


def _chunked(items: Iterator, n: int, max_bytes: int = CHUNK_BYTES) -> Iterator[list]:
    """Items in lists of ``n``, or fewer once their text passes ``max_bytes`` (memory follows the text)."""
    chunk: list = []
    size = 0
    for it in items:
        chunk.append(it)
        size += _text_size(it[2])
        if len(chunk) >= n or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _text_size(payload: Any) -> int:
    """The characters of a row's text: a raw line's length, or the strings of a parsed row added up."""
    if isinstance(payload, (bytes, str)):
        return len(payload)
    size, stack = 0, [payload]
    while stack:  # a loop, not recursion: a row may nest as deep as the JSON parser allows
        obj = stack.pop()
        if isinstance(obj, (bytes, str)):
            size += len(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return size


@contextlib.contextmanager
def _tokenizers_single_threaded() -> Iterator[None]:
    """Forked workers must not use the tokenizer's thread pool (and should not warn about it)."""
    key = "TOKENIZERS_PARALLELISM"
    old = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _encode_stream(encoder: Encoder, items: Iterator, num_proc: int, log: Callable[[str], None] = lambda m: None) -> Iterator[ChunkResult]:
    """Encoded chunks in input order; with several processes at most 2 per process are in flight.

    A worker process that dies (killed for memory, a crash in native code) does not hang the preparation: the
    chunks not yet encoded are encoded in this process instead, with a note to ``log``.
    """
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    chunks = _chunked(items, CHUNK_ROWS)
    if num_proc <= 1:
        for c in chunks:
            yield encoder.encode(c)
        return
    global _ACTIVE
    _ACTIVE = encoder
    pending: deque = deque()  # (chunk, future), in input order; a chunk leaves once its result is in hand

    def oldest() -> ChunkResult:
        res = pending[0][1].result()
        pending.popleft()
        return res

    try:
        try:
            with _tokenizers_single_threaded(), ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("fork")) as pool:
                for c in chunks:
                    pending.append((c, pool.submit(_run_chunk, c)))
                    if len(pending) >= 2 * num_proc:
                        yield oldest()
                while pending:
                    yield oldest()
        except BrokenProcessPool as e:
            log(f"a data worker process ended unexpectedly ({e}); encoding the remaining rows in this process")
            for c, _ in pending:
                yield encoder.encode(c)
            for c in chunks:
                yield encoder.encode(c)
    finally:
        _ACTIVE = None


# --- selecting rows ----------------------------------------------------------------------------
def _usable(table: Any):
    import numpy as np

    status = table.data.column("_status").to_numpy()
    return np.nonzero((status == STATUS["ok"]) | (status == STATUS["truncated"]))[0]


def _select_rows(table: Any, inputs: list[SourceInput], job: TuneJob, *, has_eval_source: bool):
    """Indices of training and evaluation rows, and how many training rows each source contributed.

    In order, all seeded: ``max_rows`` keeps a random subset, ``eval_split`` holds rows out (before
    mixing, so an upsampled row never lands in both), then sources are mixed by weight.
    """
    import numpy as np

    ds = job.dataset
    rng = np.random.default_rng(job.training.seed)
    rows = _usable(table)
    if ds.max_rows is not None and len(rows) > ds.max_rows:
        rows = np.sort(rng.permutation(rows)[: ds.max_rows])
    eval_idx = np.zeros(0, dtype=np.int64)
    if ds.eval_split and not has_eval_source:
        n_eval = max(1, int(round(len(rows) * ds.eval_split)))
        if n_eval >= len(rows):
            raise DataError(f"dataset.eval_split {ds.eval_split} leaves no training rows out of {len(rows)}", hint="lower dataset.eval_split")
        order = rng.permutation(len(rows))
        eval_idx = np.sort(rows[order[:n_eval]])
        rows = np.sort(rows[order[n_eval:]])
    src = table.data.column("_src").to_numpy()[rows]
    per_source = [rows[src == k] for k in range(len(inputs))]
    if _weighted(inputs):
        weights = np.array([i.weight for i in inputs], dtype=float)
        targets = np.round(len(rows) * weights / weights.sum()).astype(int).tolist()
        picked = []
        for have, n in zip(per_source, targets):
            if not len(have):
                continue
            reps, rest = divmod(n, len(have))
            part = [np.tile(have, reps)] if reps else []
            part.append(np.sort(rng.choice(have, size=rest, replace=False)))
            picked.append(np.concatenate(part))
        rows = np.sort(np.concatenate(picked)) if picked else rows[:0]
        used = [int(n) if len(have) else 0 for have, n in zip(per_source, targets)]
    else:
        used = [len(have) for have in per_source]
    if not len(rows):
        raise DataError("no training rows left after dropping, sampling and the evaluation split", hint="check the statistics of `kubetune data inspect`")
    return rows, eval_idx, used


def _weighted(inputs: list[SourceInput]) -> bool:
    return len(inputs) > 1 and all(i.weight is not None for i in inputs)


def _statistics(table: Any, train_idx: Any, report: dict, inputs: list[SourceInput], used: list[int], job: TuneJob) -> dict:
    import numpy as np

    status = table.data.column("_status").to_numpy()
    full_len = table.data.column("_full_len").to_numpy()
    trained = table.data.column("_trained").to_numpy()
    lengths = np.minimum(full_len, job.training.max_seq_length)
    lengths[status == STATUS["too_long"]] = 0
    for s, n in zip(report["sources"], used):
        s["used_rows"] = n
    formats = [s["format"] for s in report["sources"]]
    too_long = int((status == STATUS["too_long"]).sum())
    nothing = int((status == STATUS["nothing_trained"]).sum())
    return {
        "format": formats[0] if len(set(formats)) == 1 else "mixed",
        "formats": formats,
        "rows": int(len(train_idx)),
        "rows_read": report["rows_read"],
        "bad_rows": report["bad_rows"],
        "bad_examples": report["bad_examples"],
        "over_max_length": int((full_len > job.training.max_seq_length).sum()),
        "truncated": int((status == STATUS["truncated"]).sum()),
        "too_long_dropped": too_long,
        "nothing_trained": nothing,
        "dropped": too_long + nothing,
        "empty_answers": report["empty_answers"],
        "prefix_inconsistent_rows": report["prefix_inconsistent"],
        "eos_inserted_rows": report["eos_inserted"],
        "train_tokens": int(lengths[train_idx].sum()),
        "trained_tokens": int(trained[train_idx].sum()),
        "max_seq_length": job.training.max_seq_length,
        "sources": report["sources"],
    }


def _report_warnings(stats: dict, report: dict, job: TuneJob, warn: Callable[[str], None]) -> None:
    """Say out loud what happened to rows, so a data problem is never silent."""
    limit = job.training.max_seq_length
    if stats["bad_rows"]:
        warn(f"skipped {stats['bad_rows']} malformed rows (dataset.on_bad_rows: skip), e.g. {stats['bad_examples'][0]}")
    if stats["truncated"]:
        warn(f"{stats['truncated']} rows were longer than training.max_seq_length={limit} and were cut (their ends are not trained)")
    if stats["too_long_dropped"]:
        warn(f"{stats['too_long_dropped']} rows were longer than training.max_seq_length={limit} and were dropped")
    if stats["nothing_trained"]:
        warn(f"{stats['nothing_trained']} rows had no trained token left after cutting to {limit} tokens and were dropped")
    if stats["empty_answers"]:
        warn(f"{stats['empty_answers']} rows have an empty answer (only the end-of-turn token is trained)")
    if stats["prefix_inconsistent_rows"]:
        warn(
            f"{stats['prefix_inconsistent_rows']} conversations render differently prefix by prefix than whole; "
            "their answers were located by content (check `kubetune data inspect`)"
        )
    if stats["eos_inserted_rows"]:
        warn(f"the chat template emits no end-of-turn token: EOS was appended to the answers of {stats['eos_inserted_rows']} rows")

