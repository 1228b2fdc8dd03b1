"""s3:// against moto's real S3 server on 127.0.0.1: round trips, multipart, faults, integrity, errors."""

from __future__ import annotations

import hashlib
import os

import pytest
from kt_storage_util import make_tree, read_tree, sample_files

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch, push
from kubetune.storage import s3 as s3mod


@pytest.fixture
def small_parts(monkeypatch):
    """Multipart from 5 MiB (S3's smallest part), so that a 12 MiB file has 3 parts."""
    monkeypatch.setattr(C, "STORAGE_MULTIPART_THRESHOLD", 5 * 1024 * 1024)
    monkeypatch.setattr(C, "STORAGE_MULTIPART_CHUNKSIZE", 5 * 1024 * 1024)


@pytest.fixture(params=["crt", "classic"])
def engine(request, monkeypatch):
    """Uploads through the AWS CRT client (what auto picks when awscrt is installed, as in the test extra) or
    s3transfer's classic thread pool: both must give the same objects."""
    monkeypatch.setenv(C.ENV_S3_TRANSFER_CLIENT, request.param)
    return request.param


def test_directory_round_trip(s3, tmp_path, engine):
    files = sample_files(n_small=30)
    src = make_tree(tmp_path / "src", files)

    summary = push(src, s3.uri("models/tiny"))
    assert summary["files"] == len(files)
    assert summary["bytes"] == sum(len(v) for v in files.values())
    assert summary["uri"] == f"s3://{s3.bucket}/models/tiny"
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert keys == {f"models/tiny/{k}" for k in files}

    out = fetch(s3.uri("models/tiny"), tmp_path / "dest")
    assert out == tmp_path / "dest"
    assert read_tree(out) == files  # byte-exact, nothing extra (no partial or bookkeeping files)


def test_single_object_and_trailing_slash_push(s3, tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b'{"text": "hi"}\n' * 100)
    push(f, s3.uri("data/"))
    push(f, s3.uri("data/renamed.jsonl"))
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert keys == {"data/train.jsonl", "data/renamed.jsonl"}

    got = fetch(s3.uri("data/renamed.jsonl"), tmp_path / "d")
    assert got == tmp_path / "d" / "renamed.jsonl"
    assert got.read_bytes() == f.read_bytes()


def test_multipart_above_threshold(s3, tmp_path, small_parts, engine):
    data = os.urandom(12 * 1024 * 1024 + 123)
    src = make_tree(tmp_path / "src", {"model.safetensors": data, "config.json": b"{}"})
    push(src, s3.uri("big"))

    head = s3.client.head_object(Bucket=s3.bucket, Key="big/model.safetensors")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # 3 parts: it really went multipart
    assert head["Metadata"][C.S3_META_PART_SIZE] == str(5 * 1024 * 1024)
    small = s3.client.head_object(Bucket=s3.bucket, Key="big/config.json")
    assert "-" not in small["ETag"]

    out = fetch(s3.uri("big"), tmp_path / "dest")
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_multipart_etag_is_verified(s3, tmp_path, small_parts):
    from kubetune.storage.s3_integrity import intact

    data = os.urandom(11 * 1024 * 1024)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    push(f, s3.uri("w.bin"))
    listing = s3mod.probe(s3mod.Location(uri=s3.uri("w.bin"), scheme="s3", host=s3.bucket, path="w.bin"))
    obj = listing.objects[0]
    assert "-" in obj.etag  # a multipart ETag (MD5 of the part MD5s)
    assert intact(f, obj, s3.bucket)
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert not intact(corrupt, obj, s3.bucket)


def test_download_failing_integrity_is_refetched_then_refused(s3, tmp_path, monkeypatch):
    from kubetune.storage import s3_download

    src = make_tree(tmp_path / "src", {"a.bin": os.urandom(5000)})
    push(src, s3.uri("p"))
    calls = []
    real = s3_download._verified

    def flaky(bucket, plan):
        calls.append(plan.obj.key)
        return real(bucket, plan) if len(calls) > 1 else False

    monkeypatch.setattr(s3_download, "_verified", flaky)
    out = fetch(s3.uri("p"), tmp_path / "ok")
    assert (out / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert calls == ["p/a.bin", "p/a.bin"]  # failed once, downloaded again, verified

    monkeypatch.setattr(s3_download, "_verified", lambda *a: False)
    with pytest.raises(SourceError, match="integrity check failed"):
        fetch(s3.uri("p"), tmp_path / "bad")
    assert not (tmp_path / "bad" / "a.bin").exists()  # an unverified file never takes the real name
    assert not list((tmp_path / "bad").rglob("*.kubetune-part"))


@pytest.mark.parametrize("checksums", ["botocore", "etag-only"])
@pytest.mark.parametrize("name", ["w.bin", "s.bin"])
def test_in_flight_verification_catches_corruption(s3, tmp_path, small_parts, fault_proxy, monkeypatch, name, checksums):
    """A bit flipped in transit (full length, 200 OK) never reaches the file: the download is byte-exact.

    w.bin is multipart (3 ranges), s.bin a plain object. When the server sends a whole-object checksum
    (s.bin, with botocore's default validation), botocore's check fails that request and it is fetched again;
    otherwise (ranged GETs carry no whole-object checksum; servers or clients that keep none) the MD5s taken
    in flight fail the ETag check and the whole file is fetched again.
    """
    if checksums == "etag-only":
        monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    data = {"w.bin": os.urandom(11 * 1024 * 1024), "s.bin": os.urandom(3000)}
    push(make_tree(tmp_path / "src", data), s3.uri("v"))
    proxy = fault_proxy(s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)

    def is_get(m, p):
        return m == "GET" and p.split("?")[0].endswith("/v/" + name)

    proxy.fail(1, "flip", when=is_get)
    out = fetch(s3.uri("v"), tmp_path / "d")
    assert [i[0] for i in proxy.injected] == ["flip"]
    assert read_tree(out) == data  # byte-exact after the corruption was detected
    requests = 3 if name == "w.bin" else 1
    again = 1 if (checksums, name) == ("botocore", "s.bin") else requests  # the one request, or the whole file
    assert len([1 for m, p in proxy.seen if is_get(m, p)]) == requests + again


@pytest.mark.parametrize("kind", ["500", "503", "reset", "cut"])
def test_injected_faults_upload_and_download_byte_exact(s3, tmp_path, fault_proxy, monkeypatch, small_parts, kind, engine):
    proxy = fault_proxy(s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    files = sample_files(n_small=5)
    files["big.bin"] = os.urandom(11 * 1024 * 1024)
    src = make_tree(tmp_path / "src", files)

    # the first 3 part uploads / puts fail
    proxy.fail(3, kind, when=lambda m, p: m == "PUT" and "big.bin" in p)
    push(src, s3.uri("f"))
    assert len([i for i in proxy.injected if i[1] == "PUT"]) == 3

    proxy.fail(3, kind, when=lambda m, p: m == "GET" and "big.bin" in p)
    proxy.fail(2, kind, when=lambda m, p: m == "GET" and "list-type" in p)
    out = fetch(s3.uri("f"), tmp_path / "dest")
    assert read_tree(out) == files
    assert len([i for i in proxy.injected if i[1] == "GET"]) == 5


def test_interrupted_directory_fetch_resumes(s3, tmp_path):
    files = sample_files(n_small=10)
    push(make_tree(tmp_path / "src", files), s3.uri("r"))
    dest = tmp_path / "dest"
    fetch(s3.uri("r"), dest)
    (dest / "shards/small-003.bin").unlink()  # as if the first run died before this file
    part = dest / ("config.json" + C.STORAGE_PART_SUFFIX)
    part.write_bytes(b"garbage from a killed run")

    from kubetune.storage.fetcher import fetch_with_stats

    out, stats = fetch_with_stats(s3.uri("r"), dest)
    assert read_tree(out) == files  # the missing file is back, the stale partial file is gone
    assert stats.files == 1  # only the missing file moved
    assert stats.bytes == len(files["shards/small-003.bin"])
    assert stats.skipped_bytes == sum(len(v) for k, v in files.items() if k != "shards/small-003.bin")


def test_cache_hit_and_etag_change(s3, tmp_path):
    f = tmp_path / "data.jsonl"
    f.write_bytes(b"one\n")
    push(f, s3.uri("d/data.jsonl"))
    from kubetune.storage.fetcher import fetch_with_stats

    p1, st1 = fetch_with_stats(s3.uri("d/data.jsonl"))
    assert p1.read_bytes() == b"one\n" and not st1.cached and st1.bytes == 4
    p2, st2 = fetch_with_stats(s3.uri("d/data.jsonl"))
    assert p2 == p1 and st2.cached and st2.bytes == 0

    f.write_bytes(b"two two\n")  # a new version: new ETag, so the cache must not answer
    push(f, s3.uri("d/data.jsonl"))
    p3, st3 = fetch_with_stats(s3.uri("d/data.jsonl"))
    assert p3.read_bytes() == b"two two\n" and not st3.cached

    p4, st4 = fetch_with_stats(s3.uri("d/data.jsonl"), use_cache=False)
    assert p4.read_bytes() == b"two two\n" and not st4.cached and st4.bytes == 8


def test_archive_object_is_unpacked(s3, tmp_path):
    files = {"config.json": b"{}", "tokenizer.json": b"[]"}
    src = make_tree(tmp_path / "model", files)
    summary = push(src, s3.uri("models/tiny.tar.gz"), tar=True)
    assert summary["files"] == 1
    out = fetch(s3.uri("models/tiny.tar.gz"))
    assert read_tree(out) == files


# --- errors ------------------------------------------------------------------------------------------
def test_no_such_bucket(s3, tmp_path):
    with pytest.raises(SourceError) as e:
        fetch("s3://kt-no-such-bucket-xyz/models/m", tmp_path / "d")
    msg = str(e.value)
    assert "s3://kt-no-such-bucket-xyz/models/m" in msg
    assert "does not exist" in msg and "AWS_ENDPOINT_URL" in msg and s3.endpoint in msg


def test_no_such_prefix(s3, tmp_path):
    with pytest.raises(SourceError, match=rf"s3://{s3.bucket}/nothing/here: no such object or prefix"):
        fetch(s3.uri("nothing/here"), tmp_path / "d")


def test_unreachable_endpoint(s3, tmp_path, monkeypatch):
    port = __import__("_support.fixtures_servers", fromlist=["_"]).free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(SourceError) as e:
        fetch(s3.uri("x"), tmp_path / "d")
    msg = str(e.value)
    assert s3.uri("x") in msg and f"127.0.0.1:{port}" in msg and "cannot reach" in msg
    assert "AWS_ENDPOINT_URL" in msg


def test_access_denied_names_credentials_not_values(s3_auth_server, monkeypatch, tmp_path, engine):
    from _support.fixtures_servers import _aws_env

    key_id, secret = s3_auth_server.denied_key  # a real key of a user without permissions
    _aws_env(monkeypatch, s3_auth_server.endpoint, key_id, secret)
    with pytest.raises(SourceError) as e:
        fetch("s3://kt-locked/models/m", tmp_path / "d")
    msg = str(e.value)
    assert "s3://kt-locked/models/m" in msg and "access denied" in msg
    assert "AWS_ACCESS_KEY_ID" in msg and "AWS_PROFILE" in msg and "'env'" in msg  # where it looked, what it used
    assert secret not in msg and key_id not in msg

    _aws_env(monkeypatch, s3_auth_server.endpoint, "AKIAUNKNOWNKEY000000", "wrong-secret-value")  # unknown key
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SourceError, match="access denied to write it") as e2:
        push(tmp_path / "f.txt", "s3://kt-locked/x/")
    assert "wrong-secret-value" not in str(e2.value) and "AKIAUNKNOWNKEY000000" not in str(e2.value)


def test_no_credentials(s3, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SourceError) as e:
        fetch(s3.uri("m"), tmp_path / "d")
    assert "no usable AWS credentials" in str(e.value) and "AWS_ACCESS_KEY_ID" in str(e.value)


def test_auto_uploads_through_the_crt_client_when_awscrt_is_installed(s3, monkeypatch):
    from s3transfer.crt import CRTTransferManager
    from s3transfer.manager import TransferManager

    from kubetune.storage.s3_client import transfer_client

    monkeypatch.delenv(C.ENV_S3_TRANSFER_CLIENT, raising=False)
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert transfer_client() == "crt"  # the test extra installs kubetune[crt]
    with s3mod._transfer_manager() as tm:
        assert isinstance(tm, CRTTransferManager)
    monkeypatch.setenv(C.ENV_S3_TRANSFER_CLIENT, "classic")
    with s3mod._transfer_manager() as tm:
        assert isinstance(tm, TransferManager)
    monkeypatch.delenv(C.ENV_S3_TRANSFER_CLIENT)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the CRT client would not go through it: auto stays classic
    assert transfer_client() == "classic"
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # ...unless the endpoint is exempt
    assert transfer_client() == "crt"


def test_crt_asked_for_without_awscrt_names_the_extra(s3, monkeypatch, tmp_path):
    import sys

    from kubetune.storage.s3_client import transfer_client

    monkeypatch.setitem(sys.modules, "awscrt.s3", None)  # as if awscrt were not installed: importing it fails
    monkeypatch.delenv(C.ENV_S3_TRANSFER_CLIENT, raising=False)
    assert transfer_client() == "classic"  # auto falls back
    monkeypatch.setenv(C.ENV_S3_TRANSFER_CLIENT, "crt")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SourceError) as e:
        push(tmp_path / "f.txt", s3.uri("x/"))
    assert "KUBETUNE_S3_TRANSFER_CLIENT=crt" in str(e.value) and "kubetune[crt]" in e.value.hint


def test_unknown_transfer_client_is_one_error(s3, tmp_path):
    import subprocess
    import sys

    (tmp_path / "f.txt").write_text("x")
    env = {**os.environ, C.ENV_S3_TRANSFER_CLIENT: "fastest"}
    result = subprocess.run([sys.executable, "-m", "kubetune.cli", "push", str(tmp_path / "f.txt"), s3.uri("x/")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "KUBETUNE_S3_TRANSFER_CLIENT='fastest' is not one of auto, crt, classic" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Contents" not in s3.client.list_objects_v2(Bucket=s3.bucket)  # nothing was uploaded


def test_crt_connection_failures_name_the_endpoint(s3, tmp_path, fault_proxy, monkeypatch):
    proxy = fault_proxy(s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(C.ENV_S3_TRANSFER_CLIENT, "crt")
    proxy.fail(1000, "reset", when=lambda m, p: m == "PUT")  # the server accepts connections, then drops every upload
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SourceError) as e:
        push(tmp_path / "f.txt", s3.uri("x/"))
    assert f"cannot reach the S3 endpoint {proxy.url}" in str(e.value) and "AWS_ENDPOINT_URL" in e.value.hint
