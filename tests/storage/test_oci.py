"""oci:// against Debian's docker-registry on 127.0.0.1: artifacts, Kaito data images, auth, faults."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile

import httpx
import pytest
from kt_storage_util import make_tree, read_tree, sample_files

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch, push
from kubetune.storage.fetcher import fetch_with_stats


def _manifest(host: str, repo: str, tag: str) -> dict:
    r = httpx.get(f"http://{host}/v2/{repo}/manifests/{tag}", headers={"Accept": C.OCI_MEDIA_MANIFEST})
    r.raise_for_status()
    return r.json()


def test_directory_round_trip_as_oras_artifact(oci_registry, tmp_path):
    files = sample_files(n_small=12, big=3_000_000)
    src = make_tree(tmp_path / "model", files)
    uri = f"oci://{oci_registry.host}/models/tiny:v1"
    summary = push(src, uri, annotations={"org.example/owner": "team-a"})
    assert summary["files"] == len(files) and summary["digest"].startswith("sha256:")
    assert summary["bytes"] == sum(len(v) for v in files.values())

    m = _manifest(oci_registry.host, "models/tiny", "v1")
    titles = {lay["annotations"][C.OCI_ANNOTATION_TITLE] for lay in m["layers"]}
    assert titles == set(files)  # one layer per file, named by its path: what `oras pull` expects
    assert m["annotations"]["org.example/owner"] == "team-a" and C.OCI_ANNOTATION_CREATED in m["annotations"]

    out = fetch(uri, tmp_path / "dest")
    assert out == tmp_path / "dest" and read_tree(out) == files


def test_push_again_skips_existing_blobs_and_cache_hits(oci_registry, tmp_path):
    files = sample_files(n_small=3)
    src = make_tree(tmp_path / "m", files)
    uri = f"oci://{oci_registry.host}/models/again:v1"
    push(src, uri)
    second = push(src, f"oci://{oci_registry.host}/models/again:v2")
    assert second["bytes"] == 0 and second["skipped_bytes"] == sum(len(v) for v in files.values())

    p1, s1 = fetch_with_stats(uri)
    p2, s2 = fetch_with_stats(uri)
    assert read_tree(p1) == files and p2 == p1 and s2.cached and not s1.cached

    (src / "config.json").write_bytes(b'{"changed": true}')
    push(src, uri)  # the tag now points at a new manifest digest: the cache must notice
    p3, s3 = fetch_with_stats(uri)
    assert not s3.cached and (p3 / "config.json").read_bytes() == b'{"changed": true}'


def test_single_file_and_tarball(oci_registry, tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b'{"text": "a"}\n' * 50)
    push(f, f"oci://{oci_registry.host}/data/train:v1")
    got = fetch(f"oci://{oci_registry.host}/data/train:v1", tmp_path / "d")
    assert got == tmp_path / "d" / "train.jsonl" and got.read_bytes() == f.read_bytes()

    files = {"config.json": b"{}", "tok/vocab.txt": b"a b c"}
    push(make_tree(tmp_path / "tiny", files), f"oci://{oci_registry.host}/models/packed:v1", tar=True)
    m = _manifest(oci_registry.host, "models/packed", "v1")
    assert [lay["annotations"][C.OCI_ANNOTATION_TITLE] for lay in m["layers"]] == ["tiny.tar.gz"]
    assert m["layers"][0]["mediaType"] == C.OCI_MEDIA_TAR_GZIP
    assert read_tree(fetch(f"oci://{oci_registry.host}/models/packed:v1", tmp_path / "p")) == files


def _push_image(host: str, repo: str, tag: str, layers: list[dict[str, bytes | None]]) -> None:
    """Push a container image (no ORAS titles) whose layers hold the given paths (None: whiteout files)."""
    descs = []
    for content in layers:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data in content.items():
                info = tarfile.TarInfo(name)
                info.size = len(data or b"")
                tf.addfile(info, io.BytesIO(data or b""))
        blob = gzip.compress(buf.getvalue())
        descs.append(_upload(host, repo, blob, C.OCI_MEDIA_TAR_GZIP))
    config = _upload(host, repo, json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode(),
                     "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": C.OCI_MEDIA_MANIFEST, "config": config, "layers": descs}
    r = httpx.put(f"http://{host}/v2/{repo}/manifests/{tag}", content=json.dumps(manifest),
                  headers={"Content-Type": C.OCI_MEDIA_MANIFEST})
    assert r.status_code == 201, r.text


def _upload(host: str, repo: str, blob: bytes, media: str) -> dict:
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    r = httpx.post(f"http://{host}/v2/{repo}/blobs/uploads/")
    loc = r.headers["location"]
    loc = loc if loc.startswith("http") else f"http://{host}{loc}"
    r = httpx.put(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", content=blob)
    assert r.status_code == 201, r.text
    return {"mediaType": media, "digest": digest, "size": len(blob)}


def test_kaito_data_image_files_under_data(oci_registry, tmp_path):
    _push_image(oci_registry.host, "kaito/dataset", "0.0.1", [
        {"bin/sh": b"#!", "data/train.jsonl": b"old\n", "data/stale.jsonl": b"gone\n"},
        {"data/train.jsonl": b'{"messages": []}\n', "data/.wh.stale.jsonl": None, "./data/extra/eval.jsonl": b"e\n",
         "etc/passwd": b"root"},
    ])
    out = fetch(f"oci://{oci_registry.host}/kaito/dataset:0.0.1", tmp_path / "d")
    assert read_tree(out) == {"train.jsonl": b'{"messages": []}\n', "extra/eval.jsonl": b"e\n"}

    _push_image(oci_registry.host, "kaito/nodata", "1", [{"app/x": b"y"}])
    with pytest.raises(SourceError, match="no files under /data"):
        fetch(f"oci://{oci_registry.host}/kaito/nodata:1", tmp_path / "e")


@pytest.mark.parametrize("kind", ["500", "reset", "cut"])
def test_faults_byte_exact(oci_registry, tmp_path, fault_proxy, kind):
    proxy = fault_proxy(f"http://{oci_registry.host}")
    files = {"w.bin": os.urandom(2_000_000), "c.json": b"{}"}
    src = make_tree(tmp_path / "m", files)
    uri = f"oci://{proxy.host}/faults/{kind}:v1"
    proxy.fail(2, "reset" if kind == "cut" else kind, when=lambda m, p: m == "PUT" and "/blobs/uploads/" in p)
    push(src, uri)
    proxy.fail(2, kind, when=lambda m, p: m == "GET" and "/blobs/sha256" in p)
    proxy.fail(1, "500" if kind == "cut" else kind, when=lambda m, p: m == "GET" and "/manifests/" in p)
    assert read_tree(fetch(uri, tmp_path / "dest")) == files
    assert len(proxy.injected) == 5


def test_errors_not_found_unreachable(oci_registry, tmp_path):
    with pytest.raises(SourceError) as e:
        fetch(f"oci://{oci_registry.host}/nothing/here:v9", tmp_path / "d")
    assert f"oci://{oci_registry.host}/nothing/here:v9: no such repository or tag" in str(e.value)

    from _support.fixtures_servers import free_port

    host = f"127.0.0.1:{free_port()}"
    with pytest.raises(SourceError) as e:
        fetch(f"oci://{host}/a/b:c", tmp_path / "d")
    assert "cannot reach registry" in str(e.value) and C.ENV_REGISTRY_PLAIN_HTTP in str(e.value)


def test_auth_registry(oci_auth_registry, tmp_path, monkeypatch):
    reg = oci_auth_registry
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": os.urandom(1000)}
    src = make_tree(tmp_path / "m", files)
    uri = f"oci://{reg.host}/private/adapter:v1"
    with pytest.raises(SourceError) as e:
        push(src, uri)
    msg = str(e.value)
    assert uri in msg and "access denied" in msg and C.ENV_REGISTRY_USERNAME in msg and "found: none" in msg

    monkeypatch.setenv(C.ENV_REGISTRY_USERNAME, reg.user)
    monkeypatch.setenv(C.ENV_REGISTRY_PASSWORD, "wrong-password-123")
    with pytest.raises(SourceError) as e:
        push(src, uri)
    assert "access denied" in str(e.value) and "wrong-password-123" not in str(e.value)

    monkeypatch.setenv(C.ENV_REGISTRY_PASSWORD, reg.password)
    push(src, uri)
    assert read_tree(fetch(uri, tmp_path / "d")) == files

    # the docker config file (what an imagePullSecret mounts) works too
    monkeypatch.delenv(C.ENV_REGISTRY_USERNAME)
    monkeypatch.delenv(C.ENV_REGISTRY_PASSWORD)
    import base64

    cfg = tmp_path / "docker"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    assert read_tree(fetch(uri, tmp_path / "d2")) == files
