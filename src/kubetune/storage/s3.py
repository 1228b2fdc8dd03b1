"""s3:// sources and destinations (AWS S3, MinIO, Ceph, moto): boto3 with concurrent multipart transfers.

The endpoint comes from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (path-style addressing then,
as MinIO wants); credentials and region from boto3's usual chain, never from a spec. Every request is
retried by botocore's "standard" mode (5xx, throttling, resets; exponential backoff with jitter).
Uploads go through s3transfer (many files and the parts of large files in parallel), on the AWS CRT client
when ``awscrt`` is installed (``KUBETUNE_S3_TRANSFER_CLIENT`` chooses); downloads through
:mod:`.s3_download` (files and byte ranges in parallel, verified against the listed size and ETag as they
arrive, written to a temporary name and renamed). Files already present with the same size and time are
skipped, so a rerun resumes.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .. import constants as C
from ..errors import SourceError
from ._common import Progress, TransferStats, concurrency, log, part_path, safe_relpath
from .s3_client import client, crt_transfer_manager, endpoint_url, transfer_client
from .s3_download import download_objects
from .uri import Location, scrub

__all__ = ["S3Object", "Listing", "probe", "download", "upload_files", "list_objects", "delete_prefix", "client"]

_reachable: set[str] = set()
_MiB = 1024 * 1024


@dataclass(frozen=True)
class S3Object:
    """One object of a listing: key, path relative to the prefix, size and ETag."""
    key: str
    rel: str  # path relative to the fetched prefix (the file name for a single object)
    size: int
    etag: str
    mtime: float


@dataclass
class Listing:
    """The objects a URI names, and whether it named one object (single) or a prefix."""

    bucket: str
    prefix: str
    objects: list[S3Object]
    single: bool

    @property
    def fingerprint(self) -> str:
        """A digest of every key, size and ETag: the cache's version key."""
        h = hashlib.sha256()
        for o in sorted(self.objects, key=lambda o: o.rel):
            h.update(f"{o.rel}\0{o.size}\0{o.etag}\n".encode())
        return "s3:" + h.hexdigest()

    @property
    def size(self) -> int:
        """Total bytes of the listing."""
        return sum(o.size for o in self.objects)


def _check_endpoint(loc: Location) -> None:
    """Fail fast, with what to set, when a custom endpoint refuses connections (botocore would retry for a minute)."""
    endpoint = endpoint_url()
    if not endpoint or endpoint in _reachable:
        return
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    last: Exception | None = None
    for delay in (0.0, 0.3, 1.0):
        time.sleep(delay)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=5).close()
            _reachable.add(endpoint)
            return
        except OSError as e:
            last = e
    raise SourceError(
        f"{loc.safe}: cannot reach the S3 endpoint {endpoint} ({last})",
        hint=f"set {C.ENV_AWS_ENDPOINT_URL} to your S3 server (e.g. http://minio.NAMESPACE.svc:9000), or unset it for AWS",
    )


# --- errors ----------------------------------------------------------------------------------
def credentials_hint() -> str:
    """Where boto3 looked for credentials and which source it used (never the values)."""
    looked = (
        "AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), AWS_PROFILE in ~/.aws/credentials "
        "and ~/.aws/config, web identity (AWS_WEB_IDENTITY_TOKEN_FILE), container and instance roles"
    )
    try:
        import boto3

        creds = boto3.session.Session().get_credentials()
        found = f"credentials in use came from '{creds.method}'" if creds else "no credentials were found"
    except Exception:  # a broken profile file: the error itself says more
        found = "the credentials configuration could not be read"
    return f"{found}; boto3 looks at {looked}"


def map_error(e: Exception, loc: Location, action: str = "read") -> SourceError:
    """A boto3/botocore exception as a SourceError that names the URI, the cause and what to set."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError as BotoConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    where = endpoint_url() or "AWS S3"
    if isinstance(e, SourceError):
        return e
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return SourceError(f"{loc.safe}: no usable AWS credentials to {action} it", hint=credentials_hint())
    if isinstance(e, BotoConnectionError):
        return SourceError(
            f"{loc.safe}: cannot reach the S3 endpoint {where} ({type(e).__name__})",
            hint=f"set {C.ENV_AWS_ENDPOINT_URL} to your S3 server (MinIO: http://HOST:9000), check the network",
        )
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return SourceError(
                f"{loc.safe}: bucket '{loc.host}' does not exist at {where}",
                hint=f"create it, fix the bucket name, or set {C.ENV_AWS_ENDPOINT_URL} to the server that has it",
            )
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return SourceError(f"{loc.safe}: no such object or prefix at {where}", hint="check the key; list it with `aws s3 ls`")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                    "AllAccessDisabled", "403", "Forbidden") or status == 403:
            return SourceError(f"{loc.safe}: access denied to {action} it at {where} ({code})", hint=credentials_hint())
        if code in ("PreconditionFailed", "412"):
            return SourceError(f"{loc.safe}: an object changed while it was downloaded", hint="run the command again")
        return SourceError(f"{loc.safe}: S3 error {code or status} at {where}: {scrub(err.get('Message', ''))}")
    if type(e).__name__ == "AwsCrtError":  # the CRT client's own failures (socket, DNS, TLS); S3's answers are ClientErrors
        name = str(getattr(e, "name", "") or e)
        if any(w in name for w in ("SOCKET", "DNS", "CONNECT", "TLS", "HOST")):
            return SourceError(f"{loc.safe}: cannot reach the S3 endpoint {where} ({name})",
                               hint=f"set {C.ENV_AWS_ENDPOINT_URL} to your S3 server (MinIO: http://HOST:9000), check the network")
        return SourceError(f"{loc.safe}: the AWS CRT client failed to {action} it at {where}: {scrub(name)}",
                           hint=f"set {C.ENV_S3_TRANSFER_CLIENT}=classic to use boto3's own transfer instead")
    return SourceError(f"{loc.safe}: {type(e).__name__}: {scrub(e)}")


# --- listing ---------------------------------------------------------------------------------
def list_objects(bucket: str, prefix: str) -> list[tuple[str, int, str, float]]:
    """(key, size, etag, mtime) of every object under ``prefix`` (directory markers skipped)."""
    out = []
    for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            if o["Key"].endswith("/") and o["Size"] == 0:
                continue
            out.append((o["Key"], int(o["Size"]), o.get("ETag", "").strip('"'), o["LastModified"].timestamp()))
    return out


def probe(loc: Location) -> Listing:
    """List what ``loc`` names: all objects under ``prefix/``, else the one object ``prefix``."""
    _check_endpoint(loc)
    from botocore.exceptions import ClientError

    key = loc.path
    try:
        dir_prefix = key if (not key or key.endswith("/")) else key + "/"
        found = list_objects(loc.host, dir_prefix)
        if found:
            objects = []
            for k, size, etag, mtime in found:
                try:
                    rel = safe_relpath(k[len(dir_prefix):])
                except ValueError:
                    raise SourceError(f"{loc.safe}: refusing object key '{k}': it would leave the destination folder") from None
                objects.append(S3Object(k, rel, size, etag, mtime))
            return Listing(loc.host, dir_prefix, objects, single=False)
        if not key or key.endswith("/"):
            raise SourceError(f"{loc.safe}: no objects under this prefix at {endpoint_url() or 'AWS S3'}", hint="check the prefix; upload with `kubetune push DIR URI`")
        try:
            head = client().head_object(Bucket=loc.host, Key=key)
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                _require_bucket(loc)
                raise SourceError(f"{loc.safe}: no such object or prefix at {endpoint_url() or 'AWS S3'}", hint="check the key; list it with `aws s3 ls`") from None
            raise
        obj = S3Object(key, loc.basename, int(head["ContentLength"]), head.get("ETag", "").strip('"'), head["LastModified"].timestamp())
        return Listing(loc.host, key, [obj], single=True)
    except SourceError:
        raise
    except Exception as e:
        raise map_error(e, loc) from None


def _require_bucket(loc: Location) -> None:
    """Raise NoSuchBucket's SourceError when the bucket is missing (HEAD answers a bare 404)."""
    from botocore.exceptions import ClientError

    try:
        client().head_bucket(Bucket=loc.host)
    except ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            e.response.setdefault("Error", {})["Code"] = "NoSuchBucket"
        raise


# --- transfers -------------------------------------------------------------------------------
def _transfer_manager():
    """The uploader: the CRT client's manager when :func:`.s3_client.transfer_client` says so, else s3transfer's."""
    if transfer_client() == "crt":
        return crt_transfer_manager(C.STORAGE_MULTIPART_CHUNKSIZE)
    from s3transfer.manager import TransferConfig, TransferManager

    config = TransferConfig(
        multipart_threshold=C.STORAGE_MULTIPART_THRESHOLD,
        multipart_chunksize=C.STORAGE_MULTIPART_CHUNKSIZE,
        max_request_concurrency=concurrency(),
        num_download_attempts=C.STORAGE_RETRY_ATTEMPTS,
        io_chunksize=1 * _MiB,
    )
    return TransferManager(client(), config)


def _subscriber(progress: Progress, stats: TransferStats, size: int | None = None, on_done=None):
    from s3transfer.subscribers import BaseSubscriber

    class _Sub(BaseSubscriber):
        def on_queued(self, future, **kwargs):
            if size is not None and hasattr(future.meta, "provide_transfer_size"):  # the CRT's meta has no such setter
                future.meta.provide_transfer_size(size)

        def on_progress(self, future, bytes_transferred, **kwargs):
            stats.add(bytes_transferred)
            progress.advance(bytes_transferred)

        def on_done(self, future, **kwargs):
            if on_done is not None:
                on_done(future)

    return _Sub()


def download(listing: Listing, loc: Location, target_dir: Path, stats: TransferStats, progress: Progress) -> Path:
    """Download the listed objects into ``target_dir`` (a single object as ``target_dir/<name>``)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    for o in listing.objects:
        local = target_dir / o.rel
        if local.is_file() and local.stat().st_size == o.size and abs(local.stat().st_mtime - o.mtime) < 1:
            stats.skip(o.size)  # a verified copy from an earlier, interrupted run
            continue
        todo.append(o)
    progress.expect(sum(o.size for o in todo))
    for attempt in range(2):
        try:
            bad = download_objects(listing.bucket, todo, target_dir, stats, progress)
        except Exception as e:
            raise map_error(e, loc) from None
        if not bad:
            break
        if attempt == 1:
            o = bad[0]
            raise SourceError(
                f"{loc.safe}: integrity check failed for '{o.key}' twice (size or ETag differ from the listing)",
                hint="the object may be changing while it is read; run the command again",
            )
        log.warning("%s: %d file(s) failed the integrity check; downloading them again", loc.safe, len(bad))
        todo = bad
    for o in listing.objects:  # leftovers of a killed run next to files that are complete now
        part_path(target_dir / o.rel).unlink(missing_ok=True)
    return target_dir / listing.objects[0].rel if listing.single else target_dir


def upload_files(bucket: str, files: list[tuple[Path, str]], loc: Location, stats: TransferStats,
                 progress: Progress, *, last: list[tuple[Path, str]] | None = None, metadata: dict | None = None) -> None:
    """Upload (local path, key) pairs concurrently; ``last`` ones only after all others succeeded.

    ``metadata`` becomes user metadata (x-amz-meta-*) on every object.
    """
    _check_endpoint(loc)
    try:
        for batch in (files, last or []):
            if not batch:
                continue
            progress.expect(sum(p.stat().st_size for p, _ in batch))
            with _transfer_manager() as tm:
                futures = []
                for path, key in batch:
                    size = path.stat().st_size
                    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
                    if size >= C.STORAGE_MULTIPART_THRESHOLD:
                        meta[C.S3_META_PART_SIZE] = str(C.STORAGE_MULTIPART_CHUNKSIZE)
                    extra = {"Metadata": meta} if meta else None
                    futures.append(tm.upload(str(path), bucket, key, extra_args=extra, subscribers=[_subscriber(progress, stats, size)]))
                for f in futures:
                    f.result()
            stats.add(0, len(batch))
    except Exception as e:
        raise map_error(e, loc, "write") from None


def delete_prefix(bucket: str, prefix: str, loc: Location, *, first: list[str] | None = None) -> None:
    """Delete every object under ``prefix``; keys in ``first`` go before the rest (completion markers)."""
    try:
        keys = [k for k, *_ in list_objects(bucket, prefix)]
        ordered = [k for k in (first or []) if k in keys]
        rest = [k for k in keys if k not in ordered]
        for batch_keys in ([ordered] if ordered else []) + [rest[i:i + 1000] for i in range(0, len(rest), 1000)]:
            if batch_keys:
                client().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch_keys], "Quiet": True})
    except Exception as e:
        raise map_error(e, loc, "delete") from None
