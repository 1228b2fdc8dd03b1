"""Parsing and redacting the URIs that name models, datasets and outputs.

Every message, log line and event shows a URI through :func:`redact`, which masks the user-info part
and the values of credential parameters (presigned S3 URLs, SAS tokens, API keys); both it and
:func:`scrub` are the one definition in :mod:`kubetune.redact`. Each scheme parses its own URIs
(:meth:`kubetune.storage.schemes.Scheme.parse`); the registry says which schemes exist and which are remote.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import SourceError
from ..redact import redact_text, redact_uri
from . import schemes
from .location import Location, archive_kind

__all__ = ["Location", "parse_uri", "is_remote", "redact", "scrub", "archive_kind", "REMOTE_SCHEMES"]

_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "REMOTE_SCHEMES":  # the remote schemes' names, from the registry (it grows when a scheme registers)
        return schemes.names(remote=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_remote(uri: str) -> bool:
    """True for URIs fetched over the network (hf, s3, http(s), oci); False for paths, file:// and builtin://."""
    m = _SCHEME_RE.match(str(uri))
    return bool(m) and m.group(1).lower() in schemes.names(remote=True)


def parse_uri(uri: str | Path, revision: str | None = None) -> Location:
    """Split a URI into its parts (each scheme's own :meth:`~kubetune.storage.schemes.Scheme.parse`).

    Args:
        uri: a plain path, ``file://``, ``builtin://``, ``hf://``, ``s3://``, ``http(s)://`` or ``oci://`` URI,
            or one of a scheme registered in :mod:`kubetune.storage.schemes`.
        revision: hf revision; wins over an ``@revision`` in the URI.

    Raises:
        SourceError: unknown scheme or a URI missing its bucket/registry/repository.
    """
    text = str(uri)
    m = _SCHEME_RE.match(text)
    if not m:
        return Location(uri=text, scheme="file", path=text)
    name = m.group(1).lower()
    scheme = schemes.get(name, text)
    rest = text[m.end():]
    if scheme.env_credentials and "@" in rest.split("/", 1)[0]:
        # s3://KEY:SECRET@bucket would make "KEY:SECRET@bucket" the bucket, named in every later message
        what, where = scheme.env_credentials
        raise SourceError(
            f"{redact(text)}: {name}:// URIs carry no credentials (user-info before the {what})",
            hint=f"remove them from the URI; {where}",
        )
    return scheme.parse(text, name, rest, revision)


def redact(uri: str | Path) -> str:
    """``uri`` without user-info or credential query values, safe to print, log and store (:func:`kubetune.redact.redact_uri`)."""
    return redact_uri(uri)


def scrub(text: str) -> str:
    """``text`` (an error message from a library) with credentials in its URLs masked (:func:`kubetune.redact.redact_text`)."""
    return redact_text(text)
