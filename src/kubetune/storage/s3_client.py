"""The boto3 S3 client kubetune uses, one per endpoint, region and credentials (shared by listing,
downloads and integrity checks; boto3 loads only when a client is first asked for)."""

from __future__ import annotations

import hashlib
import os
import threading

from .. import constants as C
from ._common import concurrency

__all__ = ["client", "endpoint_url", "presign_get"]

_clients: dict = {}
_clients_lock = threading.Lock()


def endpoint_url() -> str | None:
    """The S3-protocol endpoint from the environment (MinIO, moto, Ceph), or None for AWS."""
    return os.environ.get(C.ENV_AWS_ENDPOINT_URL_S3) or os.environ.get(C.ENV_AWS_ENDPOINT_URL) or None


def client():
    """A boto3 S3 client for the current environment (cached per endpoint, region and credentials source)."""
    import boto3
    from botocore.config import Config

    endpoint = endpoint_url()
    key = (endpoint, os.getpid(), os.environ.get("AWS_PROFILE"), os.environ.get("AWS_ACCESS_KEY_ID"),
           hashlib.sha256(os.environ.get("AWS_SECRET_ACCESS_KEY", "").encode()).hexdigest(),
           os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"), concurrency())
    with _clients_lock:
        if key not in _clients:
            session = boto3.session.Session()
            config = Config(
                retries={"max_attempts": C.STORAGE_RETRY_ATTEMPTS, "mode": "standard"},
                max_pool_connections=concurrency() + 4,
                connect_timeout=10,
                read_timeout=120,
                s3={"addressing_style": "path"} if endpoint else None,
                user_agent_extra="kubetune",
            )
            _clients[key] = session.client(
                "s3", endpoint_url=endpoint, region_name=session.region_name or "us-east-1", config=config
            )
        return _clients[key]


def presign_get(uri: str, expires_seconds: int) -> str:
    """A presigned https GET URL of the object ``s3://bucket/key`` (anyone holding it may read that one object
    until it expires).

    Raises:
        SourceError: not an s3:// URI of one object.
    """
    from ..errors import SourceError
    from .uri import parse_uri

    loc = parse_uri(uri)
    if loc.scheme != "s3" or not loc.host or not loc.path or loc.path.endswith("/"):
        raise SourceError(f"{uri}: a presigned URL names one S3 object (s3://bucket/key)")
    import boto3
    from botocore.config import Config

    # SigV4 explicitly: botocore may presign with the deprecated SigV2 for a custom endpoint, which AWS regions
    # opened since 2014 and newer MinIO refuse.
    endpoint = endpoint_url()
    session = boto3.session.Session()
    signer = session.client("s3", endpoint_url=endpoint, region_name=session.region_name or "us-east-1",
                            config=Config(signature_version="s3v4", s3={"addressing_style": "path"} if endpoint else None))
    return signer.generate_presigned_url("get_object", Params={"Bucket": loc.host, "Key": loc.path.lstrip("/")}, ExpiresIn=int(expires_seconds))
