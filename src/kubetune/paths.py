"""Where kubetune keeps its own files.

* the kubetune home (:func:`home`): what can be made again, builtin models and caches: ``$KUBETUNE_HOME``, else
  ``$XDG_CACHE_HOME/kubetune``, else ``~/.cache/kubetune``;
* the state directory (:func:`state_dir`): what cannot, the job and sweep registries and the server's database
  and data: ``$KUBETUNE_HOME`` when set (one directory for everything, as tests and containers want), else
  ``$XDG_STATE_HOME/kubetune``, else ``~/.local/state/kubetune``. Registries an older kubetune kept in the cache
  are moved there on first use.
"""

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


def state_dir() -> Path:
    """``$KUBETUNE_HOME`` when set, else ``$XDG_STATE_HOME/kubetune``, else ``~/.local/state/kubetune`` (created)."""
    if os.environ.get(C.ENV_HOME):
        return home()
    p = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "kubetune"
    p.mkdir(parents=True, exist_ok=True)
    return p


def state_path(name: str) -> Path:
    """``state_dir() / name`` (created). Where an older kubetune left it in the cache (``home() / name``) and it is not
    in the state directory yet, it is moved there first, so ``kubetune list`` keeps the jobs run before."""
    p = state_dir() / name
    if not p.exists():
        old = home() / name
        if old != p and old.is_dir():
            import shutil

            try:
                os.replace(old, p)
            except OSError:  # another filesystem: copy, then remove the old copy
                shutil.copytree(old, p, dirs_exist_ok=True)
                shutil.rmtree(old, ignore_errors=True)
    p.mkdir(parents=True, exist_ok=True)
    return p


def jobs_dir() -> Path:
    """The local backend's job registry: one JSON file per submitted job (in the state directory)."""
    return state_path("jobs")


def models_dir() -> Path:
    """Where generated builtin models live (``$KUBETUNE_HOME/models``)."""
    p = home() / "models"
    p.mkdir(parents=True, exist_ok=True)
    return p
