"""Local files reach the cluster: a local model or dataset is uploaded to ``kubernetes.staging_uri``.

Where a file goes is a pure function of the spec (:func:`staged_uri`), so ``kubetune render`` shows the
exact URI that ``kubetune run`` uploads to and the pod fetches from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ...errors import BackendError, SpecError
from ...spec import TuneJob

__all__ = ["is_local", "local_path", "staged_uri", "stage_inputs"]

_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_local(value: str) -> bool:
    """A plain path or a file:// URI."""
    m = _SCHEME_RE.match(value)
    return m is None or m.group(1).lower() == "file"


def local_path(value: str) -> Path:
    return Path(value[len("file://") :] if value.lower().startswith("file://") else value).expanduser()


def staged_uri(job: TuneJob, role: str, value: str) -> str:
    """``<staging_uri>/<job name>/<role>/<file or folder name>``: where a local input is uploaded."""
    name = local_path(value).name or role
    return f"{job.kubernetes.staging_uri}/{job.name}/{role}/{name}"


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
    from .pod import cluster_inputs

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
