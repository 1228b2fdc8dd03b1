"""Local files reach the cluster: a local model or dataset is uploaded to ``kubernetes.staging_uri``.

Where a file goes is a pure function of the spec (:func:`staged_uri`), so ``kubetune render`` shows the
exact URI that ``kubetune run`` uploads to and the pod fetches from.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...spec import TuneJob

__all__ = ["is_local", "local_path", "staged_uri"]

_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_local(value: str) -> bool:
    """A plain path or a file:// URI."""
    m = _SCHEME_RE.match(value)
    return m is None or m.group(1).lower() == "file"


def local_path(value: str) -> Path:
    """The local path a plain path or file:// URI names (``~`` expanded)."""
    return Path(value[len("file://") :] if value.lower().startswith("file://") else value).expanduser()


def staged_uri(job: TuneJob, role: str, value: str) -> str:
    """``<staging_uri>/<job name>/<role>/<file or folder name>``: where a local input is uploaded."""
    name = local_path(value).name or role
    return f"{job.kubernetes.staging_uri}/{job.name}/{role}/{name}"
