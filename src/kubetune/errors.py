"""The error tree: every mistake a user can make ends in one of these.

::

    KubetuneError                 base of every user-facing error: message + hint, exit code 2
    +-- SpecError                 the job spec is wrong: unknown key, bad type or value, contradiction,
    |                             or a setting the chosen backend cannot express (raised at load,
    |                             by --set, by preflight checks and by renderers); .problems lists each
    +-- DataError                 a dataset cannot be read or used: missing files or split, a malformed
    |                             row (file:line), no detectable format, an unknown chat template
    +-- SourceError               a URI cannot be fetched or written: not found, no credentials,
    |                             unreachable endpoint, unsafe archive, failed upload (storage/, serve)
    +-- BackendError              where the job runs failed: a process, the Kubernetes or KFP API,
    |   |                         a serving endpoint; wraps the third-party error (``raise ... from e``)
    |   +-- JobNotFound           no job with that id or run directory (status, logs, cancel, sweeps)
    |   `-- RunDirInUse           another live process writes the run directory (.holder_pid names it)
    `-- TrainError                training stopped for a reason the user can act on: out of memory,
                                  NaN loss, no rows left, a dtype the device lacks, nothing to merge

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
