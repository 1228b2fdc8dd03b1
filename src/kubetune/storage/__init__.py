"""Storage: model/dataset URIs to local files and results back (local, builtin, hf, s3, http(s), oci).

Importing this package is cheap: boto3, huggingface_hub, oras and httpx load inside the functions
that use them. See docs/storage.md for the URI forms, credentials, the cache and the CLI, and
docs/architecture.md for the scheme registry (:mod:`.schemes`: one module per scheme).
"""

from __future__ import annotations

from pathlib import Path

# Importing a scheme module registers it; this order (not alphabetical) is the order messages list them in.
# Aliased: this package's own s3, hf and oci are the transports (kubetune.storage.s3), not these adapters.
from .schemes import local as _local, builtin as _builtin, hf as _hf, s3 as _s3, http as _http, oci as _oci, pvc as _pvc  # noqa: F401, I001
from .sync import OutputSync
from .uri import is_remote, parse_uri, redact

__all__ = ["fetch", "push", "is_remote", "OutputSync", "parse_uri", "redact"]


def fetch(
    uri: str | Path,
    dest: str | Path | None = None,
    *,
    revision: str | None = None,
    use_cache: bool = True,
    progress: bool = False,
    sha256: str | None = None,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
) -> Path:
    """Materialise a model or dataset URI locally and return the local path (a file or a directory).

    Args:
        uri: a plain path or ``file://``, ``builtin://NAME``, ``hf://ORG/NAME[@REV]``, ``s3://BUCKET/PREFIX``,
            ``http(s)://...`` or ``oci://REGISTRY/REPO:TAG``. A single ``.tar``/``.tar.gz``/``.tgz``/``.zip``
            is unpacked safely (and when it holds one folder, that folder is returned).
        dest: a directory to put the files in. None: local paths are returned as they are, remote URIs go
            to the cache under ``$KUBETUNE_HOME/cache`` (hf:// to the Hugging Face cache).
        revision: hf revision (wins over ``@REV`` in the URI).
        use_cache: False downloads again even when the cache holds the same version.
        progress: show a progress bar on stderr.
        sha256: expected digest of a single-file source (http(s) uses it as the cache key too).
        allow_patterns, ignore_patterns: hf:// file filters (glob patterns).

    Returns:
        The local file or directory.

    Raises:
        SourceError: the URI cannot be fetched; the message names the URI and the cause and says what to set.
    """
    from .fetcher import fetch_with_stats

    return fetch_with_stats(
        uri, dest, revision=revision, use_cache=use_cache, progress=progress, sha256=sha256,
        allow_patterns=allow_patterns, ignore_patterns=ignore_patterns,
    )[0]


def push(src: str | Path, uri: str, *, tar: bool = False, annotations: dict | None = None, progress: bool = False) -> dict:
    """Upload a file or directory to ``s3://``, ``oci://`` or ``file://``.

    Args:
        src: the local file or directory.
        uri: where to: ``s3://BUCKET/PREFIX`` (a directory's files under PREFIX/; a file to the key PREFIX,
            or PREFIX/NAME when it ends with '/'), ``oci://REGISTRY/REPO:TAG`` (one artifact, one layer per
            file, titled with its relative path) or ``file:///PATH``.
        tar: pack the source into one ``NAME.tar.gz`` first (fetch unpacks it again).
        annotations: OCI manifest annotations, or S3 object metadata.
        progress: show a progress bar on stderr.

    Returns:
        A summary: ``uri`` (redacted), ``bytes``, ``files``, ``seconds``, ``bytes_per_second``,
        ``skipped_bytes`` (already there), and ``digest`` for OCI.

    Raises:
        SourceError: the source is missing, or the destination cannot be written (named, with what to set).
    """
    from .pusher import push_with_stats

    return push_with_stats(src, uri, tar=tar, annotations=annotations, progress=progress)
