"""The error tree: every mistake a user can make ends in one of these.

The CLI prints ``str(error)`` (message plus hint) and exits with code 2, without a traceback unless
``--debug`` is given. Bugs are not KubetuneErrors and keep their traceback.

Message and hint are stored with credentials masked (:func:`kubetune.redact.redact_text`): an error names
the URI it is about, and wherever it goes next (the terminal, status.json, a log) carries no password.
"""

from __future__ import annotations

from .redact import redact_text

__all__ = [
    "KubetuneError",
    "SpecError",
    "DataError",
    "SourceError",
    "BackendError",
    "TrainError",
    "JobNotFound",
    "RunDirInUse",
]


class KubetuneError(Exception):
    """Base of all user-facing errors.

    Args:
        message: what went wrong, naming the field, ``file:line`` or URI.
        hint: what to do about it (optional, printed on its own line).
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        message = redact_text(message)
        hint = redact_text(hint) if hint is not None else None
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class SpecError(KubetuneError):
    """The job spec is invalid: unknown keys, wrong types, contradictions."""

    def __init__(self, message: str, *, hint: str | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message, hint=hint)
        self.problems = [redact_text(p) for p in problems] if problems else [self.message]


class DataError(KubetuneError):
    """A dataset cannot be read or does not match any supported format."""


class SourceError(KubetuneError):
    """A model/dataset/output URI cannot be fetched or written."""


class BackendError(KubetuneError):
    """A backend (local processes, Kubernetes, KFP) failed to run or follow a job."""


class JobNotFound(BackendError):
    """No job with the given id or run directory exists."""


class RunDirInUse(BackendError):
    """Another live process (named by its pid) is writing the run directory."""

    def __init__(self, message: str, *, hint: str | None = None, holder_pid: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.holder_pid = holder_pid


class TrainError(KubetuneError):
    """Training failed for a reason the user can act on (out of memory, NaN loss, ...)."""
