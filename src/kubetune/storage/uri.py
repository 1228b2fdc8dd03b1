"""Parsing and redacting the URIs that name models, datasets and outputs.

Every message, log line and event shows a URI through :func:`redact`, which masks the user-info part
and the values of credential parameters (presigned S3 URLs, SAS tokens, API keys); both it and
:func:`scrub` are the one definition in :mod:`kubetune.redact`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .. import constants as C
from ..errors import SourceError
from ..redact import redact_text, redact_uri

__all__ = ["Location", "parse_uri", "is_remote", "redact", "scrub", "archive_kind", "REMOTE_SCHEMES"]

REMOTE_SCHEMES = ("hf", "s3", "http", "https", "oci")
_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_ARCHIVES = ((".tar.gz", "tar"), (".tgz", "tar"), (".tar", "tar"), (".zip", "zip"))
# Schemes whose credentials come from the environment only: (what the authority names, where they come from).
_ENV_CREDENTIALS = {
    "s3": ("bucket", "S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role); see docs/storage.md"),
    "oci": ("registry", "registry logins come from KUBETUNE_REGISTRY_USERNAME/PASSWORD or the docker config; see docs/storage.md"),
    "hf": ("organisation", "a Hugging Face token comes from HF_TOKEN or `huggingface-cli login`; see docs/storage.md"),
}


@dataclass(frozen=True)
class Location:
    """A parsed URI.

    Attributes:
        uri: the URI as given.
        scheme: ``file`` (plain paths too), ``builtin``, ``hf``, ``s3``, ``http``, ``https`` or ``oci``.
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
        return redact(self.uri)

    @property
    def local_path(self) -> Path:
        """The path of a local location (``file://`` or a plain path), ``~`` expanded."""
        return Path(self.path).expanduser()

    @property
    def basename(self) -> str:
        """Last path segment (the file name a single-file download gets)."""
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        return unquote(name) or self.host.replace(":", "_") or "download"


def is_remote(uri: str) -> bool:
    """True for URIs fetched over the network (hf, s3, http(s), oci); False for paths, file:// and builtin://."""
    m = _SCHEME_RE.match(str(uri))
    return bool(m) and m.group(1).lower() in REMOTE_SCHEMES


def parse_uri(uri: str | Path, revision: str | None = None) -> Location:
    """Split a URI into its parts.

    Args:
        uri: a plain path, ``file://``, ``builtin://``, ``hf://``, ``s3://``, ``http(s)://`` or ``oci://`` URI.
        revision: hf revision; wins over an ``@revision`` in the URI.

    Raises:
        SourceError: unknown scheme or a URI missing its bucket/registry/repository.
    """
    text = str(uri)
    m = _SCHEME_RE.match(text)
    if not m:
        return Location(uri=text, scheme="file", path=text)
    scheme = m.group(1).lower()
    rest = text[m.end():]
    if scheme in _ENV_CREDENTIALS and "@" in rest.split("/", 1)[0]:
        # s3://KEY:SECRET@bucket would make "KEY:SECRET@bucket" the bucket, named in every later message
        raise SourceError(
            f"{redact(text)}: {scheme}:// URIs carry no credentials (user-info before the {_ENV_CREDENTIALS[scheme][0]})",
            hint=f"remove them from the URI; {_ENV_CREDENTIALS[scheme][1]}",
        )
    if scheme == "file":
        return Location(uri=text, scheme="file", path=unquote(rest) or "/")
    if scheme == C.BUILTIN_SCHEME:
        return Location(uri=text, scheme=scheme, host=rest.strip("/"))
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise SourceError(f"{redact(text)}: no bucket in the URI", hint="write s3://BUCKET/PREFIX")
        return Location(uri=text, scheme=scheme, host=bucket, path=key)
    if scheme in ("http", "https"):
        parts = urlsplit(text)
        if not parts.hostname:
            raise SourceError(f"{redact(text)}: no host in the URI", hint="write http(s)://HOST/PATH")
        return Location(uri=text, scheme=scheme, host=parts.netloc, path=parts.path)
    if scheme == "oci":
        registry, _, repo = rest.partition("/")
        if not registry or not repo:
            raise SourceError(f"{redact(text)}: expected oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]")
        return Location(uri=text, scheme=scheme, host=registry, path=repo)
    if scheme == "hf":
        return _parse_hf(text, rest, revision)
    raise SourceError(
        f"{redact(text)}: unknown URI scheme '{scheme}://'",
        hint="use a local path, file://, builtin://, hf://, s3://, http(s):// or oci://",
    )


def _parse_hf(text: str, rest: str, revision: str | None) -> Location:
    repo_type = "model"
    for prefix, kind in (("datasets/", "dataset"), ("models/", "model"), ("spaces/", "space")):
        if rest.startswith(prefix):
            repo_type, rest = kind, rest[len(prefix):]
            break
    segments = rest.strip("/").split("/")
    if len(segments) < 2 or not segments[0]:
        raise SourceError(f"{redact(text)}: expected hf://ORG/NAME[@REVISION][/PATH] (or hf://datasets/ORG/NAME)")
    org, name = segments[0], segments[1]
    sub = "/".join(segments[2:])
    rev = None
    if "@" in name:
        name, _, rev = name.partition("@")
    return Location(
        uri=text, scheme="hf", host=f"{org}/{name}", path=sub, revision=revision or rev or None, repo_type=repo_type
    )


def redact(uri: str | Path) -> str:
    """``uri`` without user-info or credential query values, safe to print, log and store (:func:`kubetune.redact.redact_uri`)."""
    return redact_uri(uri)


def archive_kind(name: str) -> str | None:
    """``tar`` or ``zip`` when ``name`` ends like an archive we unpack, else None."""
    lower = name.lower().split("?", 1)[0]
    for suffix, kind in _ARCHIVES:
        if lower.endswith(suffix):
            return kind
    return None


def scrub(text: str) -> str:
    """``text`` (an error message from a library) with credentials in its URLs masked (:func:`kubetune.redact.redact_text`)."""
    return redact_text(text)
