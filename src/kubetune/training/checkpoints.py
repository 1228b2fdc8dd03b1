"""Checkpoints that are complete or invisible, and the choice of which one a run resumes from.

The trainer writes ``checkpoints/checkpoint-N/`` (weights or adapter, optimizer, scheduler, RNG states,
trainer state with the data position and the tokens seen). When every file is on disk (flushed), kubetune
adds the marker ``KUBETUNE_COMPLETE`` (JSON: step, fingerprint, eval loss, and every file's size with a
sha256 of each file up to ``CHECKPOINT_DIGEST_MAX_BYTES``) with an atomic rename; only marked checkpoints
exist for resume, rotation, sync and ``best_checkpoint``. A worker killed mid-save leaves an unmarked
directory, which the next run removes with a warning and never loads.

A marked checkpoint can still be damaged later (a truncated copy, a disk error, a bad upload): resume
verifies the files against the marker and falls back to the newest checkpoint that verifies, moving the
damaged ones aside to ``corrupt-checkpoint-N``. Markers written before sizes were recorded cannot be
verified and are accepted as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from .. import constants as C
from ..errors import TrainError
from ..events import EventType, RunDir, make_event
from ..spec import TuneJob

__all__ = [
    "verify_checkpoint",
    "pull_checkpoint",
    "complete_checkpoints",
    "incomplete_checkpoints",
    "find_resume_checkpoint",
    "checkpoint_fingerprint",
    "checkpoint_step",
    "mark_complete",
    "read_marker",
    "rotate_checkpoints",
    "best_checkpoint",
]

_PREFIX = "checkpoint-"


def checkpoint_step(path: Path) -> int:
    """The step in a ``checkpoint-N`` directory name (-1 when it is not one)."""
    name = Path(path).name
    if not name.startswith(_PREFIX):
        return -1
    try:
        return int(name[len(_PREFIX) :])
    except ValueError:
        return -1


def _checkpoint_dirs(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.iterdir() if p.is_dir() and checkpoint_step(p) >= 0), key=checkpoint_step)


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoints under ``ckpt_dir`` that carry the completion marker, oldest first."""
    return [p for p in _checkpoint_dirs(Path(ckpt_dir)) if (p / C.CHECKPOINT_COMPLETE).is_file()]


def incomplete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoint directories without the marker: being written, or left by a crash."""
    return [p for p in _checkpoint_dirs(Path(ckpt_dir)) if not (p / C.CHECKPOINT_COMPLETE).is_file()]


def checkpoint_fingerprint(job: TuneJob) -> str:
    """What a checkpoint must agree on to be resumed: the model and the method (not epochs or learning rate)."""
    m = job.method
    method = m.model_dump(mode="json", exclude={"objective", "dpo", "orpo"}) if m.type != "full" else "full"
    key: dict = {"model": job.model.source, "method": method}
    if m.preference:  # an SFT checkpoint does not continue as DPO/ORPO (beta and friends may change, like the learning rate)
        key["objective"] = m.objective
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _marker_data(ckpt: Path) -> dict | None:
    """The marker's data, or None when it is missing or not a JSON object."""
    try:
        data = json.loads((Path(ckpt) / C.CHECKPOINT_COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_marker(ckpt: Path) -> dict:
    """The completion marker's data ({} when missing or unreadable)."""
    try:
        data = json.loads((Path(ckpt) / C.CHECKPOINT_COMPLETE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def mark_complete(ckpt: Path, fingerprint: str, *, step: int, eval_loss: float | None = None) -> None:
    """Flush the checkpoint's files to disk, record their sizes and digests, then make it visible with the marker.

    Args:
        ckpt: the checkpoint directory the trainer has just written.
        fingerprint: :func:`checkpoint_fingerprint` of the job, taken before any library saw the spec.
        step: the global step it holds.
        eval_loss: the evaluation loss at that step, if there was one.
    """
    ckpt = Path(ckpt)
    files = {}
    for path in sorted(ckpt.rglob("*")):
        if not path.is_file() or path.name in (C.CHECKPOINT_COMPLETE, f".{C.CHECKPOINT_COMPLETE}.tmp"):
            continue
        files[path.relative_to(ckpt).as_posix()] = _file_record(path)
        _fsync(path)
    marker = {"step": step, "fingerprint": fingerprint, "time": round(time.time(), 3), "files": files}
    if eval_loss is not None:
        marker["eval_loss"] = eval_loss
    tmp = ckpt / f".{C.CHECKPOINT_COMPLETE}.tmp"
    tmp.write_text(json.dumps(marker), encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, ckpt / C.CHECKPOINT_COMPLETE)
    _fsync(ckpt)


def _file_record(path: Path) -> dict:
    size = path.stat().st_size
    record: dict = {"size": size}
    if size <= C.CHECKPOINT_DIGEST_MAX_BYTES:
        record["sha256"] = _sha256(path)
    return record


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_checkpoint(ckpt: Path) -> str | None:
    """What is wrong with a marked checkpoint's files, or None when they match its marker.

    Every file the marker lists must exist with its recorded size, and with its recorded sha256 where one
    was recorded. A marker without a file list (written by kubetune before it recorded them) cannot be
    checked: such a checkpoint is accepted (None).
    """
    ckpt = Path(ckpt)
    marker = _marker_data(ckpt)
    if marker is None:
        return f"its {C.CHECKPOINT_COMPLETE} marker is missing or unreadable"
    files = marker.get("files")
    if files is None:
        return None  # an older marker: nothing recorded to check against
    if not isinstance(files, dict):
        return f"its {C.CHECKPOINT_COMPLETE} marker has no readable file list"
    for rel, want in sorted(files.items()):
        path = ckpt / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if not isinstance(want, dict) or size != want.get("size"):
            return f"{rel} has {size} bytes, {want.get('size') if isinstance(want, dict) else '?'} were written"
        digest = want.get("sha256")
        if digest:
            try:
                actual = _sha256(path)
            except OSError as e:
                return f"{rel} cannot be read ({e.strerror or e})"
            if actual != digest:
                return f"{rel} does not match the sha256 recorded when it was written"
    return None


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


def best_checkpoint(ckpt_dir: Path) -> dict | None:
    """The complete checkpoint with the lowest recorded eval loss: ``{path, step, eval_loss}``, or None."""
    best = None
    for p in complete_checkpoints(ckpt_dir):
        loss = read_marker(p).get("eval_loss")
        if loss is not None and (best is None or loss < best["eval_loss"]):
            best = {"path": str(p), "step": checkpoint_step(p), "eval_loss": loss}
    return best


def rotate_checkpoints(ckpt_dir: Path, keep: int | None) -> list[Path]:
    """Delete complete checkpoints beyond the newest ``keep``, sparing the best one; returns what went.

    The marker goes first, so a checkpoint half deleted by a crash is incomplete, not corrupt-but-visible.
    """
    if keep is None:
        return []
    complete = complete_checkpoints(ckpt_dir)
    best = best_checkpoint(ckpt_dir)
    spared = {Path(best["path"])} if best else set()
    removed = []
    for p in complete[: max(0, len(complete) - keep)]:
        if p in spared:
            continue
        (p / C.CHECKPOINT_COMPLETE).unlink(missing_ok=True)
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def find_resume_checkpoint(job: TuneJob, run: RunDir, *, emit: bool = True) -> Path | None:
    """The checkpoint this run continues from, per ``training.resume``.

    ``auto``: the newest complete checkpoint in the run directory whose files verify (incomplete ones are
    removed, never loaded; damaged ones are moved aside with a warning). ``never``: none; earlier checkpoints
    are removed so that they cannot be resumed later by mistake. A path: that checkpoint, which must be
    complete and, when it has a marker, verify.

    Args:
        emit: this process writes the run directory (rank 0): it removes stale checkpoints and reports.

    Raises:
        TrainError: the path is not a complete checkpoint or is damaged, no checkpoint is intact, or the
            checkpoint belongs to another model/method.
    """
    mode = job.training.resume
    ckpts = run.checkpoints_dir
    say: Callable[[dict], object] = run.emit if emit else (lambda ev: None)
    if mode == "never":
        if emit:
            old = _checkpoint_dirs(ckpts)
            for p in old:
                (p / C.CHECKPOINT_COMPLETE).unlink(missing_ok=True)
                shutil.rmtree(p, ignore_errors=True)
            if old:
                say(make_event(EventType.WARNING, f"training.resume=never: removed {len(old)} earlier checkpoint(s)", removed=[p.name for p in old]))
        return None
    if mode != "auto":
        path = Path(mode).expanduser()
        if not (path / C.CHECKPOINT_COMPLETE).is_file() and not (path / "trainer_state.json").is_file():
            raise TrainError(
                f"training.resume: '{mode}' is not a complete checkpoint directory",
                hint="give a checkpoints/checkpoint-N directory that holds KUBETUNE_COMPLETE, or use auto / never",
            )
        problem = verify_checkpoint(path) if (path / C.CHECKPOINT_COMPLETE).is_file() else None
        if problem:
            raise TrainError(
                f"training.resume: checkpoint {path} is damaged ({problem})",
                hint="restore its files, choose an earlier checkpoint, or use auto / never",
            )
        _check_fingerprint(job, path, run)
        say(make_event(EventType.CHECKPOINT, f"resuming from {path}", path=str(path), step=checkpoint_step(path), resume=True))
        return path
    if emit:
        for p in incomplete_checkpoints(ckpts):
            say(make_event(EventType.WARNING, f"ignoring incomplete checkpoint {p.name} (removed; it was never finished)", path=str(p)))
            shutil.rmtree(p, ignore_errors=True)
    complete = complete_checkpoints(ckpts)
    if not complete:
        return None
    newest = _newest_intact(complete, run) if emit else complete[-1]  # other ranks take rank 0's choice
    _check_fingerprint(job, newest, run)
    say(make_event(EventType.CHECKPOINT, f"resuming from {newest.name}", path=str(newest), step=checkpoint_step(newest), resume=True))
    return newest


def _newest_intact(complete: list[Path], run: RunDir) -> Path:
    """The newest checkpoint whose files verify; newer damaged ones are moved aside with a warning.

    Raises:
        TrainError: none of them verifies (they are left in place, to be restored or inspected).
    """
    damaged: list[tuple[Path, str]] = []
    for ckpt in reversed(complete):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            break
        damaged.append((ckpt, problem))
    else:
        listing = "; ".join(f"{p.name}: {why}" for p, why in damaged)
        raise TrainError(
            f"no checkpoint in {run.checkpoints_dir} is intact, so the run cannot resume ({listing})",
            hint="restore the checkpoint files (from output.uri or a backup), or set training.resume=never to start over",
        )
    for bad, problem in damaged:
        aside = _quarantine(bad)
        run.emit(
            make_event(
                EventType.WARNING,
                f"checkpoint {bad} is damaged ({problem}): moved aside to {aside.name}, resuming from {ckpt.name} instead",
                path=str(bad), moved_to=str(aside), problem=problem,
            )
        )
    return ckpt


def _quarantine(ckpt: Path) -> Path:
    """Move a damaged checkpoint out of the way (kept for inspection; nothing resumes, syncs or rotates it)."""
    aside = ckpt.with_name(f"{C.CHECKPOINT_QUARANTINE_PREFIX}{ckpt.name}")
    if aside.exists():
        aside = ckpt.with_name(f"{C.CHECKPOINT_QUARANTINE_PREFIX}{ckpt.name}-{int(time.time())}")
    os.replace(ckpt, aside)
    return aside


def pull_checkpoint(sync, run: RunDir) -> Path | None:
    """Bring the newest intact checkpoint of ``output.uri`` into the run directory (``training.resume: auto``).

    A remote checkpoint is verified against its own marker after the download; a damaged one is dropped with a
    warning and the next older one is tried. A local checkpoint that verifies and is as new is kept.

    Args:
        sync: the run's :class:`kubetune.storage.OutputSync`.
        run: the run directory (rank 0).
    """

    def rejected(name: str, problem: str) -> None:
        run.emit(make_event(EventType.WARNING, f"{sync.loc.safe}: remote {name} is damaged ({problem}): not resuming from it", checkpoint=name, problem=problem))

    pulled = sync.pull_latest_checkpoint(run.checkpoints_dir, verify=verify_checkpoint, on_rejected=rejected)
    if pulled is not None:
        run.emit(make_event(EventType.CHECKPOINT, f"pulled {pulled.name} from {sync.loc.safe}", path=str(pulled)))
    return pulled


def _check_fingerprint(job: TuneJob, ckpt: Path, run: RunDir) -> None:
    recorded = read_marker(ckpt).get("fingerprint")
    if recorded and recorded != checkpoint_fingerprint(job):
        raise TrainError(
            f"{ckpt} was written by a job with a different model or method, so it cannot be resumed",
            hint=f"set training.resume=never to start over in {run.path}, or choose another output.dir",
        )
