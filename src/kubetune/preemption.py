"""Preemption: a SIGTERM that is not a user's cancel makes the worker checkpoint at a step boundary, then stop.

Who sends what, and what it means:

- the kubelet (eviction, node drain, spot preemption) or a ``kubetune run`` killed in the foreground sends the
  worker SIGTERM: **preemption**. The worker saves a checkpoint at the end of the current step and ends in the
  ``preempted`` state; rerunning the spec resumes from that checkpoint.
- ``kubetune cancel`` first writes ``CANCEL_REQUESTED`` (naming the process it stops) into the run directory,
  then sends SIGTERM: **cancellation**, the worker leaves at once (``cancelled``).
- kubetune's launcher (``python -m kubetune.launch``) on SIGTERM creates the file named by
  ``KUBETUNE_PREEMPT_FILE`` before torchrun passes SIGTERM to every rank. A rank under torchrun preempts only
  when that file exists: otherwise torchrun is stopping the survivors of a failed rank.

The signal handler only records the request (:func:`request`); the training loop's callback asks
:func:`agreed` at every step end (an all-reduce when there are several ranks, so that they all save the same
step), saves and stops. A SIGTERM outside the training loop (fetching, loading, publishing) ends the worker at
once, also as ``preempted``: the newest checkpoint on disk is what a rerun resumes from. Nothing here imports
torch until several ranks must agree.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import constants as C
from .ranks import under_torchrun, world_size

__all__ = ["Preempted", "arm", "disarm", "request", "in_progress", "agreed", "seconds_left", "sigterm_kind", "request_cancel"]

_state: dict = {"armed": False, "signum": None, "at": None, "agreed": False}


class Preempted(Exception):
    """The run stopped for a preemption after saving what it could (not a user error, not a bug).

    Args:
        step: the global step the run reached.
        checkpoint: the newest complete checkpoint (what a rerun resumes from), or None.
    """

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        where = f"saved {checkpoint.name} at step {step}" if checkpoint is not None else f"no checkpoint saved (step {step})"
        super().__init__(f"preempted (SIGTERM): {where}; rerun the same spec to resume")
        self.step = step
        self.checkpoint = checkpoint


def arm() -> None:
    """The training loop runs: from now on a preemption waits for the next step boundary.

    Nothing can have been accepted before (a SIGTERM outside the loop ends the worker), so this also forgets
    a preemption of an earlier run in the same process.
    """
    _state.update(armed=True, signum=None, at=None, agreed=False)


def disarm() -> None:
    """The training loop ended: a preemption from now on ends the worker at once."""
    _state["armed"] = False


def request(signum: int) -> bool:
    """Record a preemption; True when the training loop will checkpoint and stop (else leave at once)."""
    if not _state["armed"]:
        return False
    if _state["signum"] is None:
        _state["signum"], _state["at"] = signum, time.monotonic()
    return True


def in_progress() -> bool:
    """A preemption was accepted (by this rank's signal or by the ranks' agreement) and is being carried out."""
    return _state["signum"] is not None or _state["agreed"]


def agreed() -> bool:
    """Whether any rank was preempted: every rank calls this at the same point, so they stop at the same step."""
    mine = _state["signum"] is not None
    if not _state["agreed"]:
        _state["agreed"] = _any_rank(mine)
        if _state["agreed"] and _state["at"] is None:
            _state["at"] = time.monotonic()
    return _state["agreed"]


def seconds_left() -> float:
    """Seconds left of the save budget (``PREEMPT_SAVE_TIMEOUT_S`` from the signal); the whole budget if none."""
    at = _state["at"]
    if at is None:
        return float(C.PREEMPT_SAVE_TIMEOUT_S)
    return max(0.0, C.PREEMPT_SAVE_TIMEOUT_S - (time.monotonic() - at))


def _any_rank(flag: bool) -> bool:
    if world_size() <= 1:
        return flag
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    # The flag travels on the device type the process group's backend reduces over.
    kind = {"nccl": "cuda", "hccl": "hpu", "xccl": "xpu"}.get(str(dist.get_backend()), "cpu")
    device = torch.device(kind, getattr(torch, kind).current_device()) if kind != "cpu" else torch.device("cpu")
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


# --- telling a preemption from a cancel ------------------------------------------------------------
def request_cancel(run_dir: str | os.PathLike, pid: int) -> None:
    """Say, before signalling process (group) ``pid``, that its SIGTERM is a user's cancel (``kubetune cancel``)."""
    path = Path(run_dir) / C.CANCEL_REQUEST_FILE
    try:
        path.write_text(json.dumps({"pid": int(pid), "time": round(time.time(), 3)}), encoding="utf-8")
    except OSError:  # the run directory is gone: the signal alone stops it (as a preemption)
        pass


def _cancel_requested(run_dir: Path | None) -> bool:
    """A ``kubetune cancel`` aimed at this process: its pid, its process group, or the launcher that started it."""
    if run_dir is None:
        return False
    try:
        data = json.loads((Path(run_dir) / C.CANCEL_REQUEST_FILE).read_text(encoding="utf-8"))
        target = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return target in {os.getpid(), os.getpgrp(), int(os.environ.get(C.ENV_LAUNCHER_PID) or 0)}


def sigterm_kind(run_dir: Path | None) -> str:
    """What a SIGTERM to this worker means: ``cancel``, ``preempt``, or ``stopped`` (torchrun ending survivors).

    Args:
        run_dir: the job's run directory (where ``kubetune cancel`` leaves its request).
    """
    if _cancel_requested(run_dir):
        return "cancel"
    if under_torchrun():  # under torchrun: only a preempted kubetune launcher means preemption
        marker = os.environ.get(C.ENV_PREEMPT_FILE)
        return "preempt" if marker and os.path.exists(marker) else "stopped"
    return "preempt"
