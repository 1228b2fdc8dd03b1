"""Pieces every transport shares: transfer statistics, the progress bar, retries, atomic files, hashing."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol, TypeVar

from .. import constants as C
from ..errors import SourceError

log = logging.getLogger("kubetune.storage")
T = TypeVar("T")


# --- statistics and progress -----------------------------------------------------------------
@dataclass
class TransferStats:
    """What one fetch or push moved: bytes and files transferred, bytes skipped (cache, already there)."""

    uri: str = ""
    bytes: int = 0
    files: int = 0
    skipped_bytes: int = 0
    unpacked_files: int = 0
    unpacked_bytes: int = 0
    cached: bool = False
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, nbytes: int = 0, files: int = 0) -> None:
        """Count one file of ``nbytes`` moved."""
        with self._lock:
            self.bytes += nbytes
            self.files += files

    def skip(self, nbytes: int) -> None:
        """Bytes that needed no transfer (already present, cached, deduplicated)."""
        with self._lock:
            self.skipped_bytes += nbytes

    def unpacked(self, files: int, nbytes: int) -> None:
        """Count what unpacking an archive put in place (files and their bytes)."""
        with self._lock:
            self.unpacked_files += files
            self.unpacked_bytes += nbytes

    def describe(self) -> str:
        """One phrase for logs and summaries: what moved, what was unpacked, or that nothing had to move."""
        moved = f"{human_bytes(self.bytes)} in {self.files} file(s)" if self.bytes or self.files else ""
        unpacked = f"unpacked {self.unpacked_files} file(s), {human_bytes(self.unpacked_bytes)}" if self.unpacked_files else ""
        return ", ".join(p for p in (moved, unpacked) if p) or "nothing to transfer"

    def finish(self) -> "TransferStats":
        """Stop the clock."""
        self.seconds = round(time.monotonic() - self.started, 3)
        return self

    @property
    def throughput(self) -> float:
        """Bytes per second moved over the network."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        """The counts as a JSON-ready dict (what ``fetch``/``push`` print)."""
        return {
            "uri": self.uri,
            "bytes": self.bytes,
            "files": self.files,
            "seconds": self.seconds,
            "bytes_per_second": round(self.throughput, 1),
            "skipped_bytes": self.skipped_bytes,
            "unpacked_files": self.unpacked_files,
            "unpacked_bytes": self.unpacked_bytes,
            "cached": self.cached,
        }


class ProgressDisplay(Protocol):
    """What shows a transfer's progress; the CLI installs a rich bar (:func:`set_progress_display`)."""

    def update(self, done: int, total: int) -> None:
        """Bytes moved so far of ``total`` expected."""

    def close(self) -> None:
        """The transfer ended."""


class _TextDisplay:
    """The display without a front end: a plain line on stderr at most every few seconds, and one at the end."""

    def __init__(self, label: str, every: float = 5.0) -> None:
        self.label, self.every, self._last, self._done, self._total = label, every, 0.0, 0, 0

    def update(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        if time.monotonic() - self._last >= self.every:
            self._print()

    def close(self) -> None:
        self._print()

    def _print(self) -> None:
        self._last = time.monotonic()
        total = f" of {self._total / 2**20:.1f} MiB" if self._total else ""
        print(f"{self.label}: {self._done / 2**20:.1f} MiB{total}", file=sys.stderr, flush=True)


_display_factory: Callable[[str], ProgressDisplay] = _TextDisplay


def set_progress_display(factory: Callable[[str], ProgressDisplay] | None) -> None:
    """Make ``factory(label)`` the display of every transfer asked to show progress (the CLI's rich bar); None:
    the plain line on stderr every few seconds (what a log reader wants)."""
    global _display_factory
    _display_factory = factory or _TextDisplay


class Progress:
    """Thread-safe byte counter with an optional progress display (see :func:`set_progress_display`).

    Transports call :meth:`expect` with the bytes they plan to move and :meth:`advance` as bytes
    arrive (from many threads). Retried bytes are counted again: the bar shows work done.
    """

    def __init__(self, label: str, *, enabled: bool) -> None:
        self._lock = threading.Lock()
        self._display = _display_factory(label) if enabled else None
        self._done = 0
        self._total = 0

    def expect(self, nbytes: int) -> None:
        """Add ``nbytes`` to the bytes this transfer plans to move."""
        if self._display is not None and nbytes:
            with self._lock:
                self._total += nbytes
                self._display.update(self._done, self._total)

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` moved."""
        if self._display is not None and nbytes:
            with self._lock:
                self._done += nbytes
                self._display.update(self._done, self._total)

    def close(self) -> None:
        """End the display (idempotent)."""
        if self._display is not None:
            self._display.close()
            self._display = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- retries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: base, 2*base, 4*base, ... capped, each scaled by 0.5..1."""

    attempts: int = C.STORAGE_RETRY_ATTEMPTS
    base: float = C.STORAGE_RETRY_BASE_DELAY
    cap: float = C.STORAGE_RETRY_MAX_DELAY

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (at least what the server's Retry-After asked)."""
        d = min(self.cap, self.base * (2**retry)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            d = max(d, min(self.cap, retry_after))
        return d


# Module-level so tests (and impatient users) can shorten it in one place.
RETRY = RetryPolicy()


class Transient(Exception):
    """A failure worth retrying (5xx, throttling, a reset connection). Carries an optional Retry-After."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def with_retries(fn: Callable[[int], T], *, what: str, policy: RetryPolicy | None = None) -> T:
    """Call ``fn(attempt)`` until it returns; :class:`Transient` errors are retried with backoff.

    The last Transient error is re-raised when the attempts run out.
    """
    policy = policy or RETRY
    for attempt in range(policy.attempts):
        try:
            return fn(attempt)
        except Transient as e:
            if attempt + 1 >= policy.attempts:
                raise
            d = policy.delay(attempt, e.retry_after)
            log.info("%s: %s; retry %d/%d in %.1fs", what, e, attempt + 1, policy.attempts - 1, d)
            time.sleep(d)
    raise AssertionError("unreachable")


def concurrency() -> int:
    """Parallel streams per transfer (``KUBETUNE_TRANSFER_CONCURRENCY`` or the default)."""
    try:
        return max(1, int(os.environ.get(C.ENV_TRANSFER_CONCURRENCY, C.STORAGE_CONCURRENCY)))
    except ValueError:
        return C.STORAGE_CONCURRENCY


# --- files -----------------------------------------------------------------------------------
def part_path(target: Path) -> Path:
    """The temporary name a download is written to before it is verified and renamed."""
    return target.with_name(target.name + C.STORAGE_PART_SUFFIX)


def file_digest(path: Path, algorithm: str = "sha256", *, progress: Callable[[int], None] | None = None) -> str:
    """Hex digest of a file, read in 4 MiB blocks (hashlib releases the GIL, so threads run in parallel)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while True:
            block = f.read(4 << 20)
            if not block:
                break
            h.update(block)
            if progress:
                progress(len(block))
    return h.hexdigest()


def check_sha256(path: Path, expected: str, label: str) -> None:
    """Raise SourceError naming ``label`` (the redacted URI) when the file's sha256 is not ``expected`` (hex, ``sha256:`` optional)."""
    want = expected.lower().removeprefix("sha256:")
    got = file_digest(path)
    if got != want:
        raise SourceError(f"{label}: sha256 mismatch: expected {want}, got {got}",
                          hint="the file changed or was corrupted; check the URI and the expected digest")


def walk_files(root: Path) -> Iterator[tuple[Path, str]]:
    """(path, posix relative path) of every regular file under ``root``, sorted, skipping partial downloads."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(C.STORAGE_PART_SUFFIX):
                continue
            p = Path(dirpath) / name
            if p.is_file():
                yield p, p.relative_to(root).as_posix()


def safe_relpath(rel: str) -> str:
    """A remote key/title made safe as a relative local path; raises ValueError when it escapes."""
    rel = rel.replace("\\", "/")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or rel.startswith("/"):
        raise ValueError(rel)
    return "/".join(parts)


def place(src: Path, dest_dir: Path) -> None:
    """Move everything inside ``src`` into ``dest_dir`` (renames; replaces files of the same name)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dest_dir / entry.name
        if target.is_dir() and not target.is_symlink() and entry.is_dir():
            place(entry, target)
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)


def missing_dirs(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, outermost first (see :func:`remove_empty_dirs`)."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing[::-1]


def remove_empty_dirs(made: list[Path]) -> None:
    """Remove the folders :func:`missing_dirs` listed, innermost first, as long as they are empty."""
    for d in reversed(made):
        try:
            d.rmdir()
        except OSError:
            return


def copy_tree(src: Path, dest_dir: Path, stats: "TransferStats | None" = None) -> None:
    """Copy a file or directory into ``dest_dir`` (a directory's contents; a file by its name)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    if src.is_file():
        _copy_file(src, dest_dir / src.name, stats)
        return
    for path, rel in walk_files(src):
        _copy_file(path, dest_dir / rel, stats)


def _copy_file(src: Path, dest: Path, stats: "TransferStats | None") -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = part_path(dest)
    shutil.copyfile(src, tmp)
    shutil.copystat(src, tmp)
    os.replace(tmp, dest)
    if stats is not None:
        stats.add(src.stat().st_size, 1)


def human_bytes(n: float) -> str:
    """``n`` bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
