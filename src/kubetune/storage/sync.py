"""OutputSync: a run's results go to output.uri, and its checkpoints follow it while training runs.

Remote layout for ``s3://BUCKET/PREFIX`` and ``file:///PATH`` (mirrors the run directory)::

    PREFIX/checkpoints/checkpoint-N/...   KUBETUNE_COMPLETE uploaded last: complete only when it exists
    PREFIX/adapter/ model/ merged/        final artifacts
    PREFIX/result.json spec.yaml status.json events.jsonl logs/
    PREFIX/DONE                           written last: the publish finished

For ``oci://REGISTRY/REPO:TAG`` each thing is an artifact (a tag appears only after all its blobs, so a
tag is complete by construction): ``TAG`` is the adapter (adapter_config.json and
adapter_model.safetensors with their own media types; base model and method in the annotations) or
the full model, ``TAG-merged`` the merged model, ``TAG-run`` the run record, ``TAG-checkpoint-N`` the
checkpoints.

Checkpoints are snapshotted with hard links (instant; training may delete the originals) and uploaded
by one background thread from a queue of at most two: when training outpaces the upload, the older
waiting checkpoint is dropped for the newer one, so ``checkpoint_saved`` never waits on the network.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .. import constants as C
from ..errors import SourceError
from ._common import log, walk_files
from .sync_targets import make_target
from .uri import parse_uri

__all__ = ["OutputSync"]

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def _step(name: str) -> int:
    m = _CKPT_RE.match(name)
    return int(m.group(1)) if m else -1


class OutputSync:
    """Publishes a run's results to ``output.uri`` and mirrors its complete checkpoints there.

    Args:
        uri: ``s3://...``, ``oci://...`` or ``file://...`` (a scheme that declares SYNC in :mod:`.schemes`).
        keep: keep at most this many remote checkpoints (None: all). The oldest go first, marker first.
        emit: called with an event dict (``kubetune.events.make_event``) when a checkpoint is synced or skipped.
        queue_size: checkpoints waiting for upload at most; older waiting ones are dropped for newer ones.

    Raises:
        SourceError: the URI's scheme cannot hold outputs (it is not s3://, oci:// or file://).
    """

    def __init__(self, uri: str, *, keep: int | None = None, emit: Callable[[dict], Any] | None = None,
                 queue_size: int = 2) -> None:
        self.loc = parse_uri(uri)
        self._target: Any = make_target(self.loc)
        self.keep = keep
        self._emit = emit
        self._queue: collections.deque[Path] = collections.deque()
        self._queue_size = max(1, queue_size)
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.synced: list[str] = []  # checkpoint names uploaded, in order
        self.errors: list[str] = []  # background failures (training goes on; publish reports them)

    # -- resume ------------------------------------------------------------------------------
    def pull_latest_checkpoint(
        self,
        local_checkpoints_dir: Path,
        *,
        verify: Callable[[Path], str | None] | None = None,
        on_rejected: Callable[[str, str], Any] | None = None,
    ) -> Path | None:
        """Download the newest complete remote checkpoint into ``local_checkpoints_dir``; None when there is none.

        A local complete checkpoint that is as new or newer (and passes ``verify``) is kept and returned instead.

        Args:
            verify: ``path -> problem or None``, run on each downloaded checkpoint (and on the local ones it is
                compared with); a remote checkpoint with a problem is discarded and the next older one is tried.
            on_rejected: called with ``(name, problem)`` for each remote checkpoint discarded by ``verify``.
        """
        local_dir = Path(local_checkpoints_dir)
        names = sorted(self._target.complete_checkpoints(), key=_step, reverse=True)
        if not names:
            return None
        local = sorted((p for p in local_dir.glob("checkpoint-*") if _step(p.name) >= 0 and (p / C.CHECKPOINT_COMPLETE).is_file()),
                       key=lambda p: _step(p.name), reverse=True) if local_dir.is_dir() else []
        newest_local = next((p for p in local if verify is None or verify(p) is None), None)
        for name in names:
            if newest_local is not None and _step(newest_local.name) >= _step(name):
                return newest_local
            tmp = local_dir / f".{name}.pulling"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self._target.download_checkpoint(name, tmp)
            if not (tmp / C.CHECKPOINT_COMPLETE).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                raise SourceError(f"{self.loc.safe}: remote {name} lost its completion marker while it was downloaded")
            problem = verify(tmp) if verify is not None else None
            if problem is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                log.warning("%s: remote %s is damaged (%s); trying an older one", self.loc.safe, name, problem)
                if on_rejected is not None:
                    on_rejected(name, problem)
                continue
            dest = local_dir / name
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
            log.info("pulled %s from %s", name, self.loc.safe)
            return dest
        return newest_local

    # -- while training ----------------------------------------------------------------------
    def checkpoint_saved(self, ckpt_dir: Path) -> None:
        """Queue a complete checkpoint for upload (returns at once; hard links protect it from rotation)."""
        ckpt_dir = Path(ckpt_dir)
        if not (ckpt_dir / C.CHECKPOINT_COMPLETE).is_file():
            log.warning("%s has no %s marker; not syncing an incomplete checkpoint", ckpt_dir, C.CHECKPOINT_COMPLETE)
            return
        snapshot = _snapshot(ckpt_dir)
        with self._cond:
            if self._closed:
                shutil.rmtree(snapshot, ignore_errors=True)
                return
            while len(self._queue) >= self._queue_size:
                dropped = self._queue.popleft()
                shutil.rmtree(dropped, ignore_errors=True)
                self._event("warning", f"upload of {dropped.name} skipped: {ckpt_dir.name} is newer", checkpoint=dropped.name)
            self._queue.append(snapshot)
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kubetune-sync", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                snapshot = self._queue.popleft()
                self._busy = True
            try:
                started = time.monotonic()
                self._target.upload_checkpoint(snapshot, snapshot.name)
                self.synced.append(snapshot.name)
                self._event("checkpoint", f"synced {snapshot.name} to {self.loc.safe}", checkpoint=snapshot.name,
                            uri=self.loc.safe, seconds=round(time.monotonic() - started, 2))
                if self.keep:
                    self._prune()
            except Exception as e:  # never kill training over a sync; publish reports it
                msg = f"syncing {snapshot.name} to {self.loc.safe} failed: {e}"
                self.errors.append(msg)
                log.warning(msg)
                self._event("warning", msg, checkpoint=snapshot.name)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _prune(self) -> None:
        names = sorted(self._target.complete_checkpoints(), key=_step)
        for old in names[: max(0, len(names) - int(self.keep or 0))]:
            self._target.delete_checkpoint(old)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until queued checkpoints are uploaded; False when ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- at the end --------------------------------------------------------------------------
    def publish(self, run_dir: Path) -> None:
        """Upload the final artifacts (after queued checkpoints); raises SourceError when that fails."""
        self.wait()
        if self.errors:
            self._event("warning", f"{len(self.errors)} checkpoint upload(s) to {self.loc.safe} failed; last: {self.errors[-1]}")
        started = time.monotonic()
        self._target.publish(Path(run_dir))
        log.info("published %s to %s in %.1fs", run_dir, self.loc.safe, time.monotonic() - started)

    def close(self, timeout: float = 600.0) -> None:
        """Finish queued uploads (up to ``timeout`` seconds), then stop the background thread."""
        finished = self.wait(timeout)
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            if not finished:
                self._queue.clear()
            self._cond.notify_all()
        if not finished:
            log.warning("output sync: %d checkpoint upload(s) unfinished after %.0fs", len(pending) + 1, timeout)
            for p in pending:
                shutil.rmtree(p, ignore_errors=True)
        if self._thread is not None:
            self._thread.join(timeout=1.0 if not finished else timeout)

    def _event(self, type_: str, message: str, **data: Any) -> None:
        if self._emit is None:
            return
        from ..events import make_event

        try:
            self._emit(make_event(type_, message, **data))
        except Exception:  # an observer must not break the sync
            log.debug("output sync: event callback failed", exc_info=True)


def _snapshot(ckpt_dir: Path) -> Path:
    """Hard-link a checkpoint into ``<run>/.kubetune-sync/<name>`` (copies where links are impossible)."""
    base = ckpt_dir.parent.parent / C.STORAGE_SYNC_DIR
    snap = base / ckpt_dir.name
    shutil.rmtree(snap, ignore_errors=True)
    for path, rel in walk_files(ckpt_dir):
        out = snap / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, out)
        except OSError:
            shutil.copy2(path, out)
    return snap
