"""``http(s)://HOST/PATH``: one file, streamed and resumable (:mod:`kubetune.storage.web`). A sha256 may
ride in the URI as ``#sha256=HEX``: then it is the cache key and the download is checked against it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import SourceError
from ...redact import redact_uri
from .._common import Progress, TransferStats
from ..location import Location, archive_kind
from . import DOWNLOAD, Remote, Scheme, register

__all__ = ["HttpScheme"]


class HttpScheme(Scheme):
    """Plain web servers, presigned URLs, CDNs (credentials in the URL become Basic auth; ``.netrc`` is read)."""

    names = ("http", "https")
    label = "http(s)://"
    remote = True
    content_addressed = True
    operations = frozenset({DOWNLOAD})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """The host (``[user@]host[:port]``) and the path; the query and fragment stay in ``uri``."""
        parts = urlsplit(uri)
        if not parts.hostname:
            raise SourceError(f"{redact_uri(uri)}: no host in the URI", hint="write http(s)://HOST/PATH")
        return Location(uri=uri, scheme=scheme, host=parts.netloc, path=parts.path)

    def expected_digest(self, loc: Location, sha256: str | None) -> str | None:
        """The argument, or the URI's ``#sha256=HEX`` fragment (usable in a job spec); both must agree."""
        frag = urlsplit(loc.uri).fragment
        if not frag:
            return sha256
        key, _, value = frag.partition("=")
        value = value.strip().lower().removeprefix("sha256:")
        if key.strip().lower() != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", value):
            raise SourceError(f"{loc.safe}: unsupported URI fragment '#{frag}'", hint="the only fragment kubetune reads is #sha256=<64 hex digits>")
        if sha256 and sha256.lower().removeprefix("sha256:") != value:
            raise SourceError(f"{loc.safe}: the URI's #sha256 and the sha256 given disagree", hint="give the digest once")
        return value

    def probe(self, loc: Location) -> Remote:
        """A HEAD request: size and validators (strong ETag, else Last-Modified)."""
        from .. import web

        return web.probe(loc)

    def download(self, loc: Location, remote: Any, into: Path, stats: TransferStats, progress: Progress,
                 sha256: str | None) -> Path:
        """GET into ``into/<basename>``, resuming with Range, checked against the size and ``sha256``."""
        from .. import web

        return web.download(loc, into, stats, progress, remote=remote, sha256=sha256)

    def names_single_archive(self, loc: Location, remote: Any) -> bool:
        """The URL's last path segment ends like an archive."""
        return archive_kind(loc.basename) is not None


register(HttpScheme())
