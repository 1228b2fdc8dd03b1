"""``s3://BUCKET/PREFIX``: every object under ``PREFIX/`` or the one object ``PREFIX`` (AWS S3, MinIO, Ceph),
through boto3 (:mod:`kubetune.storage.s3`). Fetched through the cache, pushed to, and an ``output.uri``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import SourceError
from ...redact import redact_uri
from .._common import Progress, TransferStats, walk_files
from ..location import Location, archive_kind
from . import DOWNLOAD, PUSH, SYNC, OutputTarget, Remote, Scheme, register

__all__ = ["S3Scheme"]


class S3Scheme(Scheme):
    """S3 buckets; the endpoint and credentials come from the environment (boto3's chain), never the URI."""

    names = ("s3",)
    remote = True
    env_credentials = ("bucket", "S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role); "
                       "see docs/storage.md")
    operations = frozenset({DOWNLOAD, PUSH, SYNC})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``s3://BUCKET[/PREFIX]``: the bucket is the host, the key prefix the path."""
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise SourceError(f"{redact_uri(uri)}: no bucket in the URI", hint="write s3://BUCKET/PREFIX")
        return Location(uri=uri, scheme=scheme, host=bucket, path=key)

    def probe(self, loc: Location) -> Remote:
        """The listing (every key, size and ETag: its digest is the fingerprint)."""
        from .. import s3

        return s3.probe(loc)

    def download(self, loc: Location, remote: Any, into: Path, stats: TransferStats, progress: Progress,
                 sha256: str | None) -> Path:
        """The listed objects, in parallel, verified against the listing's sizes and ETags."""
        from .. import s3

        return s3.download(remote, loc, into, stats, progress)

    def names_single_archive(self, loc: Location, remote: Any) -> bool:
        """One object whose key ends like an archive."""
        return remote.single and archive_kind(remote.objects[0].rel) is not None

    def push(self, source: Path, loc: Location, stats: TransferStats, progress: Progress, annotations: dict | None) -> dict:
        """A folder's files under ``PREFIX/``; a file to the key ``PREFIX`` (``PREFIX/NAME`` when it ends with '/')."""
        from .. import s3

        if source.is_file():
            key = loc.path + source.name if (not loc.path or loc.path.endswith("/")) else loc.path
            files = [(source, key)]
        else:
            prefix = loc.path.rstrip("/") + "/" if loc.path.strip("/") else ""
            files = [(p, prefix + rel) for p, rel in walk_files(source)]
            if not files:
                raise SourceError(f"{source}: the folder is empty; nothing to push")
        s3.upload_files(loc.host, files, loc, stats, progress, metadata=annotations)
        return {}

    def output_target(self, loc: Location) -> OutputTarget:
        """The run's layout under the prefix (see :mod:`kubetune.storage.sync`)."""
        from ..sync_targets import PrefixTarget, S3Store

        return PrefixTarget(loc, S3Store(loc))


register(S3Scheme())
