"""Process helpers shared by the backends that run jobs as local processes (local, kfp local mode)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import constants as C
from ..errors import BackendError

if TYPE_CHECKING:
    from ..spec import TuneJob

__all__ = ["alive", "kill_group", "tail", "new_job_id", "registry_entries", "worker_env"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped yet, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone already is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, n: int) -> str:
    """The last ``n`` lines of a text file ("" when it cannot be read)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def new_job_id(name: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<4 hex>``: sortable by time, unique across quick resubmits."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def registry_entries(directory: Path) -> list[dict]:
    """The job records (``<id>.json``) in a backend's registry folder, newest first; unreadable ones are skipped."""
    entries = []
    for f in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            entries.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return entries


# Linux refuses to start a process with one environment string longer than this (MAX_ARG_STRLEN).
_MAX_ENV_BYTES = 128 * 1024 - 1


def worker_env(job: "TuneJob", job_id: str) -> dict[str, str]:
    """The worker's environment: ours, its job id, and the resolved spec in ``$KUBETUNE_WORKER_SPEC``.

    Why the environment and not a file or stdin: spec.yaml in the run directory is redacted (it is read by
    people, ``kubetune logs`` and published to output.uri), so the real URIs travel another way. The
    environment is never written to disk (no file to leak or to clean up after a crash or ``kill -9``), is
    readable only by the same user (``/proc/PID/environ`` is 0400, like the AWS_* and HF_TOKEN credentials
    kubetune already takes from there), needs no writer alive after ``--detach`` returns (a pipe would), and
    reaches every torchrun worker without plumbing. The worker removes it from its own environment at start.

    Raises:
        BackendError: the spec is too large for one environment variable.
    """
    from ..spec import spec_to_dict

    spec = json.dumps(spec_to_dict(job), separators=(",", ":"))
    if len(spec.encode()) + len(C.ENV_WORKER_SPEC) + 1 > _MAX_ENV_BYTES:
        raise BackendError(
            f"the resolved spec is {len(spec.encode())} bytes, more than a process environment variable may hold",
            hint="shorten the spec (long kubernetes/kfp sections, many dataset.mix entries) for local runs",
        )
    return {**os.environ, C.ENV_JOB_ID: job_id, "PYTHONUNBUFFERED": "1", C.ENV_WORKER_SPEC: spec}
