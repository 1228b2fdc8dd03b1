"""The boto3 S3 client kubetune uses, one per endpoint, region and credentials (shared by listing,
downloads and integrity checks; boto3 loads only when a client is first asked for)."""

from __future__ import annotations

import hashlib
import os
import threading

from .. import constants as C
from ._common import concurrency

__all__ = ["client", "endpoint_url", "presign_get", "transfer_client", "crt_transfer_manager"]

_clients: dict = {}
_clients_lock = threading.Lock()


def endpoint_url() -> str | None:
    """The S3-protocol endpoint from the environment (MinIO, moto, Ceph), or None for AWS."""
    return os.environ.get(C.ENV_AWS_ENDPOINT_URL_S3) or os.environ.get(C.ENV_AWS_ENDPOINT_URL) or None


def _environment() -> tuple:
    """What a cached client depends on: endpoint, process, profile, key id, a digest of the secret, region."""
    return (endpoint_url(), os.getpid(), os.environ.get("AWS_PROFILE"), os.environ.get("AWS_ACCESS_KEY_ID"),
            hashlib.sha256(os.environ.get("AWS_SECRET_ACCESS_KEY", "").encode()).hexdigest(),
            os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))


def client():
    """A boto3 S3 client for the current environment (cached per endpoint, region and credentials source)."""
    import boto3
    from botocore.config import Config

    endpoint = endpoint_url()
    key = (*_environment(), concurrency())
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


# --- the AWS Common Runtime (CRT) client, for uploads --------------------------------------------
_crt: dict = {}


def transfer_client() -> str:
    """Which engine uploads to S3: ``crt`` (the AWS Common Runtime's S3 client, native code that splits and
    sends parts itself) or ``classic`` (s3transfer's thread pool on the boto3 client).

    ``KUBETUNE_S3_TRANSFER_CLIENT``: ``auto`` (the default) is ``crt`` when the ``awscrt`` package is installed
    (``pip install 'kubetune[crt]'``) and no ``HTTP(S)_PROXY`` applies to the endpoint (the CRT client would not
    use it), else ``classic``; ``crt`` requires ``awscrt``; ``classic`` never uses it.

    Raises:
        SourceError: an unknown value, or ``crt`` without ``awscrt``.
    """
    from ..errors import SourceError

    choice = (os.environ.get(C.ENV_S3_TRANSFER_CLIENT) or "auto").strip().lower()
    if choice not in C.S3_TRANSFER_CLIENTS:
        raise SourceError(f"{C.ENV_S3_TRANSFER_CLIENT}={choice!r} is not one of {', '.join(C.S3_TRANSFER_CLIENTS)}",
                          hint=f"unset it (auto) or set it to {' or '.join(C.S3_TRANSFER_CLIENTS[1:])}")
    if choice == "classic":
        return "classic"
    if choice == "auto" and _behind_proxy():
        return "classic"  # the CRT client does not read HTTP(S)_PROXY; botocore does
    try:
        import awscrt.s3  # noqa: F401
        import s3transfer.crt  # noqa: F401
    except ImportError:
        if choice == "crt":
            raise SourceError(f"{C.ENV_S3_TRANSFER_CLIENT}=crt, but the awscrt package is not installed",
                              hint="pip install 'kubetune[crt]', or unset the variable to use the classic client") from None
        return "classic"
    return "crt"


def _behind_proxy() -> bool:
    """HTTP(S)_PROXY applies to the S3 endpoint (and NO_PROXY does not exempt it)."""
    import urllib.request
    from urllib.parse import urlsplit

    endpoint = urlsplit(endpoint_url() or "https://s3.amazonaws.com")
    proxies = urllib.request.getproxies()
    return bool(proxies.get(endpoint.scheme or "https")) and not urllib.request.proxy_bypass(endpoint.hostname or "")


def crt_transfer_manager(part_size: int):
    """An s3transfer ``CRTTransferManager`` on a CRT S3 client for the current environment: the same endpoint
    (TLS or plain http, ``AWS_CA_BUNDLE``), region, credentials chain and path-style addressing as
    :func:`client`. The CRT client is cached like the boto3 one; each call returns a new manager over it.

    Raises:
        NoCredentialsError: boto3's chain found no credentials (unsigned requests would only be refused).
    """
    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import NoCredentialsError
    from s3transfer.crt import BotocoreCRTCredentialsWrapper, BotocoreCRTRequestSerializer, CRTTransferManager, create_s3_crt_client

    endpoint = endpoint_url()
    key = (*_environment(), os.environ.get("AWS_CA_BUNDLE"), part_size)
    with _clients_lock:
        if key not in _crt:
            session = botocore.session.Session()
            credentials = session.get_credentials()
            if credentials is None:
                raise NoCredentialsError()
            region = session.get_config_variable("region") or "us-east-1"
            crt_client = create_s3_crt_client(
                region,
                crt_credentials_provider=BotocoreCRTCredentialsWrapper(credentials).to_crt_credentials_provider(),
                part_size=part_size,
                use_ssl=not (endpoint or "").lower().startswith("http://"),
                verify=os.environ.get("AWS_CA_BUNDLE") or None,
            )
            serializer = BotocoreCRTRequestSerializer(session, {
                "region_name": region, "endpoint_url": endpoint,
                "config": Config(s3={"addressing_style": "path"} if endpoint else None, user_agent_extra="kubetune"),
            })
            _crt[key] = (crt_client, serializer)
        crt_client, serializer = _crt[key]
    return CRTTransferManager(crt_client, serializer)
