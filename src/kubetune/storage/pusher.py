"""push: a local file or directory to s3://, oci:// or file://, optionally packed as one .tar.gz."""

from __future__ import annotations

import datetime as _dt
import tempfile
from pathlib import Path

from .. import constants as C
from ..errors import SourceError
from ._common import Progress, TransferStats, copy_tree, log, walk_files
from .archive import pack_tar
from .uri import Location, archive_kind, parse_uri

__all__ = ["push_with_stats"]


def push_with_stats(src: str | Path, uri: str, *, tar: bool = False, annotations: dict | None = None,
                    progress: bool = False) -> dict:
    """:func:`kubetune.storage.push`: upload and return the summary (uri, bytes, files, seconds, ...)."""
    loc = parse_uri(uri)
    source = Path(src).expanduser().absolute()
    if not source.exists():
        raise SourceError(f"{source}: no such file or directory", hint="give the file or folder to push")
    if loc.scheme not in ("s3", "oci", "file"):
        raise SourceError(f"{loc.safe}: push writes to s3://, oci:// or file:// URIs", hint="e.g. s3://BUCKET/models/NAME")
    stats = TransferStats(uri=loc.safe)
    extra: dict = {}
    with tempfile.TemporaryDirectory(prefix="kubetune-push-") as tmp, Progress(f"push {loc.safe}", enabled=progress) as bar:
        if tar:
            name = loc.basename if archive_kind(loc.basename) and loc.scheme != "oci" else f"{source.name}.tar.gz"
            source = pack_tar(source, Path(tmp) / name)
        if loc.scheme == "s3":
            _push_s3(source, loc, stats, bar, annotations)
        elif loc.scheme == "oci":
            extra["digest"] = _push_oci(source, loc, stats, bar, annotations)
        else:
            dest = loc.local_path
            if source.is_file() and not loc.path.endswith("/") and not dest.is_dir():
                dest.parent.mkdir(parents=True, exist_ok=True)
                copy_tree(source, dest.parent / ".kubetune-push", stats)
                (dest.parent / ".kubetune-push" / source.name).replace(dest)
                (dest.parent / ".kubetune-push").rmdir()
            else:
                copy_tree(source, dest, stats)
    stats.finish()
    log.info("pushed %s -> %s (%d bytes in %d files, %.1fs)", src, loc.safe, stats.bytes, stats.files, stats.seconds)
    return {**stats.summary(), **extra}


def _push_s3(source: Path, loc: Location, stats: TransferStats, bar: Progress, annotations: dict | None) -> None:
    from . import s3

    if source.is_file():
        key = loc.path + source.name if (not loc.path or loc.path.endswith("/")) else loc.path
        files = [(source, key)]
    else:
        prefix = loc.path.rstrip("/") + "/" if loc.path.strip("/") else ""
        files = [(p, prefix + rel) for p, rel in walk_files(source)]
        if not files:
            raise SourceError(f"{source}: the folder is empty; nothing to push")
    s3.upload_files(loc.host, files, loc, stats, bar, metadata=annotations)


def _push_oci(source: Path, loc: Location, stats: TransferStats, bar: Progress, annotations: dict | None) -> str:
    from . import oci

    if source.is_file():
        media = C.OCI_MEDIA_TAR_GZIP if archive_kind(source.name) == "tar" and source.name.endswith(("gz", "tgz")) else C.OCI_MEDIA_FILE
        files = [(source, source.name, media)]
    else:
        files = [(p, rel, C.OCI_MEDIA_FILE) for p, rel in walk_files(source)]
        if not files:
            raise SourceError(f"{source}: the folder is empty; nothing to push")
    notes = {C.OCI_ANNOTATION_CREATED: _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             **{str(k): str(v) for k, v in (annotations or {}).items()}}
    return oci.push_files(loc, files, stats, bar, annotations=notes)
