"""Uploading a job's local inputs to ``kubernetes.staging_uri`` before the cluster runs it (the effectful half
of staging; ``staging.py`` holds the pure naming rules the pod specs use)."""

from __future__ import annotations

from typing import Callable

from ...errors import BackendError, SpecError
from ...spec import TuneJob
from .pod import cluster_inputs
from .staging import local_path

__all__ = ["stage_inputs"]


def stage_inputs(job: TuneJob, *, push: Callable[..., dict] | None = None, progress: bool = False) -> list[tuple[str, str]]:
    """Upload the job's local model/dataset files to their staged URIs.

    Args:
        job: the job; its local inputs need ``kubernetes.staging_uri``.
        push: the upload function (default :func:`kubetune.storage.push`), ``push(src, uri, ...) -> dict``.
        progress: show upload progress.

    Returns:
        ``(local path, uri)`` for every upload, in spec order.

    Raises:
        SpecError: a local input is missing, or no staging_uri is set.
        SourceError/BackendError: the upload failed.
    """
    uploads = []
    for inp in cluster_inputs(job):
        if inp.local is None:
            continue
        src = local_path(inp.local)
        if not src.exists():
            raise SpecError(f"{inp.field}: local path {src} does not exist")
        if push is None:
            try:
                from ...storage import push as push  # noqa: PLW0127 - the storage module's upload
            except ImportError as e:  # pragma: no cover - storage ships with kubetune
                raise BackendError("kubetune.storage.push is not available to stage local files") from e
        push(str(src), inp.uri, progress=progress)
        uploads.append((str(src), inp.uri))
    return uploads
