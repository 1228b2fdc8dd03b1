"""Optional parts of kubetune and the packages each needs: one clear message when one is missing.

A training image installs ``kubetune`` alone; serving, the jobs service, the KFP backend, QLoRA, sweep plots
and experiment trackers are extras (pyproject.toml ``[project.optional-dependencies]``). A command that needs
one checks it first (:func:`require`), and the CLI turns any other import of a missing extra's package into
the same message (:func:`missing_extra`) instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

from .errors import KubetuneError

__all__ = ["EXTRAS", "require", "missing_extra"]

# extra -> the top-level modules kubetune imports from it (the distributions are in pyproject.toml).
EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "starlette", "anyio", "prometheus_client"),
    "server": ("sqlalchemy", "alembic", "psycopg", "multipart"),
    "kfp": ("kfp", "kfp_server_api"),
    "qlora": ("bitsandbytes",),
    "sweep": ("matplotlib", "optuna"),
    "tracking": ("tensorboard", "mlflow", "wandb"),
    "llama-stack": ("llama_stack", "llama_stack_client"),
}
_OWNER = {module: extra for extra, modules in EXTRAS.items() for module in modules}


def _error(what: str, extra: str, module: str) -> KubetuneError:
    return KubetuneError(f"{what} needs the '{extra}' extra, which is not installed here (no module {module!r})", hint=f"pip install 'kubetune[{extra}]'")


def require(extra: str, what: str, *, also: tuple[str, ...] = ()) -> None:
    """Raise one clear error naming ``extra`` when one of its modules, or of the extras in ``also`` that it
    brings with it (``server`` brings ``serve``), is missing.

    Args:
        extra: a key of :data:`EXTRAS`, the one to install.
        what: what needs it, for the message (``kubetune serve``).
        also: extras that ``extra`` depends on.
    """
    for name in (*also, extra):
        for module in EXTRAS[name]:
            if not _installed(module):
                raise _error(what, extra, module)


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are blocked, as if it were not installed
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(exc: ImportError) -> KubetuneError | None:
    """The user-facing error for an import of an optional package that is not installed, else None."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = _OWNER.get(name)
    return _error("this command", extra, name) if extra and isinstance(exc, ModuleNotFoundError) else None
