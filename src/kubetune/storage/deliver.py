"""deliver: any source kubetune reads to any destination it writes, verified, complete only once verified.

The story of one delivery (``kubetune deliver SRC DEST``, here or inside a cluster Job):

1. fetch SRC with :func:`~.fetcher.fetch_with_stats` (hf://, s3://, http(s)://, oci://, builtin://, a local
   path): the scheme's own retries and checks apply (sizes and ETags, sha256 of content-addressed blobs),
   and an archive is unpacked safely. What arrives is recorded: every file's size and sha256;
2. mark DEST incomplete: an earlier delivery's marker (``.kubetune-delivered.json``) is removed first;
3. write: s3:// and oci:// through :func:`~.pusher.push_with_stats`; a local folder through a staging
   folder beside it whose files are moved into place only after they are verified;
4. verify what DEST holds against the record: sizes and checksums (sha256 locally, the ETag's MD5 on S3,
   the layer digests of the OCI manifest);
5. write the marker, last: a folder or prefix holding it is a complete, verified delivery (an OCI tag is
   complete by construction: it appears after its blobs).

DEST is always a folder (an S3 prefix, a local directory) or an OCI tag: a single-file source lands at
``DEST/NAME``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from .. import constants as C
from ..errors import SourceError
from . import schemes
from ._common import file_digest, human_bytes, walk_files
from .schemes import PUSH
from .uri import parse_uri

__all__ = ["deliver", "Manifest"]

Manifest = dict  # relative path -> {"size": int, "sha256": str}


def deliver(src: str, dest: str, *, progress: bool = False, report: Callable[[str], None] = lambda m: None) -> dict:
    """Copy ``src`` to ``dest`` and verify it.

    Args:
        src: any URI kubetune fetches (or a local path).
        dest: ``s3://BUCKET/PREFIX``, ``oci://REGISTRY/REPO:TAG``, or a local folder (path or ``file://``).
        progress: byte progress on stderr (a bar in a terminal, a line every few seconds otherwise).
        report: receives one line per step (``deliver: ...``): what a cluster Job's log shows.

    Returns:
        ``source``, ``dest`` (both redacted), ``files``, ``bytes``, ``seconds``, ``verified`` (True) and, for
        oci://, ``digest``.

    Raises:
        SourceError: SRC cannot be fetched, DEST cannot be written, or verification failed.
    """
    from .fetcher import fetch_with_stats

    started = time.time()
    dloc = parse_uri(dest)
    target = schemes.get(dloc.scheme, dloc.uri)
    if not target.supports(PUSH):
        raise SourceError(f"{dloc.safe}: deliver writes to {schemes.listing(schemes.supporting(PUSH))} destinations",
                          hint="deliver to s3://BUCKET/PREFIX, oci://REGISTRY/REPO:TAG, hf://ORG/NAME or a local folder")
    sloc = parse_uri(src)
    report(f"deliver: fetching {sloc.safe}")
    path, fstats = fetch_with_stats(src, progress=progress)
    manifest = _manifest(path)
    total = sum(f["size"] for f in manifest.values())
    report(f"deliver: fetched {len(manifest)} file(s), {human_bytes(total)} in {fstats.seconds:.1f}s" + (" (cache hit)" if fstats.cached else ""))
    if not manifest:
        raise SourceError(f"{sloc.safe}: nothing to deliver (no files)")
    report(f"deliver: writing {dloc.safe}")
    extra: dict = {}
    if dloc.scheme == "file":
        _write_local(path, dloc.local_path, manifest, report)
    else:
        _unmark(dloc)
        from .pusher import push_with_stats

        pushed = push_with_stats(path, _folder_uri(dloc.uri, path), progress=progress)
        extra = {k: v for k, v in pushed.items() if k == "digest"}
        if dloc.scheme == "s3":
            _verify_s3(dloc, path, manifest)
        elif dloc.scheme == "oci":
            _verify_oci(dloc, path, manifest)
        elif dloc.scheme == "hf":  # one commit (atomic); then each file's size and LFS sha256 or git blob id
            from .hf_push import verify

            verify(parse_uri(_folder_uri(dloc.uri, path)), _files(path))
        else:  # pragma: no cover - a scheme registered later: at least it was written without an error
            report(f"deliver: {dloc.scheme}:// destinations are not verified")
    report(f"deliver: verified {len(manifest)} file(s), {human_bytes(total)} (sizes and checksums)")
    if dloc.scheme in ("file", "s3"):
        _mark(dloc, sloc.safe, manifest)
    seconds = round(time.time() - started, 2)
    report(f"deliver: complete: {sloc.safe} -> {dloc.safe} in {seconds:.1f}s")
    return {"source": sloc.safe, "dest": dloc.safe, "files": len(manifest), "bytes": total, "seconds": seconds, "verified": True, **extra}


# --- the record --------------------------------------------------------------------------------
def _manifest(path: Path) -> Manifest:
    return {rel: {"size": p.stat().st_size, "sha256": file_digest(p)} for rel, p in _files(path).items()}


def _files(path: Path) -> dict[str, Path]:
    """The source's files by relative path; the marker of an earlier delivery is not content (a new one is written)."""
    if path.is_file():
        return {path.name: path}
    return {rel: p for p, rel in walk_files(path) if rel != C.DELIVER_MARKER}


def _folder_uri(uri: str, path: Path) -> str:
    """DEST as a folder: a file source goes to ``DEST/NAME`` (push writes a file to the key itself otherwise)."""
    return uri if path.is_dir() or uri.endswith("/") or uri.startswith("oci://") else uri + "/"


def _mismatch(dest: str, rel: str, what: str) -> SourceError:
    return SourceError(f"{dest}: verification failed: {rel}: {what}",
                       hint="deliver again (the destination is not marked complete); if it repeats, check the storage")


# --- local folders ---------------------------------------------------------------------------------
def _write_local(path: Path, dest: Path, manifest: Manifest, report: Callable[[str], None]) -> None:
    """Copy into a staging folder beside ``dest``, verify every file there, then move them into place."""
    dest = dest.expanduser().absolute()
    if dest.exists() and not dest.is_dir():
        raise SourceError(f"{dest}: exists and is not a folder", hint="deliver into a folder (a single file lands at DEST/NAME)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():  # an earlier delivery's marker goes first: the folder is incomplete from here on
        (dest / C.DELIVER_MARKER).unlink(missing_ok=True)
    staging = dest.parent / f".{dest.name}.kubetune-deliver-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for rel, src in _files(path).items():
            out = staging / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)  # follows links (the Hugging Face cache links into its blobs)
        for rel, want in manifest.items():
            got = staging / rel
            if got.stat().st_size != want["size"]:
                raise _mismatch(str(dest), rel, f"{got.stat().st_size} bytes, expected {want['size']}")
            if file_digest(got) != want["sha256"]:
                raise _mismatch(str(dest), rel, "sha256 differs from the source's")
        if not dest.exists():
            os.replace(staging, dest)  # the whole folder at once
            return
        for rel in manifest:  # into an existing folder: file by file, each an atomic rename
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, dest / rel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- S3 ----------------------------------------------------------------------------------------------
def _prefix(dloc) -> str:
    return dloc.path.rstrip("/") + "/" if dloc.path.strip("/") else ""


def _verify_s3(dloc, path: Path, manifest: Manifest) -> None:
    from .s3 import S3Object, list_objects, map_error
    from .s3_integrity import intact

    prefix = _prefix(dloc)
    try:
        listed = {key[len(prefix):]: (key, size, etag, mtime) for key, size, etag, mtime in list_objects(dloc.host, prefix)}
    except Exception as e:
        raise map_error(e, dloc) from None
    local = _files(path)
    for rel, want in manifest.items():
        if rel not in listed:
            raise _mismatch(dloc.safe, rel, "missing after the upload")
        key, size, etag, mtime = listed[rel]
        if size != want["size"]:
            raise _mismatch(dloc.safe, rel, f"{size} bytes, expected {want['size']}")
        if not intact(local[rel], S3Object(key, rel, size, etag, mtime), dloc.host):
            raise _mismatch(dloc.safe, rel, "the object's ETag does not match the source's MD5")


def _unmark(dloc) -> None:
    if dloc.scheme != "s3":
        return
    from .s3 import map_error
    from .s3_client import client

    try:
        client().delete_object(Bucket=dloc.host, Key=_prefix(dloc) + C.DELIVER_MARKER)
    except Exception as e:
        raise map_error(e, dloc, "write") from None


def _mark(dloc, source: str, manifest: Manifest) -> None:
    record = {"source": source, "delivered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "files": manifest, "bytes": sum(f["size"] for f in manifest.values())}
    body = json.dumps(record, indent=1, sort_keys=True).encode()
    if dloc.scheme == "file":
        marker = dloc.local_path.expanduser().absolute() / C.DELIVER_MARKER
        tmp = marker.with_name(marker.name + C.STORAGE_PART_SUFFIX)
        tmp.write_bytes(body)
        os.replace(tmp, marker)
        return
    from .s3 import map_error
    from .s3_client import client

    try:
        client().put_object(Bucket=dloc.host, Key=_prefix(dloc) + C.DELIVER_MARKER, Body=body, ContentType="application/json",
                            ContentMD5=_b64md5(body))
    except Exception as e:
        raise map_error(e, dloc, "write") from None


def _b64md5(body: bytes) -> str:
    import base64

    return base64.b64encode(hashlib.md5(body).digest()).decode()


# --- OCI -------------------------------------------------------------------------------------------------
def _verify_oci(dloc, path: Path, manifest: Manifest) -> None:
    """The tag's manifest lists one layer per file: its title, size and sha256 digest must match."""
    from .oci import probe

    layers = {(layer.get("annotations") or {}).get(C.OCI_ANNOTATION_TITLE): layer for layer in probe(dloc).layers}
    for rel, want in manifest.items():
        layer = layers.get(rel)
        if layer is None:
            raise _mismatch(dloc.safe, rel, "no layer of that title in the pushed manifest")
        if int(layer.get("size", -1)) != want["size"]:
            raise _mismatch(dloc.safe, rel, f"the layer has {layer.get('size')} bytes, expected {want['size']}")
        if layer.get("digest") != f"sha256:{want['sha256']}":
            raise _mismatch(dloc.safe, rel, "the layer's digest differs from the source's sha256")
