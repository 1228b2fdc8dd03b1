"""The fetch cache: remote models and datasets under ``$KUBETUNE_HOME/cache``, keyed by URI and revision.

An entry is a directory named after the URI (readable prefix + hash of URI and revision) holding
``meta.json`` (the remote fingerprint: ETags and sizes, a manifest digest, a commit) and one data
directory per fingerprint. A fetch whose fingerprint matches the entry's is a cache hit and moves no
bytes; one that does not downloads into ``.partial-<fingerprint>`` (kept when interrupted, so the next
try resumes) and then renames it into place. Entries are locked with ``flock`` so that parallel sweep
trials download a model once and the others wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterator

from .. import constants as C
from .uri import redact

__all__ = ["cache_root", "CacheEntry"]


def cache_root() -> Path:
    """``<kubetune home>/cache`` (home: ``$KUBETUNE_HOME``, else ``$XDG_CACHE_HOME/kubetune``, else ``~/.cache/kubetune``)."""
    try:
        from ..paths import home
    except ImportError:  # pragma: no cover - kubetune.paths is part of the package; kept for partial installs
        env = os.environ.get(C.ENV_HOME)
        base = Path(env).expanduser() if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubetune"
        base.mkdir(parents=True, exist_ok=True)
        return base / C.CACHE_DIR
    return home() / C.CACHE_DIR


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class CacheEntry:
    """One cached URI (+ revision).

    Args:
        uri: the URI (only its redacted form is stored).
        revision: a revision that selects different content for the same URI.
    """

    def __init__(self, uri: str, revision: str | None = None) -> None:
        safe = redact(uri)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", safe.split("://", 1)[-1]).strip("-.")[-48:]
        self.uri = safe
        self.revision = revision
        self.dir = cache_root() / f"{slug}-{_digest(uri, revision or '')[:16]}"
        self.meta_file = self.dir / "meta.json"
        self._made_root = False  # whether locked() created the cache folder itself

    @property
    def lock_file(self) -> Path:
        """The flock file that serialises fetches of this entry."""
        return self.dir.with_name(self.dir.name + ".lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator["CacheEntry"]:
        """Hold the entry's lock (other processes fetching the same URI wait)."""
        self._made_root = not self.dir.parent.exists()
        while True:
            self.dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                fh = open(self.lock_file, "a")
            except FileNotFoundError:  # the cache folder was removed meanwhile (by discard): make it again
                continue
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                current = os.stat(self.lock_file).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            fh.close()  # discard() removed the file we waited on: lock the one that replaced it
        with fh:
            self.dir.mkdir(exist_ok=True)
            try:
                yield self
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _meta(self) -> dict:
        try:
            return json.loads(self.meta_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def lookup(self, fingerprint: str | None) -> Path | None:
        """The cached result for ``fingerprint``, or None (no fingerprint never hits)."""
        if not fingerprint:
            return None
        meta = self._meta()
        if meta.get("fingerprint") != fingerprint:
            return None
        path = self.dir / meta.get("data", "") / meta.get("result", "")
        return path if path.exists() and meta.get("data") else None

    def staging(self, fingerprint: str | None) -> Path:
        """Where a download for ``fingerprint`` goes; kept across interruptions so it resumes."""
        name = f".partial-{_digest(fingerprint)[:16]}" if fingerprint else f".partial-{os.getpid()}-{time.time_ns()}"
        for stale in self.dir.glob(".partial-*"):
            if stale.name != name:
                shutil.rmtree(stale, ignore_errors=True)
        path = self.dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def discard(self, staging: Path) -> None:
        """Forget a failed fill (under the lock): remove ``staging``, and the entry itself when it holds nothing else.

        An entry this fetch created goes entirely (its folder and its lock file), so a refused archive leaves the
        cache as it was; processes waiting on the removed lock file notice and lock its successor.
        """
        shutil.rmtree(staging, ignore_errors=True)
        try:
            self.dir.rmdir()  # only when empty: nothing committed, no other fill's staging
        except OSError:
            return
        self.lock_file.unlink(missing_ok=True)
        if self._made_root:
            try:
                self.dir.parent.rmdir()  # the cache folder this fetch created, while nothing else is in it
            except OSError:
                pass

    def commit(self, staging: Path, result: Path, fingerprint: str | None) -> Path:
        """Make ``staging`` the entry's data; ``result`` (inside staging) is what fetch returns."""
        rel = result.relative_to(staging).as_posix() if result != staging else ""
        data_name = f"data-{_digest(fingerprint or str(time.time_ns()))[:16]}"
        data = self.dir / data_name
        if data.exists():
            shutil.rmtree(data)
        os.replace(staging, data)
        meta = {
            "uri": self.uri,
            "revision": self.revision,
            "fingerprint": fingerprint,
            "data": data_name,
            "result": rel,
            "created": time.time(),
        }
        tmp = self.meta_file.with_name(".meta.json.tmp")
        tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        os.replace(tmp, self.meta_file)
        for old in self.dir.glob("data-*"):
            if old.name != data_name:
                shutil.rmtree(old, ignore_errors=True)
        return data / rel if rel else data
