"""A parsed URI (:class:`Location`) and the archive names fetch unpacks: what the scheme registry and
:mod:`.uri` both need, so it sits below them (``uri`` re-exports both names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ..redact import redact_uri

__all__ = ["Location", "archive_kind"]

_ARCHIVES = ((".tar.gz", "tar"), (".tgz", "tar"), (".tar", "tar"), (".zip", "zip"))


@dataclass(frozen=True)
class Location:
    """A parsed URI.

    Attributes:
        uri: the URI as given.
        scheme: ``file`` (plain paths too), ``builtin``, ``hf``, ``s3``, ``http``, ``https``, ``oci``, or a
            scheme registered in :mod:`kubetune.storage.schemes`.
        host: bucket (s3), registry (oci), host[:port] (http), ``org/name`` (hf), builtin name.
        path: key prefix (s3), path (http, file), repository:tag (oci), path in the repo (hf).
        revision: hf revision, or None.
        repo_type: hf repo type (``model`` or ``dataset``).
    """

    uri: str
    scheme: str
    host: str = ""
    path: str = ""
    revision: str | None = None
    repo_type: str = "model"

    @property
    def safe(self) -> str:
        """The URI with credentials removed, for messages."""
        return redact_uri(self.uri)

    @property
    def local_path(self) -> Path:
        """The path of a local location (``file://`` or a plain path), ``~`` expanded."""
        return Path(self.path).expanduser()

    @property
    def basename(self) -> str:
        """Last path segment (the file name a single-file download gets)."""
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        return unquote(name) or self.host.replace(":", "_") or "download"


def archive_kind(name: str) -> str | None:
    """``tar`` or ``zip`` when ``name`` ends like an archive we unpack, else None."""
    lower = name.lower().split("?", 1)[0]
    for suffix, kind in _ARCHIVES:
        if lower.endswith(suffix):
            return kind
    return None
