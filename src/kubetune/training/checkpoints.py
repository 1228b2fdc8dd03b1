"""Checkpoints that are complete or invisible, and the choice of which one a run resumes from.

The trainer writes ``checkpoints/checkpoint-N/`` (weights or adapter, optimizer, scheduler, RNG states,
trainer state with the data position). When every file is on disk (flushed), kubetune adds the marker
``KUBETUNE_COMPLETE`` (JSON: step, fingerprint, eval loss) with an atomic rename; only marked checkpoints
exist for resume, rotation, sync and ``best_checkpoint``. A worker killed mid-save leaves an unmarked
directory, which the next run removes with a warning and never loads.
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
from ..events import RunDir, make_event
from ..spec import TuneJob

__all__ = [
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
    method = job.method.model_dump(mode="json") if job.method.type != "full" else "full"
    key = {"model": job.model.source, "method": method}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def read_marker(ckpt: Path) -> dict:
    """The completion marker's data ({} when missing or unreadable)."""
    try:
        data = json.loads((Path(ckpt) / C.CHECKPOINT_COMPLETE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def mark_complete(ckpt: Path, job: TuneJob, *, step: int, eval_loss: float | None = None) -> None:
    """Flush the checkpoint's files to disk, then make it visible with the marker (atomic rename)."""
    ckpt = Path(ckpt)
    for path in ckpt.rglob("*"):
        if path.is_file():
            _fsync(path)
    marker = {"step": step, "fingerprint": checkpoint_fingerprint(job), "time": round(time.time(), 3)}
    if eval_loss is not None:
        marker["eval_loss"] = eval_loss
    tmp = ckpt / f".{C.CHECKPOINT_COMPLETE}.tmp"
    tmp.write_text(json.dumps(marker), encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, ckpt / C.CHECKPOINT_COMPLETE)
    _fsync(ckpt)


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

    ``auto``: the newest complete checkpoint in the run directory (incomplete ones are removed, never
    loaded). ``never``: none; earlier checkpoints are removed so that they cannot be resumed later by
    mistake. A path: that checkpoint, which must be complete.

    Args:
        emit: this process writes the run directory (rank 0): it removes stale checkpoints and reports.

    Raises:
        TrainError: the path is not a complete checkpoint, or the checkpoint belongs to another model/method.
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
                say(make_event("warning", f"training.resume=never: removed {len(old)} earlier checkpoint(s)", removed=[p.name for p in old]))
        return None
    if mode != "auto":
        path = Path(mode).expanduser()
        if not (path / C.CHECKPOINT_COMPLETE).is_file() and not (path / "trainer_state.json").is_file():
            raise TrainError(
                f"training.resume: '{mode}' is not a complete checkpoint directory",
                hint="give a checkpoints/checkpoint-N directory that holds KUBETUNE_COMPLETE, or use auto / never",
            )
        _check_fingerprint(job, path, run)
        say(make_event("checkpoint", f"resuming from {path}", path=str(path), step=checkpoint_step(path), resume=True))
        return path
    if emit:
        for p in incomplete_checkpoints(ckpts):
            say(make_event("warning", f"ignoring incomplete checkpoint {p.name} (removed; it was never finished)", path=str(p)))
            shutil.rmtree(p, ignore_errors=True)
    complete = complete_checkpoints(ckpts)
    if not complete:
        return None
    newest = complete[-1]
    _check_fingerprint(job, newest, run)
    say(make_event("checkpoint", f"resuming from {newest.name}", path=str(newest), step=checkpoint_step(newest), resume=True))
    return newest


def _check_fingerprint(job: TuneJob, ckpt: Path, run: RunDir) -> None:
    recorded = read_marker(ckpt).get("fingerprint")
    if recorded and recorded != checkpoint_fingerprint(job):
        raise TrainError(
            f"{ckpt} was written by a job with a different model or method, so it cannot be resumed",
            hint=f"set training.resume=never to start over in {run.path}, or choose another output.dir",
        )
