"""Process helpers shared by the backends that run jobs as local processes (local, kfp local mode)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

__all__ = ["alive", "kill_group", "tail", "new_job_id", "registry_entries"]


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
