"""Where kubetune keeps its own files: the kubetune home (builtin models, caches, local job registry)."""

from __future__ import annotations

import os
from pathlib import Path

from . import constants as C


def home() -> Path:
    """``$KUBETUNE_HOME``, else ``$XDG_CACHE_HOME/kubetune``, else ``~/.cache/kubetune`` (created)."""
    env = os.environ.get(C.ENV_HOME)
    if env:
        p = Path(env).expanduser()
    else:
        p = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubetune"
    p.mkdir(parents=True, exist_ok=True)
    return p


def jobs_dir() -> Path:
    """The local backend's job registry: one JSON file per submitted job."""
    p = home() / "jobs"
    p.mkdir(parents=True, exist_ok=True)
    return p


def models_dir() -> Path:
    """Where generated builtin models live (``$KUBETUNE_HOME/models``)."""
    p = home() / "models"
    p.mkdir(parents=True, exist_ok=True)
    return p
