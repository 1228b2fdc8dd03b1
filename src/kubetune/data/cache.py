"""The prepared-data cache: tokenized datasets keyed by the data, the tokenizer and the settings.

An entry is a folder ``$KUBETUNE_HOME/cache/data/<key>/`` holding ``train/`` (and ``eval/``) written
by ``datasets.save_to_disk`` plus ``stats.json``; it is built in a temporary folder and renamed into
place, so readers see a complete entry or none. A lock file serialises processes that want the same
key (several ranks of one job on a node prepare once; the others wait and load the result).
Loading is memory-mapped, so a cached million-row dataset costs little memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from ..paths import home

__all__ = ["cache_root", "tokenizer_fingerprint", "make_key", "entry_lock", "load_entry", "commit_entry", "prune"]

# Bump when prepared data changes for the same inputs (encoding, masks, packing layout).
PIPELINE_VERSION = "2"  # 2: tools and tool calls are rendered (rows with them were rejected before)
_STATS = "stats.json"
_TRAIN, _EVAL = "train", "eval"


def cache_root() -> Path:
    """``$KUBETUNE_HOME/cache/data`` (created)."""
    p = home() / C.CACHE_DIR / C.DATA_CACHE_SUBDIR
    p.mkdir(parents=True, exist_ok=True)
    return p


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of everything about a tokenizer that changes token ids (vocab, merges, specials, template)."""
    import xxhash

    h = xxhash.xxh3_128()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    tpl = getattr(tokenizer, "chat_template", None)
    h.update(json.dumps(tpl, sort_keys=True, default=str).encode())
    specials = {k: str(getattr(tokenizer, k, None)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    h.update(json.dumps([type(tokenizer).__name__, specials], sort_keys=True).encode())
    return h.hexdigest()


def make_key(parts: dict) -> str:
    """The cache key of a preparation: a digest of its JSON-serialisable ``parts``."""
    import xxhash

    blob = json.dumps({"pipeline": PIPELINE_VERSION, **parts}, sort_keys=True, default=str)
    return xxhash.xxh3_128(blob.encode()).hexdigest()


@contextlib.contextmanager
def entry_lock(key: str) -> Iterator[None]:
    """Hold an exclusive lock for ``key`` (blocks while another process prepares the same data)."""
    lock_path = cache_root() / f"{key}.lock"
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_entry(key: str) -> tuple[Any, Any, dict] | None:
    """The cached ``(train, eval, stats)`` for ``key``, memory-mapped, or None."""
    entry = cache_root() / key
    if not (entry / _STATS).is_file():
        return None
    from datasets import load_from_disk

    try:
        stats = json.loads((entry / _STATS).read_text(encoding="utf-8"))
        train = load_from_disk(str(entry / _TRAIN))
        evald = load_from_disk(str(entry / _EVAL)) if (entry / _EVAL).is_dir() else None
    except Exception:  # a damaged entry is rebuilt, never trusted
        shutil.rmtree(entry, ignore_errors=True)
        return None
    os.utime(entry)  # last use, for pruning
    return train, evald, stats


def commit_entry(key: str, train: Any, evald: Any, stats: dict) -> Path:
    """Write an entry for ``key`` atomically and return its folder."""
    root = cache_root()
    tmp = root / f".{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with _quiet():
        train.save_to_disk(str(tmp / _TRAIN))
        if evald is not None:
            evald.save_to_disk(str(tmp / _EVAL))
    (tmp / _STATS).write_text(json.dumps(stats, indent=2, default=str), encoding="utf-8")
    entry = root / key
    if entry.exists():
        shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)
    return entry


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars from datasets (kubetune reports progress through its own events)."""
    from datasets.utils import logging as ds_logging

    was = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            ds_logging.enable_progress_bar()


def prune(keep: int = C.DATA_CACHE_KEEP, *, protect: str | None = None) -> None:
    """Remove all but the ``keep`` most recently used entries (and stale temporary folders)."""
    root = cache_root()
    now = time.time()
    entries = []
    for p in root.iterdir():
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            if now - p.stat().st_mtime > 24 * 3600:  # an interrupted preparation
                shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir() and p.name != protect:
            entries.append((p.stat().st_mtime, p))
    for _, p in sorted(entries, reverse=True)[max(0, keep - 1):]:
        shutil.rmtree(p, ignore_errors=True)
        (root / f"{p.name}.lock").unlink(missing_ok=True)
