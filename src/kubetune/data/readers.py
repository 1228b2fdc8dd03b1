"""Reading dataset files without holding them in memory.

A source (a file, a directory of files, a ``datasets.save_to_disk`` folder, or a Hub snapshot that
storage fetched into a folder) becomes a stream of *items* ``(file_index, line, payload)``:

* JSON Lines: the payload is the raw line (bytes), parsed later, possibly in another process;
* JSON arrays, CSV, Parquet and Arrow: the payload is the row as a dict, parsed here.

``line`` is the 1-based line of the row in a text file, or the 1-based row number in a Parquet/Arrow
file; :func:`where` formats either as ``file:line`` / ``file[row N]`` for error messages.

No row may be larger than :func:`max_row_bytes` (a row is read whole, then parsed and tokenized, which
takes many times its size): JSON Lines and CSV are read with a bounded ``readline``, so an oversized row is
refused before it is held in memory; a JSON array's element and a Parquet/Arrow row are measured before
they are turned into Python objects.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from ..errors import DataError

__all__ = ["SUFFIXES", "SourceFiles", "list_files", "iter_items", "where", "content_digest", "max_row_bytes"]

# suffix -> reader kind; ".gz" versions of the text kinds are read transparently.
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".arrow": "arrow"}
_SPLIT_ALIASES = {"train": {"train"}, "validation": {"validation", "valid", "val", "dev"}, "test": {"test"}, "eval": {"eval"}}
_SAVED_MARKERS = ("state.json", "dataset_dict.json")
_IGNORED_DIRS = {".git", ".cache", ".huggingface", "__pycache__"}


@dataclass
class SourceFiles:
    """The files one source resolved to, each with its reader kind (``saved`` = a save_to_disk folder)."""

    root: Path
    files: list[Path] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".gz"):
        k = SUFFIXES.get(Path(name[:-3]).suffix)
        return k if k in ("jsonl", "json", "csv", "tsv") else None
    return SUFFIXES.get(path.suffix.lower())


def _split_tokens(rel: str) -> set[str]:
    return set(t for t in re.split(r"[^a-z]+", rel.lower()) if t)


def _filter_split(root: Path, files: list[Path], split: str) -> list[Path]:
    """Hub-style folders keep splits apart by name (data/train-0000.parquet, test.jsonl, validation/...)."""
    names = set().union(*_SPLIT_ALIASES.values())
    tagged = {f: _split_tokens(str(f.relative_to(root))) & names for f in files}
    if not any(tagged.values()):
        return files
    wanted = _SPLIT_ALIASES.get(split, {split})
    chosen = [f for f in files if tagged[f] & wanted]
    if not chosen:
        found = sorted(set().union(*tagged.values()))
        raise DataError(f"{root}: no files for split '{split}' (found splits: {', '.join(found)})", hint="set dataset.split")
    return chosen


def list_files(source: Path, *, split: str = "train") -> SourceFiles:
    """Resolve a local source to its data files.

    Raises:
        DataError: the path does not exist, has no data files, or is of an unsupported type.
    """
    source = Path(source)
    if not source.exists():
        raise DataError(f"{source}: dataset not found", hint="check dataset.source (relative paths resolve against the current directory)")
    if source.is_file():
        kind = _kind(source)
        if kind is None:
            raise DataError(
                f"{source}: unsupported file type '{source.suffix}'",
                hint="use JSON Lines (.jsonl), a JSON array (.json), CSV (.csv), Parquet (.parquet) or a datasets.save_to_disk folder",
            )
        return SourceFiles(source.parent, [source], [kind])
    if any((source / m).is_file() for m in _SAVED_MARKERS):
        return SourceFiles(source, [source], ["saved"])
    files = []
    for p in sorted(source.rglob("*")):
        rel = p.relative_to(source).parts
        if any(part in _IGNORED_DIRS or part.startswith(".") for part in rel):
            continue
        if p.is_dir() and any((p / m).is_file() for m in _SAVED_MARKERS):
            files.append(p)
        elif p.is_file() and _kind(p) is not None and not any(q in files for q in p.parents):
            files.append(p)
    files = [f for f in files if not any(q in files for q in f.parents)]
    if not files:
        raise DataError(
            f"{source}: directory has no data files",
            hint="expected .jsonl, .json, .csv, .tsv, .parquet or .arrow files (optionally .gz), or a datasets.save_to_disk folder",
        )
    files = _filter_split(source, files, split)
    return SourceFiles(source, files, ["saved" if f.is_dir() else _kind(f) for f in files])  # type: ignore[misc]


def where(path: str, line: int, kind: str) -> str:
    """A row's location for messages: ``file:line`` for text files, ``file[row N]`` otherwise."""
    return f"{path}[row {line}]" if kind in ("parquet", "arrow", "saved") else f"{path}:{line}"


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def max_row_bytes() -> int:
    """The most bytes one dataset row may take: ``KUBETUNE_MAX_ROW_BYTES``, else ``DATA_MAX_ROW_BYTES`` (16 MiB).

    Raises:
        DataError: the variable is set to something other than a positive whole number.
    """
    raw = os.environ.get(C.ENV_MAX_ROW_BYTES, "").strip()
    if not raw:
        return C.DATA_MAX_ROW_BYTES
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise DataError(f"{C.ENV_MAX_ROW_BYTES}={raw!r} is not a positive whole number",
                        hint=f"set {C.ENV_MAX_ROW_BYTES} to a number of bytes, e.g. {4 * C.DATA_MAX_ROW_BYTES}, or unset it")
    return value


def _row_too_big(loc: str, limit: int, size: int | None = None) -> DataError:
    how_big = f"takes {size} bytes, more than" if size is not None else "is longer than"
    return DataError(
        f"{loc}: the row {how_big} the limit of {limit} bytes per row ({C.ENV_MAX_ROW_BYTES})",
        hint=f"if rows this big are meant, raise the limit, e.g. {C.ENV_MAX_ROW_BYTES}={max(limit * 4, (size or 0) + 1)} "
             "(on a cluster, under kubernetes.env); else remove or split the row",
    )


def iter_items(sf: SourceFiles, offset: int, *, split: str = "train") -> Iterator[tuple[int, int, Any]]:
    """Yield ``(file_index, line, payload)`` for every row of every file (``file_index`` starts at ``offset``).

    Raises:
        DataError: a file cannot be read at all (not JSON, bad encoding, unreadable Parquet).
    """
    limit = max_row_bytes()
    for i, (path, kind) in enumerate(zip(sf.files, sf.kinds)):
        fi = offset + i
        if kind == "jsonl":
            yield from _jsonl(path, fi, limit)
        elif kind == "json":
            yield from _json(path, fi, limit)
        elif kind in ("csv", "tsv"):
            yield from _csv(path, fi, "\t" if kind == "tsv" else ",", limit)
        elif kind == "parquet":
            yield from _parquet(path, fi, limit)
        elif kind in ("arrow", "saved"):
            yield from _arrow(path, fi, kind, split, limit)


def _jsonl(path: Path, fi: int, limit: int) -> Iterator[tuple[int, int, Any]]:
    with _open_binary(path) as f:
        n = 0
        while line := f.readline(limit + 1):  # bounded: an endless line is never read whole
            n += 1
            if len(line) > limit and not line.endswith(b"\n"):
                raise _row_too_big(f"{path}:{n}", limit)
            if line.strip():
                yield fi, n, line


def _json(path: Path, fi: int, limit: int) -> Iterator[tuple[int, int, Any]]:
    """A JSON array of rows (each row's line is where its object starts), or JSON Lines named .json."""
    with _open_binary(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    body = text.lstrip()
    if not body.startswith("["):
        for n, line in enumerate(text.splitlines(), start=1):  # JSON Lines in a .json file
            if len(line) > limit:
                raise _row_too_big(f"{path}:{n}", limit, len(line))
            if line.strip():
                yield fi, n, line
        return
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    line, counted = 1, 0

    def line_at(p: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, p)
        counted = p
        return line

    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos < n and text[pos] == "]":
            return
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})", hint="fix the file; a JSON array cannot skip a broken element") from None
        if end - pos > limit:  # measured before the row goes on to be templated and tokenized
            raise _row_too_big(f"{path}:{line_at(pos)}", limit, end - pos)
        yield fi, line_at(pos), obj
        pos = end
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] == "]":
            return
        else:
            ln = line_at(min(pos, n))
            raise DataError(f"{path}:{ln}: invalid JSON: expected ',' or ']' after an array element")


class _TooBig(Exception):
    """Raised by the bounded line source of the CSV reader; becomes a DataError naming the row."""


def _csv(path: Path, fi: int, delimiter: str, limit: int) -> Iterator[tuple[int, int, Any]]:
    csv.field_size_limit(max(csv.field_size_limit(), limit))  # a field may be as big as a row; rows are bounded below
    pending = 0  # characters of the row being read (a quoted field may span lines)

    def lines(f: io.TextIOWrapper) -> Iterator[str]:
        nonlocal pending
        while line := f.readline(limit + 1):
            pending += len(line)
            if pending > limit + 1 or (pending > limit and not line.endswith("\n")):
                raise _TooBig
            yield line

    with _open_binary(path) as fb, io.TextIOWrapper(fb, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(lines(f), delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataError(f"{path}:1: cannot read CSV header: {e}") from None
        except _TooBig:
            raise _row_too_big(f"{path}:1", limit) from None
        start = reader.line_num + 1
        while True:
            pending = 0
            try:
                values = next(reader)
            except StopIteration:
                return
            except (csv.Error, UnicodeDecodeError) as e:
                raise DataError(f"{path}:{start}: cannot read CSV: {e}") from None
            except _TooBig:
                raise _row_too_big(f"{path}:{start}", limit) from None
            if values and any(v.strip() for v in values):
                if len(values) != len(header):
                    yield fi, start, _BadRow(f"has {len(values)} fields, the header has {len(header)}")
                else:
                    yield fi, start, dict(zip(header, values))
            start = reader.line_num + 1


class _BadRow:
    """A row the reader could already tell is malformed (passed on so that on_bad_rows decides)."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _check_batch(batch: Any, first_row: int, path: Path, kind: str, limit: int) -> None:
    """Refuse the first row of an Arrow batch larger than ``limit`` bytes (halving: cheap when none is)."""
    if batch.nbytes <= limit:
        return
    if batch.num_rows == 1:
        raise _row_too_big(where(str(path), first_row, kind), limit, batch.nbytes)
    half = batch.num_rows // 2
    _check_batch(batch.slice(0, half), first_row, path, kind, limit)
    _check_batch(batch.slice(half), first_row + half, path, kind, limit)


def _parquet(path: Path, fi: int, limit: int) -> Iterator[tuple[int, int, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    n = 0
    for batch in pf.iter_batches(batch_size=4096):
        _check_batch(batch, n + 1, path, "parquet", limit)
        for row in batch.to_pylist():
            n += 1
            yield fi, n, row


def _arrow(path: Path, fi: int, kind: str, split: str, limit: int) -> Iterator[tuple[int, int, Any]]:
    import datasets

    try:
        if kind == "saved":
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"{path}: no split '{split}' (it has {', '.join(ds)})", hint="set dataset.split")
                ds = ds[split]
        else:
            ds = datasets.Dataset.from_file(str(path))
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{path}: cannot load the saved dataset: {e}") from None
    n = 0
    for batch in ds.data.to_batches(max_chunksize=4096):
        _check_batch(batch, n + 1, path, kind, limit)
        for row in batch.to_pylist():
            n += 1
            yield fi, n, row


def content_digest(sf: SourceFiles) -> str:
    """A fast digest of every byte of the source's files (and their names), for the prepared-data cache."""
    import xxhash

    h = xxhash.xxh3_128()
    for path in sf.files:
        parts = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for p in parts:
            h.update(str(p.relative_to(sf.root)).encode())
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()
