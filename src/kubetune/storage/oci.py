"""oci:// sources and destinations: files as OCI artifacts (ORAS layout), and Kaito-style data images.

Pulling understands two layouts:

* an ORAS artifact: each layer is a file whose name is its ``org.opencontainers.image.title``
  annotation (a tar+gzip layer marked ``io.deis.oras.content.unpack`` is a directory);
* a container image (Kaito's data images): the layers are unpacked in order, whiteouts applied, and
  only the files under ``/data`` are kept.

Pushing writes ORAS artifacts that ``oras pull`` understands. Blobs stream from and to disk (never
whole in memory), run in parallel, are verified by their sha256 digest, and every request is retried
with backoff on 5xx, throttling and dropped connections. oras-py supplies reference parsing and the
docker credential configuration (see :mod:`.registry`); the transfers are ours because they must
stream, resume and verify.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import platform
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urljoin

from .. import constants as C
from ..errors import SourceError
from . import web
from ._common import Progress, Transient, TransferStats, concurrency, file_digest, safe_relpath, with_retries
from .archive import ArchiveError, merge_into, unpack
from .registry import Registry
from .uri import Location, scrub

__all__ = ["Artifact", "probe", "download", "push_files", "list_tags", "delete_tag"]

_ACCEPT = ", ".join([C.OCI_MEDIA_MANIFEST, C.OCI_MEDIA_INDEX, C.OCI_MEDIA_DOCKER_MANIFEST, C.OCI_MEDIA_DOCKER_LIST])


# --- references and manifests ----------------------------------------------------------------
def _split(loc: Location) -> tuple[str, str]:
    """(repository, tag or digest) of an oci:// location."""
    import oras.container

    try:
        c = oras.container.Container(loc.path, registry=loc.host)
    except ValueError as e:
        raise SourceError(f"{loc.safe}: not a valid image reference ({e})") from None
    repo = "/".join(p.strip("/") for p in (c.namespace or "", c.repository) if p and p.strip("/"))
    return repo, c.digest or c.tag


@dataclass
class Artifact:
    """A resolved manifest."""

    repo: str
    reference: str
    digest: str
    manifest: dict = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """``oci:<manifest digest>``: what the cache keys this artifact by."""
        return "oci:" + self.digest

    @property
    def layers(self) -> list[dict]:
        """The manifest's layers (blobs with media type, digest, size, annotations)."""
        return self.manifest.get("layers", [])


def probe(loc: Location, reg: Registry | None = None) -> Artifact:
    """Resolve a tag (or digest) to its manifest; an index picks this machine's platform."""
    own = reg is None
    reg = reg or Registry(loc.host, loc.safe)
    try:
        repo, ref = _split(loc)
        digest, manifest = _get_manifest(reg, repo, ref, loc)
        if manifest.get("mediaType") in (C.OCI_MEDIA_INDEX, C.OCI_MEDIA_DOCKER_LIST) or "manifests" in manifest:
            chosen = _pick_platform(manifest.get("manifests", []))
            if chosen is None:
                raise SourceError(f"{loc.safe}: the image index lists no manifests")
            digest, manifest = _get_manifest(reg, repo, chosen["digest"], loc)
        return Artifact(repo, ref, digest, manifest)
    finally:
        if own:
            reg.close()


def _get_manifest(reg: Registry, repo: str, ref: str, loc: Location) -> tuple[str, dict]:
    r = reg.request("GET", reg.url(repo, f"manifests/{ref}"), scope=f"repository:{repo}:pull", headers={"Accept": _ACCEPT})
    if r.status_code == 404:
        raise SourceError(f"{loc.safe}: no such repository or tag in registry {reg.host}", hint="check the name and tag; list tags with `oras repo tags`")
    if r.status_code != 200:
        raise SourceError(f"{loc.safe}: registry {reg.host} answered HTTP {r.status_code} for the manifest")
    body = r.content
    digest = r.headers.get("docker-content-digest") or "sha256:" + hashlib.sha256(body).hexdigest()
    return digest, json.loads(body)


def _pick_platform(manifests: list[dict]) -> dict | None:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    for m in manifests:
        p = m.get("platform") or {}
        if p.get("os", "linux") == "linux" and p.get("architecture") == arch:
            return m
    return manifests[0] if manifests else None


# --- pull ------------------------------------------------------------------------------------
def download(loc: Location, art: Artifact, target_dir: Path, stats: TransferStats, progress: Progress) -> Path:
    """Materialise an artifact's files (or an image's /data) in ``target_dir``; returns the result path."""
    reg = Registry(loc.host, loc.safe)
    try:
        titled = [lay for lay in art.layers if (lay.get("annotations") or {}).get(C.OCI_ANNOTATION_TITLE)]
        if titled:
            return _pull_artifact(reg, loc, art, titled, target_dir, stats, progress)
        return _pull_image_data(reg, loc, art, target_dir, stats, progress)
    finally:
        reg.close()


def _blob(reg: Registry, loc: Location, art: Artifact, layer: dict, target: Path, stats: TransferStats, progress: Progress) -> Path:
    digest, size = layer["digest"], int(layer.get("size", 0))
    if target.is_file() and target.stat().st_size == size and "sha256:" + file_digest(target) == digest:
        stats.skip(size)
        return target
    progress.expect(size)
    if art.repo not in reg.probed:  # one auth round trip up front: the streamed GETs carry its header
        reg.request("HEAD", reg.url(art.repo, f"blobs/{digest}"), scope=f"repository:{art.repo}:pull", ok=(200, 307))
        reg.probed.add(art.repo)
    return web.stream_to_file(
        reg.http, reg.url(art.repo, f"blobs/{digest}"), target, label=f"{loc.safe} ({digest[:19]})",
        expected_size=size, sha256=digest, validator=digest, headers=reg.auth_headers, stats=stats, progress=progress,
        on_status=lambda s: reg.denied(s) if s in (401, 403) else None,
    )


def _pull_artifact(reg, loc, art, layers, target_dir, stats, progress) -> Path:
    target_dir.mkdir(parents=True, exist_ok=True)
    blobs = target_dir / ".kubetune-blobs"
    results: list[Path] = []

    def one(layer: dict) -> Path:
        ann = layer.get("annotations") or {}
        try:
            rel = safe_relpath(ann[C.OCI_ANNOTATION_TITLE])
        except ValueError:
            raise SourceError(f"{loc.safe}: refusing layer title '{ann[C.OCI_ANNOTATION_TITLE]}': it would leave the destination folder") from None
        if str(ann.get(C.OCI_ANNOTATION_UNPACK, "")).lower() == "true":
            tgz = _blob(reg, loc, art, layer, blobs / layer["digest"].replace(":", "-"), stats, progress)
            unpack(tgz, target_dir / rel, label=f"{loc.safe} ({rel})", kind="tar")
            tgz.unlink()
            return target_dir / rel
        return _blob(reg, loc, art, layer, target_dir / rel, stats, progress)

    try:
        with cf.ThreadPoolExecutor(max_workers=concurrency(), thread_name_prefix="kubetune-oci") as pool:
            results = list(pool.map(one, layers))
    except ArchiveError:
        shutil.rmtree(blobs, ignore_errors=True)  # a refused layer is not kept for a resume
        raise
    if blobs.exists():
        blobs.rmdir()
    if len(layers) == 1 and results[0].is_file():
        return results[0]
    return target_dir


def _pull_image_data(reg, loc, art, target_dir, stats, progress) -> Path:
    """Kaito's convention: the files under /data of a container image, layers applied in order."""
    prefix = C.OCI_DATA_DIR + "/"
    with tempfile.TemporaryDirectory(prefix=".kubetune-layers-", dir=target_dir.parent if target_dir.parent.exists() else None) as tmp:
        staging = Path(tmp) / "data"
        staging.mkdir()
        found = False
        for i, layer in enumerate(art.layers):
            tgz = _blob(reg, loc, art, layer, Path(tmp) / f"layer-{i}", stats, progress)
            with tarfile.open(tgz, "r:*") as tf:
                names = [_norm(m.name) for m in tf.getmembers()]
            for name in names:  # whiteouts hide what lower layers put there
                base = name.rsplit("/", 1)[-1]
                if not name.startswith(prefix) or not base.startswith(".wh."):
                    continue
                parent = staging / name[len(prefix):].rsplit("/", 1)[0] if "/" in name[len(prefix):] else staging
                victim = parent if base == ".wh..wh..opq" else parent / base[4:]
                _remove_inside(staging, victim, opaque=base == ".wh..wh..opq")
            kept = _filtered_tar(tgz, Path(tmp) / f"layer-{i}.data.tar", prefix)
            if kept:
                found = True
                unpack(kept, staging, label=f"{loc.safe} (layer {i})", kind="tar")
                kept.unlink()
            tgz.unlink()
        if not found:
            raise SourceError(
                f"{loc.safe}: the image has no files under /{C.OCI_DATA_DIR}",
                hint=f"build data images with your files copied to /{C.OCI_DATA_DIR} (Kaito's convention), or push files with `kubetune push`",
            )
        target_dir.mkdir(parents=True, exist_ok=True)
        merge_into(staging, target_dir, label=loc.safe)  # links of the image must not combine with what is there
    return target_dir


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def _remove_inside(root: Path, victim: Path, *, opaque: bool) -> None:
    real_root, real = os.path.realpath(root), os.path.realpath(victim)
    if not (real == real_root or real.startswith(real_root + os.sep)):
        return
    if opaque and victim.is_dir():
        for child in victim.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    elif victim.is_dir() and not victim.is_symlink():
        shutil.rmtree(victim)
    elif victim.exists() or victim.is_symlink():
        victim.unlink()


def _filtered_tar(src: Path, out: Path, prefix: str) -> Path | None:
    """A tar of the members under ``prefix`` (prefix stripped, whiteouts dropped); None when there are none."""
    count = 0
    with tarfile.open(src, "r:*") as tin, tarfile.open(out, "w") as tout:
        for m in tin:
            name = _norm(m.name)
            if not name.startswith(prefix) or name.rsplit("/", 1)[-1].startswith(".wh."):
                continue
            m.name = name[len(prefix):]
            if m.islnk():
                link = _norm(m.linkname)
                if not link.startswith(prefix):
                    continue
                m.linkname = link[len(prefix):]
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
            count += 1
    if not count:
        out.unlink()
        return None
    return out


# --- push ------------------------------------------------------------------------------------
def push_files(
    loc: Location,
    files: list[tuple[Path, str, str]],
    stats: TransferStats,
    progress: Progress,
    *,
    config: tuple[bytes, str] | None = None,
    annotations: dict | None = None,
    artifact_type: str | None = None,
    tag: str | None = None,
) -> str:
    """Push (path, title, media type) files as one artifact; returns the manifest digest.

    The tag appears only when the manifest is written, after every blob: an artifact is complete or absent.
    """
    reg = Registry(loc.host, loc.safe)
    try:
        repo, ref = _split(loc)
        ref = tag or ref
        scope = f"repository:{repo}:pull,push"
        progress.expect(sum(p.stat().st_size for p, _, _ in files))

        def layer(item: tuple[Path, str, str]) -> dict:
            path, title, media = item
            desc = _upload_blob(reg, repo, scope, path, stats, progress)
            return {"mediaType": media, **desc, "annotations": {C.OCI_ANNOTATION_TITLE: title}}

        with cf.ThreadPoolExecutor(max_workers=concurrency(), thread_name_prefix="kubetune-oci") as pool:
            layers = list(pool.map(layer, files))
        cfg_bytes, cfg_media = config or (b"{}", C.OCI_MEDIA_EMPTY_CONFIG)
        with tempfile.NamedTemporaryFile(prefix=".kubetune-config-") as f:
            f.write(cfg_bytes)
            f.flush()
            cfg_desc = _upload_blob(reg, repo, scope, Path(f.name), None, None)
        manifest: dict[str, Any] = {
            "schemaVersion": 2,
            "mediaType": C.OCI_MEDIA_MANIFEST,
            "config": {"mediaType": cfg_media, **cfg_desc},
            "layers": layers,
        }
        if artifact_type:
            manifest["artifactType"] = artifact_type
        if annotations:
            manifest["annotations"] = {str(k): str(v) for k, v in annotations.items()}
        body = json.dumps(manifest, separators=(",", ":")).encode()
        r = reg.request("PUT", reg.url(repo, f"manifests/{ref}"), scope=scope, body=lambda: body,
                        headers={"Content-Type": C.OCI_MEDIA_MANIFEST}, ok=(200, 201))
        if r.status_code not in (200, 201):
            raise SourceError(f"{loc.safe}: registry {reg.host} refused the manifest (HTTP {r.status_code}): {scrub(r.text[:300])}")
        stats.add(0, len(files))
        return r.headers.get("docker-content-digest") or "sha256:" + hashlib.sha256(body).hexdigest()
    finally:
        reg.close()


def _upload_blob(reg: Registry, repo: str, scope: str, path: Path, stats: TransferStats | None, progress: Progress | None) -> dict:
    size = path.stat().st_size
    digest = "sha256:" + file_digest(path)
    head = reg.request("HEAD", reg.url(repo, f"blobs/{digest}"), scope=scope, ok=(200,))
    if head.status_code == 200:  # already there (another file, an earlier push): nothing to send
        if stats:
            stats.skip(size)
        if progress:
            progress.advance(size)
        return {"digest": digest, "size": size}

    def send(i: int) -> None:
        start = reg.request("POST", reg.url(repo, "blobs/uploads/"), scope=scope, ok=(202,),
                            headers={"Content-Length": "0"})
        if start.status_code != 202 or "location" not in start.headers:
            raise SourceError(f"{reg.label}: registry {reg.host} refused to start an upload (HTTP {start.status_code})")
        location = urljoin(str(start.url), start.headers["location"])
        sep = "&" if "?" in location else "?"
        sent = [0]

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    sent[0] += len(block)
                    if stats:
                        stats.add(len(block))
                    if progress:
                        progress.advance(len(block))
                    yield block

        r = reg.request("PUT", f"{location}{sep}digest={digest}", scope=scope, body=chunks, ok=(201,),
                        headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if r.status_code != 201:
            raise Transient(f"blob upload answered HTTP {r.status_code}")

    try:
        with_retries(send, what=f"upload {path.name} to {reg.label}")
    except Transient as e:
        raise SourceError(f"{reg.label}: uploading {path.name} failed ({e})", hint="try again later") from None
    return {"digest": digest, "size": size}


# --- tags ------------------------------------------------------------------------------------
def list_tags(loc: Location) -> list[str]:
    """All tags of the location's repository ([] when the repository does not exist yet)."""
    reg = Registry(loc.host, loc.safe)
    try:
        repo, _ = _split(loc)
        tags: list[str] = []
        url: str | None = reg.url(repo, "tags/list?n=1000")
        while url:
            r = reg.request("GET", url, scope=f"repository:{repo}:pull", ok=(200,))
            if r.status_code == 404:
                return []
            if r.status_code != 200:
                raise SourceError(f"{loc.safe}: registry {reg.host} answered HTTP {r.status_code} listing tags")
            tags += r.json().get("tags") or []
            link = r.headers.get("link", "")
            url = urljoin(reg.base, link.split(";")[0].strip("<> ")) if "rel=\"next\"" in link else None
        return tags
    finally:
        reg.close()


def delete_tag(loc: Location, tag: str) -> bool:
    """Delete a tag's manifest when the registry allows deletes; False when it does not."""
    reg = Registry(loc.host, loc.safe)
    try:
        repo, _ = _split(loc)
        r = reg.request("HEAD", reg.url(repo, f"manifests/{tag}"), scope=f"repository:{repo}:pull,push",
                        headers={"Accept": _ACCEPT}, ok=(200,))
        digest = r.headers.get("docker-content-digest")
        if r.status_code != 200 or not digest:
            return False
        d = reg.request("DELETE", reg.url(repo, f"manifests/{digest}"), scope=f"repository:{repo}:pull,push,delete", ok=(202,))
        return d.status_code == 202
    finally:
        reg.close()

