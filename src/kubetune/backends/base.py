"""The Backend protocol: identical for every place a job can run (DESIGN.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, runtime_checkable

from ..events import JobStatus
from ..spec import TuneJob

__all__ = ["Backend", "JobRef"]


@dataclass(frozen=True)
class JobRef:
    """A handle on a submitted job.

    Attributes:
        id: unique id of this submission (local: ``<name>-<timestamp>``; clusters: the object name).
        backend: which backend runs it ("local", "kubernetes", "kfp").
        name: the spec's job name.
        run_dir: the local run directory, where the backend keeps one.
        extra: backend-specific coordinates (namespace, flavour, KFP run id, ...).
    """

    id: str
    backend: str
    name: str = ""
    run_dir: str | None = None
    extra: dict = field(default_factory=dict, hash=False, compare=False)


@runtime_checkable
class Backend(Protocol):
    """Where a job runs. Every backend implements exactly this, and :class:`kubetune.Client` uses nothing else.

    Methods take a :class:`JobRef` (the Client turns ids, names and run directories into one with
    :meth:`resolve`). A backend wraps third-party errors in :class:`kubetune.errors.BackendError`.
    """

    name: str

    def submit(self, job: TuneJob) -> JobRef:
        """Start ``job`` and return its reference at once (the job runs on without the caller).

        Raises:
            BackendError: it could not be started (the run directory is in use, the cluster refused it, ...).
        """
        ...

    def status(self, ref: JobRef) -> JobStatus:
        """The job's state, stage and progress now.

        Raises:
            JobNotFound: no such job.
        """
        ...

    def events(self, ref: JobRef) -> list[dict]:
        """Every event the job has recorded so far (see :func:`kubetune.events.make_event`), oldest first."""
        ...

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """The job's worker log lines; with ``follow``, keep yielding until the job ends.

        Where several jobs share one log (local runs of one spec share its run directory), only this job's part;
        ``all_runs`` yields the earlier jobs' parts too, each after a header line naming its job id. A backend
        whose jobs each have a log of their own ignores ``all_runs``.
        """
        ...

    def cancel(self, ref: JobRef) -> None:
        """Stop the job and everything it started; its state becomes ``cancelled`` (a finished job stays as it is)."""
        ...

    def list(self) -> list[JobRef]:
        """The jobs this backend knows, newest first."""
        ...

    def resolve(self, key: str) -> JobRef:
        """The job named by ``key``: a job id, a job name (its newest submission) or, where the backend keeps one,
        a run directory.

        Raises:
            JobNotFound: nothing matches ``key``.
        """
        ...
