"""Where this process stands in a distributed job: the one reader of ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``
and ``LOCAL_WORLD_SIZE``.

torchrun (and ``python -m kubetune.launch``) set these variables in every worker process; a process that
no launcher started is rank 0 of a world of one. Code that asks "am I the process that writes the run
directory?" calls :func:`is_main_process` instead of reading the environment itself.
"""

from __future__ import annotations

import os

from . import constants as C

__all__ = ["rank", "local_rank", "world_size", "local_world_size", "is_main_process", "has_rank"]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer (set by the launcher)") from None


def rank() -> int:
    """This process's global rank: ``RANK``, 0 when no launcher set it."""
    return _env_int(C.ENV_RANK, 0)


def local_rank() -> int:
    """This process's rank on its node (the accelerator it uses): ``LOCAL_RANK``, 0 when unset."""
    return _env_int(C.ENV_LOCAL_RANK, 0)


def world_size() -> int:
    """Processes in the job: ``WORLD_SIZE``, 1 when no launcher set it."""
    return _env_int(C.ENV_WORLD_SIZE, 1)


def local_world_size() -> int:
    """Processes on this node (they share its CPU cores): ``LOCAL_WORLD_SIZE``, 1 when no launcher set it."""
    return max(1, _env_int(C.ENV_LOCAL_WORLD_SIZE, 1))


def is_main_process() -> bool:
    """Whether this is rank 0: the process that writes the run directory and publishes the results."""
    return rank() == 0


def has_rank() -> bool:
    """Whether a launcher set ``RANK`` for this process (false for a stage that must start torchrun itself)."""
    return C.ENV_RANK in os.environ


def under_torchrun() -> bool:
    """True in a process that torchrun (or kubetune's launcher) started: it sets ``TORCHELASTIC_RUN_ID``."""
    return "TORCHELASTIC_RUN_ID" in os.environ
