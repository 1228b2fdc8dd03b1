"""The Backend protocol: identical for every place a job can run (DESIGN.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, runtime_checkable

from ..events import JobStatus
from ..spec import TuneJob

__all__ = ["Backend", "JobRef", "get_backend", "BACKENDS"]


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
    name: str

    def submit(self, job: TuneJob) -> JobRef: ...

    def status(self, ref: JobRef) -> JobStatus: ...

    def events(self, ref: JobRef) -> list[dict]: ...

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, ref: JobRef) -> None: ...

    def list(self) -> list[JobRef]: ...


def _local(**kw):
    from .local import LocalBackend

    return LocalBackend(**kw)


# name -> factory; backends register here (imports stay lazy).
BACKENDS = {"local": _local, "kubernetes": lambda **kw: __import__("kubetune.backends.kubernetes.backend", fromlist=["_"]).KubernetesBackend(**kw)}
BACKENDS["kfp"] = lambda **kw: __import__("kubetune.backends.kfp", fromlist=["_"]).KfpBackend(**kw)  # Kubeflow Pipelines


def get_backend(name: str, **kwargs) -> Backend:
    """The backend called ``name`` (local, kubernetes, kfp)."""
    from ..errors import BackendError

    try:
        factory = BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend '{name}'; available: {', '.join(BACKENDS)}") from None
    return factory(**kwargs)
