"""``dataset.preprocess``: the user's function over the fetched rows, before they are prepared, cached.

The contract (docs/datasets.md#preprocess): the file named by ``dataset.preprocess.file`` defines
``def <function>(rows)``, which receives an iterator of row dicts, exactly as read from the dataset (before
``dataset.columns`` renames anything), and returns or yields row dicts. Filtering, mapping, splitting one
row into several and adding rows are all the same shape; a per-row map is ``return (fix(r) for r in rows)``.

The story of one preprocessing: fetch the code (a local path or any URI kubetune reads), key the result by
the code's bytes, the function's name and the data's content, and on a hit return the cached rows without
running anything. On a miss, load the file as a module, run the function over the rows, and write what it
returns to ``rows.jsonl`` in a temporary folder that is renamed into place (readers see all of it or none).
The prepared-data cache then keys on that file's content like on any dataset.

A failure in the user's code ends the job with one line naming the file and the function; its traceback
goes to stderr (the worker's log, the pod's log).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import constants as C
from ..errors import DataError, KubetuneError
from ..paths import home
from ..spec import TuneJob
from .readers import content_digest, iter_items, list_files, where

__all__ = ["preprocess_inputs", "preprocess_source", "load_function"]


def preprocess_inputs(job: TuneJob, inputs: dict, *, log: Callable[[str], None] = lambda m: None) -> dict:
    """The worker's fetched inputs with ``dataset`` and ``eval_dataset`` replaced by their preprocessed rows
    (a JSONL file in the cache); ``inputs`` unchanged when the spec sets no ``dataset.preprocess``.

    Raises:
        DataError: the code cannot be loaded, the function fails or returns something that is not rows.
        SourceError: the code's URI cannot be fetched.
    """
    pre = job.dataset.preprocess
    if pre is None:
        return inputs
    from ..storage import fetch

    code = Path(fetch(pre.file))
    out = dict(inputs)
    out["dataset"] = preprocess_source(job, code, Path(inputs["dataset"]), label=job.dataset.source, split=job.dataset.split, log=log)
    if inputs.get("eval_dataset") is not None:
        out["eval_dataset"] = preprocess_source(job, code, Path(inputs["eval_dataset"]), label=job.dataset.eval_source or "", split="eval", log=log)
    return out


def preprocess_source(job: TuneJob, code: Path, source: Path, *, label: str, split: str = "train",
                      log: Callable[[str], None] = lambda m: None) -> Path:
    """Run ``dataset.preprocess`` over the rows of ``source`` (cached); returns the JSONL file of the result.

    Args:
        code: the local Python file; label: the source as the spec names it (for messages);
        split: the split to read (``eval``: the evaluation source's, found as the preparation finds it).
    """
    from .cache import make_key

    pre = job.dataset.preprocess
    assert pre is not None
    started = time.time()
    shown = f"{code.name}:{pre.function}"
    try:
        code_bytes = code.read_bytes()
    except OSError as e:
        raise DataError(f"dataset.preprocess.file {pre.file}: cannot read it ({e.strerror or e})", hint="name a readable .py file") from None
    if split == "eval":
        from .prepare import _eval_files

        files, split = _eval_files(source)
    else:
        files = list_files(source, split=split)
    key = make_key({
        "preprocess": hashlib.sha256(code_bytes).hexdigest(),
        "function": pre.function,
        "data": content_digest(files),
        "split": split,
        "on_bad_rows": job.dataset.on_bad_rows,
    })  # fmt: skip
    root = _cache_root()
    entry = root / key
    rows_file = entry / C.PREPROCESS_ROWS_FILE
    with _locked(root, key):
        if job.dataset.cache and rows_file.is_file():
            os.utime(entry)  # last use, for pruning
            log(f"reusing preprocessed rows of {label} from the cache ({shown} unchanged, key {key[:12]})")
            return rows_file
        func = load_function(code, pre.function, field=pre.file)
        tmp = root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            counts = _run(func, _Rows(files, split, job.dataset.on_bad_rows), tmp / C.PREPROCESS_ROWS_FILE, shown=shown, label=label)
            if entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, protect=key)
    skipped = f", {counts['bad']} malformed rows skipped" if counts["bad"] else ""
    log(f"preprocessed {label} with {shown}: {counts['in']} rows in, {counts['out']} rows out{skipped} in {time.time() - started:.1f}s")
    return rows_file


def load_function(code: Path, name: str, *, field: str | None = None) -> Callable[[Iterator[dict]], Any]:
    """The function ``name`` defined by the Python file ``code`` (loaded as a fresh module, never imported by a
    dotted path).

    Raises:
        DataError: the file fails to load (its traceback on stderr) or defines no callable ``name``.
    """
    where_ = field or str(code)
    module_name = f"kubetune_preprocess_{hashlib.sha256(str(code).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, code)
    if spec is None or spec.loader is None:
        raise DataError(f"dataset.preprocess.file {where_}: cannot load it as Python", hint="name a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(code.parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        raise DataError(
            f"dataset.preprocess: loading {code.name} failed: {type(e).__name__}: {e}",
            hint="the traceback is in the log (logs/worker.log, or the pod's log); fix the file",
        ) from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(code.parent))
    func = getattr(module, name, None)
    if not callable(func):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
        raise DataError(
            f"dataset.preprocess: {code.name} defines no function '{name}'" + (f" (it defines {', '.join(defined)})" if defined else ""),
            hint="set dataset.preprocess.function to the function's name",
        )
    return func


# --- running the function --------------------------------------------------------------------
def _run(func: Callable, rows: "_Rows", out: Path, *, shown: str, label: str) -> dict:
    """Write what ``func(rows)`` returns to ``out``, one JSON object a line; counts of rows in and out."""
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        try:
            result = func(iter(rows))
            if result is None or isinstance(result, (dict, str, bytes)):
                raise DataError(
                    f"dataset.preprocess: {shown} returned {type(result).__name__} for {label}, not rows",
                    hint="return (or yield) row dicts: a list, a generator or any iterable of them",
                )
            for row in result:
                n += 1
                if not isinstance(row, dict):
                    raise DataError(f"dataset.preprocess: {shown} gave a {type(row).__name__} as row {n}, not a dict",
                                    hint="every row is a dict of the dataset's columns, e.g. {'prompt': ..., 'completion': ...}")
                try:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                except (TypeError, ValueError) as e:
                    raise DataError(f"dataset.preprocess: row {n} from {shown} is not JSON-serialisable: {e}",
                                    hint="rows hold strings, numbers, booleans, lists and dicts") from None
        except KubetuneError:
            raise  # a malformed input row (file:line) or one of the checks above: already one clear line
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            raise DataError(
                f"dataset.preprocess: {shown} raised {type(e).__name__}: {e}" + (f" (after {n} rows)" if n else ""),
                hint="the traceback is in the log (logs/worker.log, or the pod's log); fix the function",
            ) from None
    if n == 0:
        raise DataError(f"dataset.preprocess: {shown} returned no rows for {label}", hint="check its filter against the data")
    return {"in": rows.count, "out": n, "bad": rows.bad}


class _Rows:
    """The source's rows as dicts, counted; a malformed row stops (``file:line``) or is skipped and counted."""

    def __init__(self, files, split: str, on_bad_rows: str) -> None:
        self.files, self.split, self.on_bad_rows = files, split, on_bad_rows
        self.count = self.bad = 0

    def __iter__(self) -> Iterator[dict]:
        from .encode import RowError, parse_row

        paths = [str(p) for p in self.files.files]
        for fi, line, payload in iter_items(self.files, 0, split=self.split):
            try:
                row = parse_row(payload, {})
            except RowError as e:
                if self.on_bad_rows == "error":
                    raise DataError(f"{where(paths[fi], line, self.files.kinds[fi])}: {e}",
                                    hint="fix the row, or skip malformed rows: dataset.on_bad_rows: skip") from None
                self.bad += 1
                continue
            self.count += 1
            yield row


def _cache_root() -> Path:
    p = home() / C.CACHE_DIR / C.PREPROCESS_CACHE_SUBDIR
    p.mkdir(parents=True, exist_ok=True)
    return p


def _prune(root: Path, *, protect: str, keep: int = C.DATA_CACHE_KEEP) -> None:
    entries = sorted((p.stat().st_mtime, p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != protect)
    for _, p in sorted(entries, reverse=True)[max(0, keep - 1):]:
        shutil.rmtree(p, ignore_errors=True)
        (root / f".{p.name}.lock").unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(root: Path, key: str) -> Iterator[None]:
    """Several ranks of one job on a node preprocess once: the others wait, then hit the cache."""
    with open(root / f".{key}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
