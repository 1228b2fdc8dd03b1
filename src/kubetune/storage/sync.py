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
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .. import constants as C
from ..errors import SourceError
from ._common import Progress, TransferStats, log, walk_files
from .uri import Location, parse_uri, redact

__all__ = ["OutputSync"]

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_RUN_FILES = (C.RESULT_FILE, C.SPEC_FILE, C.STATUS_FILE, C.EVENTS_FILE)
_ARTIFACT_DIRS = (C.ADAPTER_DIR, C.MODEL_DIR, C.MERGED_DIR)


def _step(name: str) -> int:
    m = _CKPT_RE.match(name)
    return int(m.group(1)) if m else -1


class OutputSync:
    """Publishes a run's results to ``output.uri`` and mirrors its complete checkpoints there.

    Args:
        uri: ``s3://...``, ``oci://...`` or ``file://...``.
        keep: keep at most this many remote checkpoints (None: all). The oldest go first, marker first.
        emit: called with an event dict (``kubetune.events.make_event``) when a checkpoint is synced or skipped.
        queue_size: checkpoints waiting for upload at most; older waiting ones are dropped for newer ones.

    Raises:
        SourceError: the URI is not s3://, oci:// or file://.
    """

    def __init__(self, uri: str, *, keep: int | None = None, emit: Callable[[dict], Any] | None = None,
                 queue_size: int = 2) -> None:
        self.loc = parse_uri(uri)
        if self.loc.scheme == "s3":
            self._target: Any = _PrefixTarget(self.loc, _S3Store(self.loc))
        elif self.loc.scheme == "file":
            self._target = _PrefixTarget(self.loc, _FileStore(self.loc))
        elif self.loc.scheme == "oci":
            self._target = _OciTarget(self.loc)
        else:
            raise SourceError(f"{self.loc.safe}: output.uri must be s3://, oci:// or file://")
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
    def pull_latest_checkpoint(self, local_checkpoints_dir: Path) -> Path | None:
        """Download the newest complete remote checkpoint into ``local_checkpoints_dir``; None when there is none.

        A local complete checkpoint that is as new or newer is kept and returned instead.
        """
        local_dir = Path(local_checkpoints_dir)
        names = self._target.complete_checkpoints()
        if not names:
            return None
        name = max(names, key=_step)
        local = local_dir / name
        newest_local = max((p for p in local_dir.glob("checkpoint-*") if (p / C.CHECKPOINT_COMPLETE).is_file()),
                           key=lambda p: _step(p.name), default=None) if local_dir.is_dir() else None
        if newest_local is not None and _step(newest_local.name) >= _step(name):
            return newest_local
        tmp = local_dir / f".{name}.pulling"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._target.download_checkpoint(name, tmp)
        if not (tmp / C.CHECKPOINT_COMPLETE).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise SourceError(f"{self.loc.safe}: remote {name} lost its completion marker while it was downloaded")
        if local.exists():
            shutil.rmtree(local)
        os.replace(tmp, local)
        log.info("pulled %s from %s", name, self.loc.safe)
        return local

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


# --- s3:// and file:// ----------------------------------------------------------------------
class _S3Store:
    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.bucket = loc.host
        self.base = loc.path.strip("/")

    def key(self, rel: str) -> str:
        return f"{self.base}/{rel}" if self.base else rel

    def list(self, rel_prefix: str) -> list[str]:
        from . import s3

        root = self.key("")
        try:
            return [k[len(root):] for k, *_ in s3.list_objects(self.bucket, self.key(rel_prefix))]
        except Exception as e:
            raise s3.map_error(e, self.loc) from None

    def upload(self, files: list[tuple[Path, str]], last: list[tuple[Path, str]]) -> None:
        from . import s3

        stats = TransferStats(uri=self.loc.safe)
        s3.upload_files(self.bucket, [(p, self.key(r)) for p, r in files], self.loc, stats, Progress("", enabled=False),
                        last=[(p, self.key(r)) for p, r in last])

    def download(self, rel_prefix: str, into: Path) -> None:
        from . import s3

        sub = Location(uri=f"s3://{self.bucket}/{self.key(rel_prefix)}", scheme="s3", host=self.bucket, path=self.key(rel_prefix))
        s3.download(s3.probe(sub), sub, into, TransferStats(), Progress("", enabled=False))

    def delete(self, rel_prefix: str, first: list[str]) -> None:
        from . import s3

        s3.delete_prefix(self.bucket, self.key(rel_prefix), self.loc, first=[self.key(f) for f in first])


class _FileStore:
    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.root = loc.local_path

    def list(self, rel_prefix: str) -> list[str]:
        base = self.root / rel_prefix
        return [f"{rel_prefix.rstrip('/')}/{rel}" for _, rel in walk_files(base)] if base.is_dir() else []

    def upload(self, files: list[tuple[Path, str]], last: list[tuple[Path, str]]) -> None:
        for path, rel in list(files) + list(last):
            out = self.root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + C.STORAGE_PART_SUFFIX)
            shutil.copyfile(path, tmp)
            os.replace(tmp, out)

    def download(self, rel_prefix: str, into: Path) -> None:
        from ._common import copy_tree

        copy_tree(self.root / rel_prefix, into)

    def delete(self, rel_prefix: str, first: list[str]) -> None:
        for f in first:
            (self.root / f).unlink(missing_ok=True)
        shutil.rmtree(self.root / rel_prefix, ignore_errors=True)


class _PrefixTarget:
    """Checkpoints and artifacts under a prefix of a bucket or a folder."""

    def __init__(self, loc: Location, store: Any) -> None:
        self.loc = loc
        self.store = store

    def complete_checkpoints(self) -> list[str]:
        names = set()
        for rel in self.store.list(f"{C.CHECKPOINTS_DIR}/"):
            parts = rel.split("/")
            if len(parts) == 3 and parts[2] == C.CHECKPOINT_COMPLETE and _CKPT_RE.match(parts[1]):
                names.add(parts[1])
        return sorted(names, key=_step)

    def upload_checkpoint(self, local: Path, name: str) -> None:
        rel = f"{C.CHECKPOINTS_DIR}/{name}"
        files = [(p, f"{rel}/{r}") for p, r in walk_files(local) if r != C.CHECKPOINT_COMPLETE]
        self.store.upload(files, [(local / C.CHECKPOINT_COMPLETE, f"{rel}/{C.CHECKPOINT_COMPLETE}")])

    def download_checkpoint(self, name: str, into: Path) -> None:
        self.store.download(f"{C.CHECKPOINTS_DIR}/{name}/", into)

    def delete_checkpoint(self, name: str) -> None:
        rel = f"{C.CHECKPOINTS_DIR}/{name}"
        self.store.delete(f"{rel}/", first=[f"{rel}/{C.CHECKPOINT_COMPLETE}"])

    def publish(self, run_dir: Path) -> None:
        files: list[tuple[Path, str]] = []
        for d in _ARTIFACT_DIRS + (C.LOGS_DIR,):
            if (run_dir / d).is_dir():
                files += [(p, f"{d}/{r}") for p, r in walk_files(run_dir / d)]
        files += [(run_dir / f, f) for f in _RUN_FILES if (run_dir / f).is_file()]
        with _done_marker() as done:
            self.store.upload(files, [(done, C.DONE_FILE)])


class _done_marker:
    def __enter__(self) -> Path:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="kubetune-done-")
        os.write(fd, f"{time.time():.3f}\n".encode())
        os.close(fd)
        self.path = Path(name)
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


# --- oci:// ----------------------------------------------------------------------------------
class _OciTarget:
    """Checkpoints and artifacts as tags of one repository."""

    def __init__(self, loc: Location) -> None:
        from . import oci

        self.loc = loc
        self.repo, self.tag = oci._split(loc)
        if self.tag.startswith("sha256:"):
            raise SourceError(f"{loc.safe}: output.uri needs a tag, not a digest", hint="e.g. oci://REGISTRY/REPO:v1")

    def _at(self, tag: str) -> Location:
        uri = f"oci://{self.loc.host}/{self.repo}:{tag}"
        return Location(uri=uri, scheme="oci", host=self.loc.host, path=f"{self.repo}:{tag}")

    def complete_checkpoints(self) -> list[str]:
        from . import oci

        pattern = re.compile(rf"^{re.escape(self.tag)}-(checkpoint-\d+)$")
        return sorted((m.group(1) for t in oci.list_tags(self.loc) if (m := pattern.match(t))), key=_step)

    def upload_checkpoint(self, local: Path, name: str) -> None:
        from . import oci

        files = [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(local)]
        oci.push_files(self._at(f"{self.tag}-{name}"), files, TransferStats(), Progress("", enabled=False),
                       annotations={C.OCI_ANNOTATION_KIND: "checkpoint", C.OCI_ANNOTATION_TITLE: name})

    def download_checkpoint(self, name: str, into: Path) -> None:
        from . import oci

        at = self._at(f"{self.tag}-{name}")
        oci.download(at, oci.probe(at), into, TransferStats(), Progress("", enabled=False))

    def delete_checkpoint(self, name: str) -> None:
        from . import oci

        if not oci.delete_tag(self.loc, f"{self.tag}-{name}"):
            log.debug("%s: registry does not allow deletes; keeping %s", self.loc.safe, name)

    def publish(self, run_dir: Path) -> None:
        from . import oci

        base_model, method = _run_facts(run_dir)
        result = _read_json(run_dir / C.RESULT_FILE)
        notes = {
            C.OCI_ANNOTATION_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            C.OCI_ANNOTATION_BASE_MODEL: base_model,
            C.OCI_ANNOTATION_METHOD: method,
        }
        config = json.dumps({"base_model": base_model, "method": method, "result": result}, default=str).encode()
        stats, bar = TransferStats(), Progress("", enabled=False)
        adapter, model = run_dir / C.ADAPTER_DIR, run_dir / C.MODEL_DIR
        if adapter.is_dir():
            files = []
            for p, rel in walk_files(adapter):
                media = {"adapter_config.json": C.OCI_MEDIA_ADAPTER_CONFIG,
                         "adapter_model.safetensors": C.OCI_MEDIA_ADAPTER_WEIGHTS}.get(rel)
                if media:
                    files.append((p, rel, media))
            if not any(m == C.OCI_MEDIA_ADAPTER_WEIGHTS for *_, m in files):
                raise SourceError(f"{run_dir / C.ADAPTER_DIR}: no adapter_model.safetensors to publish")
            oci.push_files(self.loc, files, stats, bar, config=(config, C.OCI_MEDIA_RUN_CONFIG),
                           artifact_type=C.OCI_ARTIFACT_ADAPTER, annotations={**notes, C.OCI_ANNOTATION_KIND: "adapter"})
        elif model.is_dir():
            oci.push_files(self.loc, [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(model)], stats, bar,
                           config=(config, C.OCI_MEDIA_RUN_CONFIG), annotations={**notes, C.OCI_ANNOTATION_KIND: "model"})
        merged = run_dir / C.MERGED_DIR
        if merged.is_dir():
            oci.push_files(self._at(f"{self.tag}-merged"), [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(merged)],
                           stats, bar, config=(config, C.OCI_MEDIA_RUN_CONFIG), annotations={**notes, C.OCI_ANNOTATION_KIND: "merged"})
        record = [(run_dir / f, f, C.OCI_MEDIA_FILE) for f in _RUN_FILES if (run_dir / f).is_file()]
        if record:
            oci.push_files(self._at(f"{self.tag}-run"), record, stats, bar, annotations={**notes, C.OCI_ANNOTATION_KIND: "run"})


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _run_facts(run_dir: Path) -> tuple[str, str]:
    """(base model URI, method) from the run's spec.yaml, falling back to adapter_config.json."""
    base, method = "", ""
    try:
        import yaml

        spec = yaml.safe_load((run_dir / C.SPEC_FILE).read_text(encoding="utf-8")) or {}
        base = str((spec.get("model") or {}).get("source") or "")
        method = str((spec.get("method") or {}).get("type") or "")
    except Exception:  # a missing or odd spec only costs the annotation
        pass
    if not base:
        base = str(_read_json(run_dir / C.ADAPTER_DIR / "adapter_config.json").get("base_model_name_or_path") or "")
    return redact(base), method
