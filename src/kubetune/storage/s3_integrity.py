"""Integrity of S3 downloads: the size and the ETag (an MD5, or a multipart upload's MD5 of part MD5s).

A multipart ETag only says how many parts there were, not their size: the part sizes that fit are tried
(ours, the common client defaults, the one kubetune records in object metadata at upload).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Iterable

from .. import constants as C
from ._common import log
from .s3_client import client

__all__ = ["intact", "etag_not_md5", "part_size_candidates"]

_MiB = 1024 * 1024


def _head(Bucket: str, Key: str) -> dict:
    return client().head_object(Bucket=Bucket, Key=Key)


def intact(path: Path, o, bucket: str) -> bool:
    """Size and ETag of a downloaded object match the listing (unverifiable ETags pass on size alone)."""
    size = path.stat().st_size
    if size != o.size:
        log.warning("s3://%s/%s: got %d bytes, the listing says %d", bucket, o.key, size, o.size)
        return False
    etag = o.etag
    if not etag:
        return True
    if "-" not in etag:
        if _md5_parts(path, [size])[0] == etag:
            return True
        return etag_not_md5(bucket, o.key)
    n = int(etag.rsplit("-", 1)[1])
    for part_size in part_size_candidates(size, n, bucket, o.key):
        if _multipart_etag(path, part_size) == etag:
            return True
    log.warning("s3://%s/%s: ETag %s does not match the downloaded bytes", bucket, o.key, etag)
    return False


def etag_not_md5(bucket: str, key: str) -> bool:
    """KMS- and customer-key-encrypted objects have ETags that are not MD5s: then size is all we can check."""
    try:
        head = _head(Bucket=bucket, Key=key)
    except Exception:
        return False
    encrypted = head.get("ServerSideEncryption") == "aws:kms" or "SSECustomerAlgorithm" in head
    if not encrypted:
        log.warning("s3://%s/%s: MD5 of the downloaded bytes does not match the ETag", bucket, key)
    return encrypted


def _md5_parts(path: Path, sizes: Iterable[int]) -> list[str]:
    out = []
    with open(path, "rb") as f:
        for s in sizes:
            h = hashlib.md5(usedforsecurity=False)
            left = s
            while left > 0:
                block = f.read(min(left, 4 * _MiB))
                if not block:
                    break
                h.update(block)
                left -= len(block)
            out.append(h.hexdigest())
    return out


def _multipart_etag(path: Path, part_size: int) -> str:
    size = path.stat().st_size
    n = max(1, math.ceil(size / part_size))
    digests = _md5_parts(path, [part_size] * n)
    return hashlib.md5(b"".join(bytes.fromhex(d) for d in digests), usedforsecurity=False).hexdigest() + f"-{n}"


def part_size_candidates(size: int, n: int, bucket: str, key: str) -> list[int]:
    """Part sizes that give ``n`` parts: ours, common client defaults, then the one recorded at upload."""
    common = [C.STORAGE_MULTIPART_CHUNKSIZE, 8 * _MiB, 16 * _MiB, 5 * _MiB, 64 * _MiB, 100 * _MiB,
              math.ceil(size / n / _MiB) * _MiB]
    fits = [p for p in dict.fromkeys(common) if p > 0 and math.ceil(size / p) == n]
    if fits:
        return fits
    try:
        meta = _head(Bucket=bucket, Key=key).get("Metadata", {})
        return [int(meta[C.S3_META_PART_SIZE])] if C.S3_META_PART_SIZE in meta else []
    except Exception:
        return []
