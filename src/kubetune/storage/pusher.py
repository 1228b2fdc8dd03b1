"""push: a local file or directory to any scheme that declares PUSH (s3://, oci://, file://), optionally
packed as one .tar.gz first."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import SourceError
from . import schemes
from ._common import Progress, TransferStats, log
from .archive import pack_tar
from .schemes import PUSH
from .uri import parse_uri

__all__ = ["push_with_stats"]


def push_with_stats(src: str | Path, uri: str, *, tar: bool = False, annotations: dict | None = None,
                    progress: bool = False) -> dict:
    """:func:`kubetune.storage.push`: upload and return the summary (uri, bytes, files, seconds, ...)."""
    loc = parse_uri(uri)
    source = Path(src).expanduser().absolute()
    if not source.exists():
        raise SourceError(f"{source}: no such file or directory", hint="give the file or folder to push")
    scheme = schemes.get(loc.scheme, loc.uri)
    if not scheme.supports(PUSH):
        raise SourceError(f"{loc.safe}: push writes to {schemes.listing(schemes.supporting(PUSH))} URIs",
                          hint="e.g. s3://BUCKET/models/NAME")
    stats = TransferStats(uri=loc.safe)
    with tempfile.TemporaryDirectory(prefix="kubetune-push-") as tmp, Progress(f"push {loc.safe}", enabled=progress) as bar:
        if tar:
            source = pack_tar(source, Path(tmp) / (scheme.archive_name(loc) or f"{source.name}.tar.gz"))
        extra = scheme.push(source, loc, stats, bar, annotations)
    stats.finish()
    log.info("pushed %s -> %s (%d bytes in %d files, %.1fs)", src, loc.safe, stats.bytes, stats.files, stats.seconds)
    return {**stats.summary(), **extra}
