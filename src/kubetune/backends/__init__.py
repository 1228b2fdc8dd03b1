"""Where jobs run. The registry: a backend's name -> a factory (imports stay lazy: choosing ``local`` never
imports the Kubernetes client). The protocol every backend keeps is :class:`base.Backend`; a new backend adds
one entry here and passes ``tests/backends/test_conformance.py``."""

from __future__ import annotations

from typing import Any, Callable

from .base import Backend, JobRef

__all__ = ["Backend", "JobRef", "BACKENDS", "get_backend"]


def _local(**kw: Any) -> Backend:
    from .local import LocalBackend

    return LocalBackend(**kw)


def _kubernetes(**kw: Any) -> Backend:
    from .kubernetes.backend import KubernetesBackend

    return KubernetesBackend(**kw)


def _kfp(**kw: Any) -> Backend:
    from .kfp import KfpBackend

    return KfpBackend(**kw)


def _fake(**kw: Any) -> Backend:
    from .fake import FakeBackend

    return FakeBackend(**kw)


# name -> factory: local processes, a Kubernetes cluster, Kubeflow Pipelines, and in memory (tests, dry runs)
BACKENDS: dict[str, Callable[..., Backend]] = {"local": _local, "kubernetes": _kubernetes, "kfp": _kfp, "fake": _fake}


def get_backend(name: str, **kwargs: Any) -> Backend:
    """The backend called ``name`` (local, kubernetes, kfp, fake), built with ``kwargs``.

    Raises:
        BackendError: no backend has that name.
    """
    from ..errors import BackendError

    try:
        factory = BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend '{name}'; available: {', '.join(BACKENDS)}") from None
    return factory(**kwargs)
