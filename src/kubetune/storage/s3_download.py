"""Parallel, verifying S3 downloads: many files and byte ranges of large ones at once.

Each task GETs one object or one range of it and writes the bytes at their offset of the temporary file
(``os.pwrite``) in the same thread, hashing them as they pass: no second read for verification, and no
hand-off between threads per chunk (which is what makes s3transfer's downloads slow on a busy machine).
Ranges of a multipart object follow its upload parts, so the part MD5s give its ETag directly. Every GET
carries ``If-Match`` with the listed ETag, so all ranges come from one version. A read that breaks off
is resumed from the last byte received, with backoff; a body that fails botocore's checksum (when the server
sent one) is fetched again from its start; request-level failures are retried by botocore.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import http.client
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .. import constants as C
from ._common import Progress, Transient, TransferStats, concurrency, part_path, with_retries
from .s3_client import client
from .s3_integrity import etag_not_md5, intact, part_size_candidates

__all__ = ["download_objects"]

_READ = 1 << 20


@dataclass
class _Plan:
    """One object to download: its ranges, and the MD5 of each as the ranges complete."""

    obj: object  # s3.S3Object
    local: Path
    part: Path
    ranges: list[tuple[int, int]]
    aligned: bool  # ranges are the object's upload parts: their MD5s make the ETag
    digests: list[bytes | None] = field(default_factory=list)
    left: int = 0


def download_objects(bucket: str, objects: list, target_dir: Path, stats: TransferStats, progress: Progress) -> list:
    """Download ``objects`` (s3.S3Object) under ``target_dir``; returns those that failed verification.

    Raises:
        botocore errors for requests that failed after botocore's retries (the caller maps them).
    """
    plans = [_plan(bucket, o, target_dir) for o in objects]
    bad: list = []
    lock = threading.Lock()
    for p in plans:
        p.local.parent.mkdir(parents=True, exist_ok=True)
        with open(p.part, "wb") as f:
            f.truncate(p.obj.size)
    tasks = [(p, i) for p in plans for i in range(len(p.ranges))]

    def run(p: _Plan, i: int) -> None:
        p.digests[i] = _fetch_range(client(), bucket, p, i, stats, progress)
        with lock:
            p.left -= 1
            last = p.left == 0
        if last:
            if _verified(bucket, p):
                os.utime(p.part, (p.obj.mtime, p.obj.mtime))
                os.replace(p.part, p.local)
                stats.add(0, 1)
            else:
                p.part.unlink(missing_ok=True)
                with lock:
                    bad.append(p.obj)

    with cf.ThreadPoolExecutor(max_workers=concurrency(), thread_name_prefix="kubetune-s3") as pool:
        futures = [pool.submit(run, p, i) for p, i in tasks]
        try:
            for f in cf.as_completed(futures):
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return bad


def _plan(bucket: str, o, target_dir: Path) -> _Plan:
    local = target_dir / o.rel
    size, etag = o.size, o.etag
    part_size, aligned = C.STORAGE_MULTIPART_CHUNKSIZE, False
    if "-" in etag:
        n = int(etag.rsplit("-", 1)[1])
        fits = part_size_candidates(size, n, bucket, o.key)
        if fits:
            part_size, aligned = fits[0], True
    if size < C.STORAGE_MULTIPART_THRESHOLD and not aligned:
        ranges = [(0, size - 1)]
    else:
        ranges = [(start, min(start + part_size, size) - 1) for start in range(0, max(size, 1), part_size)]
    return _Plan(o, local, part_path(local), ranges, aligned, [None] * len(ranges), len(ranges))


def _fetch_range(client, bucket: str, p: _Plan, i: int, stats: TransferStats, progress: Progress) -> bytes:
    from botocore.exceptions import (
        ConnectionClosedError,
        FlexibleChecksumError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )
    from urllib3.exceptions import ProtocolError

    broken = (ResponseStreamingError, ReadTimeoutError, IncompleteReadError, ConnectionClosedError, ProtocolError,
              http.client.IncompleteRead, ConnectionError)
    start, end = p.ranges[i]
    want = end - start + 1
    h = hashlib.md5(usedforsecurity=False)
    got = 0

    def attempt(_: int) -> None:
        nonlocal got, h
        args = {"Bucket": bucket, "Key": p.obj.key}
        if p.obj.etag:
            args["IfMatch"] = f'"{p.obj.etag}"'
        if len(p.ranges) > 1 or got:
            args["Range"] = f"bytes={start + got}-{end}"
        body = client.get_object(**args)["Body"]
        fd = os.open(p.part, os.O_WRONLY)
        try:
            for chunk in body.iter_chunks(_READ):
                os.pwrite(fd, chunk, start + got)
                got += len(chunk)
                h.update(chunk)
                stats.add(len(chunk))
                progress.advance(len(chunk))
        except FlexibleChecksumError:
            # botocore checked the server's CRC/SHA checksum at the end of the body: the bytes of this
            # request were corrupted in transit, so the range starts over (not resumed).
            got, h = 0, hashlib.md5(usedforsecurity=False)
            raise Transient(f"s3://{bucket}/{p.obj.key}: checksum mismatch, bytes corrupted in transit") from None
        except broken as e:
            raise Transient(f"read of s3://{bucket}/{p.obj.key} broke off after {got} of {want} bytes ({type(e).__name__})") from None
        finally:
            os.close(fd)
            body.close()
        if got != want:
            raise Transient(f"s3://{bucket}/{p.obj.key}: got {got} of {want} bytes")

    if want > 0:
        with_retries(attempt, what=f"GET s3://{bucket}/{p.obj.key}")
    else:
        attempt(0)
    return h.digest()


def _verified(bucket: str, p: _Plan) -> bool:
    """Size and ETag from the MD5s taken in flight; anything they cannot settle is read again."""
    o = p.obj
    if p.part.stat().st_size != o.size:
        return False
    if not o.etag:
        return True
    if "-" in o.etag and p.aligned:
        combined = hashlib.md5(b"".join(p.digests), usedforsecurity=False).hexdigest() + f"-{len(p.digests)}"  # type: ignore[arg-type]
        if combined == o.etag:
            return True
    elif "-" not in o.etag and len(p.ranges) == 1:
        if p.digests[0].hex() == o.etag:  # type: ignore[union-attr]
            return True
        return etag_not_md5(bucket, o.key)
    return intact(p.part, o, bucket)  # large single-part objects, or part sizes we guessed wrong
