"""Distributed training, the rank side: what a worker process that torchrun started does about the others.

kubetune writes no distributed training loop of its own. torchrun (``torch.distributed.run``, or kubetune's
launcher :mod:`kubetune.launch` around it) starts one worker process per rank, and the Trainer does the rest
through its own configuration: DDP by default, FSDP (full shard) with ``training.strategy: fsdp``. What this
module adds, inside each rank:

- :func:`launcher_records_state`, :func:`state_extra`, :func:`terminated_state` and :func:`follow_launcher`:
  who records the job's end (the launcher, or rank 0 under a plain ``torchrun``), and a rank never outlives
  the launcher that started it.
- :func:`record_error`: each rank writes its error where torchrun collects it (``TORCHELASTIC_ERROR_FILE``),
  so that the launcher can tell the rank that failed first.
- :func:`setup`, :func:`check_topology` and :func:`trainer_args`: the collective timeout, the backend (gloo on
  CPU, NCCL on GPU) and the strategy, as Trainer arguments.
- :func:`barrier` and :func:`resume_point`: ranks agree on a checkpoint before it is marked complete, and on
  the checkpoint they resume from.

This process's rank and the world size come from :mod:`kubetune.ranks` (the one reader of torchrun's
variables). torch is imported lazily: ``kubetune --help`` and the worker's non-training stages must not load it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .. import constants as C
from .. import ranks
from ..errors import TrainError

__all__ = [
    "launcher_records_state",
    "state_extra",
    "follow_launcher",
    "terminated_state",
    "record_error",
    "setup",
    "check_topology",
    "trainer_args",
    "barrier",
    "resume_point",
]

# Where torchrun wants a worker's error: one JSON file per rank, read back by the agent when the rank fails.
_ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"


# --- where this process stands -----------------------------------------------------------------
def launcher_records_state() -> bool:
    """True when kubetune's launcher (:func:`kubetune.launch.launch`) started this worker: the launcher, not
    rank 0, records how the job ended."""
    return ranks.under_torchrun() and bool(os.environ.get(C.ENV_LAUNCHER_PID))


def state_extra() -> dict:
    """What rank 0 adds to its ``running`` state: the world size and which launcher owns the job's end."""
    if not ranks.under_torchrun():
        return {}
    extra: dict[str, Any] = {"world_size": ranks.world_size()}
    if os.environ.get(C.ENV_LAUNCHER_PID):
        extra["launcher_pid"] = int(os.environ[C.ENV_LAUNCHER_PID])
    return extra


def terminated_state(signum: int, kind: str = "stopped") -> tuple[str, str]:
    """(state, reason) rank 0 records when a signal ends it at once and no kubetune launcher records it.

    Args:
        kind: what the signal meant (:func:`kubetune.preemption.sigterm_kind`): ``cancel`` (a user's
            ``kubetune cancel``), ``preempt`` (outside the training loop, so nothing newer to save), or
            ``stopped``: under a plain ``torchrun`` a SIGTERM is almost always torchrun stopping the
            survivors after another rank failed, so it is a failure, not a cancellation.
    """
    name = signal.Signals(signum).name
    if kind == "cancel":
        return C.STATE_CANCELLED, f"cancelled by user (received signal {name})"
    if kind == "preempt":
        return C.STATE_PREEMPTED, (
            f"preempted (received signal {name} outside the training loop): nothing newer to save; rerun the same "
            "spec to resume from the newest checkpoint"
        )
    if ranks.under_torchrun():
        return C.STATE_FAILED, (
            f"stopped by torchrun ({name}): another rank failed first or the launch was interrupted; "
            "the first failure is in the log (python -m kubetune.launch names it in the status)"
        )
    return C.STATE_CANCELLED, f"received signal {name}"


def follow_launcher() -> None:
    """Make this worker die with the launcher that started it (Linux; no-op elsewhere and outside a launcher).

    torchrun starts each rank in its own session, so a launcher killed outright (``kill -9``, the OOM killer)
    would leave its ranks training on alone, writing a run directory whose job has already ended.
    """
    launcher = os.environ.get(C.ENV_LAUNCHER_PID)
    if not (launcher and ranks.under_torchrun() and sys.platform.startswith("linux")):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no prctl
        return
    if os.getppid() != int(launcher):  # the launcher died before the request was in place
        os.kill(os.getpid(), signal.SIGKILL)


def record_error(message: str, traceback_text: str = "", *, preempted: bool = False) -> None:
    """Leave this rank's error where torchrun collects it (no-op outside torchrun).

    The format is torch's own (``ErrorHandler.record_exception``), plus a ``kubetune`` entry with a precise
    time, so that :func:`kubetune.launch.root_cause` can order failures that happen within the same second.

    Args:
        preempted: the rank stopped for a preemption after saving (the launcher records ``preempted``).
    """
    path = os.environ.get(_ENV_ERROR_FILE)
    if not path:
        return
    from ..redact import redact_text

    message, traceback_text = redact_text(message), redact_text(traceback_text)
    now = time.time()
    data = {
        "message": {"message": message, "extraInfo": {"py_callstack": traceback_text, "timestamp": str(int(now))}},
        "kubetune": {"rank": ranks.rank(), "time": now, "message": message, "preempted": preempted},
    }
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data), encoding="utf-8")
    except OSError:  # the error still reaches the log; only the summary loses it
        pass


# --- training hooks ----------------------------------------------------------------------------
def setup(job: Any, device: dict) -> None:
    """Check the strategy fits the device and start the process group with the job's collective timeout.

    transformers passes ``ddp_timeout`` to the process group on GPUs but not on CPU, so on CPU the group is
    started here (gloo), before the Trainer, which then uses it.

    Raises:
        TrainError: ``training.strategy: fsdp`` on a CPU (the trainer shards only across accelerators), or
            torchrun started another number of processes than the spec's topology (the global batch would change).
    """
    check_topology(job)
    if job.training.strategy == "fsdp" and device["type"] == "cpu":
        raise TrainError(
            "training.strategy fsdp needs GPUs: the trainer (accelerate) shards a model only across accelerators",
            hint="use training.strategy: ddp on CPU",
        )
    if ranks.world_size() <= 1 or device["type"] != "cpu":
        return
    from datetime import timedelta

    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=job.resources.collective_timeout_seconds))


def check_topology(job: Any) -> None:
    """Check that torchrun started as many processes as the spec's topology says.

    The accumulation steps that keep the global batch constant are derived from ``resources``; a launch with
    another world size would silently train with another global batch (and another step count).

    Raises:
        TrainError: the world size torchrun gave differs from resources.nodes x resources.processes_per_node.
    """
    r = job.resources
    if not ranks.under_torchrun() or ranks.world_size() == r.world_size:
        return
    raise TrainError(
        f"this launch started {ranks.world_size()} processes in all, but the spec says resources.nodes x "
        f"resources.processes_per_node = {r.nodes} x {r.processes_per_node} = {r.world_size}: the global batch "
        "and the step count would not be the ones planned",
        hint="give every launch the spec's topology, or change the spec to match the launch, e.g. "
        "--set resources.nodes=<--nnodes> --set resources.processes_per_node=<--nproc-per-node>",
    )


def trainer_args(job: Any, device: dict) -> dict:
    """Trainer (SFTConfig) arguments for the topology: backend, collective timeout and strategy."""
    out: dict[str, Any] = {"ddp_timeout": job.resources.collective_timeout_seconds}
    if device["type"] == "cpu" and ranks.world_size() > 1:
        out["ddp_backend"] = "gloo"  # accelerate would pick MPI where torch has it; gloo is what we test
    if job.training.strategy == "fsdp":
        import transformers

        # Full shard: parameters, gradients and optimizer state split over the ranks, gathered layer by layer.
        # The wrap policy comes from the model's own _no_split_modules (its decoder layer class).
        if int(transformers.__version__.split(".")[0]) >= 5:
            out["fsdp"] = True
            out["fsdp_config"] = {"version": 2, "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT"}
        else:  # transformers 4.x: FSDP1, configured by the option string
            out["fsdp"] = "full_shard auto_wrap"
            out["fsdp_config"] = {"use_orig_params": True, "sync_module_states": True}
    return out


def barrier() -> None:
    """Wait until every rank gets here (no-op in one process)."""
    if ranks.world_size() <= 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def resume_point(resume: Path | None) -> Path | None:
    """The checkpoint every rank resumes from: rank 0's choice, checked to be readable on this rank.

    Ranks that resumed from different checkpoints would run different step counts and hang; rank 0's
    choice (it may have pulled the checkpoint from output.uri) is the one that counts.

    Raises:
        TrainError: this rank cannot read the checkpoint rank 0 resumes from (no shared run directory).
    """
    if ranks.world_size() <= 1:
        return resume
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return resume
    chosen = [str(resume) if resume else None]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return None
    path = Path(chosen[0])
    if not (path / "trainer_state.json").is_file():
        raise TrainError(
            f"rank {ranks.rank()} cannot read {path}, the checkpoint rank 0 resumes from",
            hint="every node must see the same run directory to resume a multi-node job: put output.dir on shared "
            "storage (a ReadWriteMany volume), or set training.resume: never",
        )
    return path
