"""Local paths, builtin://, hf:// (offline cache and argument pass-through), URI parsing, light imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kt_storage_util import make_tree, read_tree

from kubetune.errors import SourceError
from kubetune.storage import fetch, is_remote, parse_uri


# --- local and builtin -----------------------------------------------------------------------------
def test_local_path_returned_as_is_or_copied(tmp_path):
    files = {"config.json": b"{}", "a/b.txt": b"b"}
    src = make_tree(tmp_path / "model", files)
    assert fetch(src) == src
    assert fetch(f"file://{src}") == src
    out = fetch(src, tmp_path / "dest")
    assert out == tmp_path / "dest" and read_tree(out) == files
    single = fetch(src / "config.json", tmp_path / "dest2")
    assert single == tmp_path / "dest2" / "config.json" and single.read_bytes() == b"{}"


def test_local_missing(tmp_path):
    with pytest.raises(SourceError, match=r"nope: no such file or directory"):
        fetch(tmp_path / "nope")


def test_builtin(tiny_model, tmp_path):
    assert fetch("builtin://tiny-chat") == tiny_model
    out = fetch("builtin://tiny-chat", tmp_path / "m")
    assert read_tree(out) == read_tree(tiny_model)
    assert {"config.json", "model.safetensors"} <= set(read_tree(out))


# --- hf:// -----------------------------------------------------------------------------------------
COMMIT_MAIN = "a" * 40
COMMIT_V1 = "b" * 40


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache laid out as huggingface_hub writes it, with the Hub unreachable (offline)."""
    import huggingface_hub.constants as hfc

    cache = tmp_path / "hf-hub"
    repo = cache / "models--kt-org--tiny"
    make_tree(repo / "snapshots" / COMMIT_MAIN, {"config.json": b'{"v": "main"}', "model.safetensors": b"W" * 100, "README.md": b"hi"})
    make_tree(repo / "snapshots" / COMMIT_V1, {"config.json": b'{"v": "v1"}', "model.safetensors": b"V" * 100})
    make_tree(repo / "refs", {"main": COMMIT_MAIN.encode(), "v1": COMMIT_V1.encode()})
    ds = cache / "datasets--kt-org--chats"
    make_tree(ds / "snapshots" / COMMIT_MAIN, {"data/train.jsonl": b'{"messages": []}\n'})
    make_tree(ds / "refs", {"main": COMMIT_MAIN.encode()})
    monkeypatch.setattr(hfc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", True)
    return cache


def test_hf_offline_cache_and_revision(hf_cache, tmp_path):
    main = fetch("hf://kt-org/tiny")
    assert main == hf_cache / "models--kt-org--tiny" / "snapshots" / COMMIT_MAIN
    assert (fetch("hf://kt-org/tiny@v1") / "config.json").read_bytes() == b'{"v": "v1"}'
    assert (fetch("hf://kt-org/tiny", revision="v1") / "config.json").read_bytes() == b'{"v": "v1"}'

    out = fetch("hf://kt-org/tiny", tmp_path / "d", allow_patterns=["*.json", "*.safetensors"], ignore_patterns=["*.md"])
    assert read_tree(out) == {"config.json": b'{"v": "main"}', "model.safetensors": b"W" * 100}

    assert fetch("hf://datasets/kt-org/chats/data/train.jsonl").read_bytes() == b'{"messages": []}\n'


def test_hf_offline_not_cached(hf_cache, tmp_path):
    with pytest.raises(SourceError) as e:
        fetch("hf://kt-org/absent", tmp_path / "d")
    assert "hf://kt-org/absent: HF_HUB_OFFLINE is set and the files are not in the local cache" in str(e.value)


def test_hf_arguments_pass_through(monkeypatch, tmp_path):
    """Online, snapshot_download writes into the destination; every argument reaches it."""
    import huggingface_hub
    import huggingface_hub.constants as hfc

    calls = []

    def recorder(**kwargs):  # a stand-in for the Hub, which this machine cannot reach
        calls.append(kwargs)
        target = Path(kwargs.get("local_dir") or tmp_path / "snap")
        make_tree(target, {"data/train.jsonl": b"x\n"})
        return str(target)

    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", recorder)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_passed_by_us")
    out = fetch("hf://datasets/kt-org/chats@v2.0", tmp_path / "dest", allow_patterns=["*.jsonl"], ignore_patterns=["*.md"])
    assert out == tmp_path / "dest"
    (kw,) = calls
    assert kw["repo_id"] == "kt-org/chats" and kw["repo_type"] == "dataset" and kw["revision"] == "v2.0"
    assert kw["allow_patterns"] == ["*.jsonl"] and kw["ignore_patterns"] == ["*.md"]
    assert kw["local_dir"] == str(tmp_path / "dest")
    assert "token" not in kw  # huggingface_hub reads HF_TOKEN itself; we never handle it


def test_hf_error_mapping(monkeypatch, tmp_path):
    import httpx2
    import huggingface_hub
    import huggingface_hub.constants as hfc
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api/models/x"))
    for exc, expected in ((RepositoryNotFoundError("nope", response=response), "repository not found (or private)"),
                          (GatedRepoError("gated", response=response), "the repository is gated")):
        def boom(**kwargs):
            raise exc

        monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", boom)
        with pytest.raises(SourceError) as e:
            fetch("hf://kt-org/private", tmp_path / "d")
        assert f"hf://kt-org/private: {expected}" in str(e.value) and "HF_TOKEN" in str(e.value)


# --- URIs and imports ------------------------------------------------------------------------------
@pytest.mark.parametrize("uri, scheme, host, path", [
    ("/data/x.jsonl", "file", "", "/data/x.jsonl"),
    ("file:///data/x", "file", "", "/data/x"),
    ("builtin://tiny-chat", "builtin", "tiny-chat", ""),
    ("s3://bucket/models/m", "s3", "bucket", "models/m"),
    ("s3://bucket", "s3", "bucket", ""),
    ("https://h.example:8443/a/b.tgz?x=1", "https", "h.example:8443", "/a/b.tgz"),
    ("oci://reg.example:5000/ns/repo:tag", "oci", "reg.example:5000", "ns/repo:tag"),
    ("hf://org/name@main", "hf", "org/name", ""),
])
def test_parse_uri(uri, scheme, host, path):
    loc = parse_uri(uri)
    assert (loc.scheme, loc.host, loc.path) == (scheme, host, path)
    assert is_remote(uri) == (scheme in ("s3", "https", "oci", "hf"))


def test_parse_uri_errors():
    with pytest.raises(SourceError, match="unknown URI scheme 'ftp://'"):
        parse_uri("ftp://x/y")
    with pytest.raises(SourceError, match="expected hf://ORG/NAME"):
        parse_uri("hf://justname")
    with pytest.raises(SourceError, match="expected oci://REGISTRY/REPOSITORY"):
        parse_uri("oci://registry-only")


def test_imports_stay_light():
    code = ("import sys, kubetune.storage, kubetune.cli.storage; "
            "heavy = [m for m in ('boto3', 'botocore', 'huggingface_hub', 'oras', 'httpx', 'torch') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
