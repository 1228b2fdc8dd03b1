"""`kubetune deliver SRC DEST` here (the local backend): an http:// file and an s3:// folder reach s3://, a local
folder and oci:// byte for byte, verified, with the completion marker written last; transient source errors are
retried by the storage layer; what cannot be delivered is one clear error. Real servers on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch, push
from kubetune.storage.deliver import deliver

BIN = Path(sys.executable).parent


def _kubetune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "kubetune"), *args], capture_output=True, text=True, env=dict(os.environ), timeout=300)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _get(s3, key: str) -> bytes:
    return s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()


def test_an_http_file_to_s3_is_verified_and_marked_complete(s3, http_server):
    body = b"".join(b'{"prompt": "q%d", "completion": "a%d"}\n' % (i, i) for i in range(2000))
    (http_server.root / "train.jsonl").write_bytes(body)
    r = _kubetune("deliver", f"{http_server.url}/train.jsonl", s3.uri("datasets/qa"), "-q")
    assert r.returncode == 0, r.stderr
    assert _get(s3, "datasets/qa/train.jsonl") == body  # DEST is a folder: the file lands at DEST/NAME
    marker = json.loads(_get(s3, f"datasets/qa/{C.DELIVER_MARKER}"))
    assert marker["files"] == {"train.jsonl": {"size": len(body), "sha256": _sha(body)}}
    assert marker["source"] == f"{http_server.url}/train.jsonl"
    lines = r.stdout.splitlines()
    assert lines[0] == f"deliver: fetching {http_server.url}/train.jsonl"
    assert "deliver: verified 1 file(s)" in r.stdout and lines[-1].startswith("deliver: complete: ")
    # a rerun replaces the marker only after verifying again
    assert _kubetune("deliver", f"{http_server.url}/train.jsonl", s3.uri("datasets/qa"), "-q").returncode == 0


def test_a_delivered_prefix_delivers_on_without_its_old_marker(s3, http_server, tmp_path):
    (http_server.root / "train.jsonl").write_bytes(b'{"text": "a"}\n')
    deliver(f"{http_server.url}/train.jsonl", s3.uri("hop1"))
    deliver(s3.uri("hop1"), str(tmp_path / "hop2"))
    assert sorted(p.name for p in (tmp_path / "hop2").iterdir()) == [C.DELIVER_MARKER, "train.jsonl"]
    assert list(json.loads((tmp_path / "hop2" / C.DELIVER_MARKER).read_text())["files"]) == ["train.jsonl"]
    assert json.loads((tmp_path / "hop2" / C.DELIVER_MARKER).read_text())["source"] == s3.uri("hop1")


def test_an_s3_folder_to_a_local_folder_arrives_whole(s3, tmp_path):
    src = tmp_path / "model"
    (src / "nested").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "nested" / "weights.bin").write_bytes(os.urandom(300_000))
    push(src, s3.uri("models/m"))
    out = tmp_path / "delivered" / "m"
    summary = deliver(s3.uri("models/m"), str(out))
    assert summary["files"] == 2 and summary["verified"] and summary["bytes"] == 300_000 + 8
    assert (out / "nested" / "weights.bin").read_bytes() == (src / "nested" / "weights.bin").read_bytes()
    marker = json.loads((out / C.DELIVER_MARKER).read_text())
    assert set(marker["files"]) == {"config.json", "nested/weights.bin"}
    assert [p.name for p in out.parent.iterdir()] == ["m"]  # no staging folder left beside it


def test_transient_source_errors_are_retried(s3, http_server):
    (http_server.root / "data.jsonl").write_bytes(b'{"text": "x"}\n')
    http_server.faults = ["503", "reset"]
    lines: list[str] = []
    deliver(f"{http_server.url}/data.jsonl", s3.uri("retry/"), report=lines.append)
    assert _get(s3, "retry/data.jsonl") == b'{"text": "x"}\n'
    assert not http_server.faults  # both faults were met, and the copy still completed
    assert lines[-1].startswith("deliver: complete: ")


def test_a_builtin_model_to_an_oci_artifact_is_checked_against_its_layers(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBETUNE_REGISTRY_PLAIN_HTTP", "1")
    uri = f"oci://{oci_registry.host}/models/tiny-chat:delivered"
    summary = deliver("builtin://tiny-chat", uri)
    assert summary["verified"] and summary["digest"].startswith("sha256:")
    back = fetch(uri, tmp_path / "back")
    local = fetch("builtin://tiny-chat")
    for p in local.rglob("*"):
        if p.is_file():
            assert (back / p.relative_to(local)).read_bytes() == p.read_bytes()


def test_what_cannot_be_delivered_is_one_error(s3, tmp_path):
    (tmp_path / "a.txt").write_text("a")
    r = _kubetune("deliver", str(tmp_path), "https://example.com/model")
    assert r.returncode == 2 and "deliver writes to hf://, s3://, oci:// or file://" in r.stderr and "Traceback" not in r.stderr
    r = _kubetune("deliver", str(tmp_path / "missing"), s3.uri("x"))
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    r = _kubetune("deliver", str(tmp_path), s3.uri("x"), "--secret", "s3-credentials")
    assert r.returncode == 2 and "--secret applies to --backend kubernetes" in r.stderr
    (tmp_path / "file-dest").write_text("not a folder")
    with pytest.raises(SourceError, match="exists and is not a folder"):
        deliver(str(tmp_path / "a.txt"), str(tmp_path / "file-dest"))
