"""http(s):// against a real threaded HTTP server on 127.0.0.1: Range resume, faults, sha256, cache, errors."""

from __future__ import annotations

import hashlib
import os
import tarfile
import time

import pytest
from kt_storage_util import make_tree, read_tree

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch
from kubetune.storage.fetcher import fetch_with_stats


def _ranges(server) -> list[str | None]:
    return [h.get("Range") for m, _, h in server.requests if m == "GET"]


def test_plain_download_to_dest(http_server, tmp_path):
    data = os.urandom(300_000)
    (http_server.root / "train.jsonl").write_bytes(data)
    out = fetch(f"{http_server.url}/train.jsonl", tmp_path / "d")
    assert out == tmp_path / "d" / "train.jsonl"
    assert out.read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["train.jsonl"]  # no partial/state files left


def test_interrupted_download_resumes_with_range(http_server, tmp_path):
    data = os.urandom(3_000_000)
    (http_server.root / "big.bin").write_bytes(data)
    # the first answer stops after 1 MB, the second after 1 more MB
    http_server.faults = [None, ("cut", 1_000_000), ("cut", 1_000_000)]
    out = fetch(f"{http_server.url}/big.bin", tmp_path / "d")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    ranges = _ranges(http_server)
    assert ranges == [None, "bytes=1000000-", "bytes=2000000-"]  # it asked only for what was missing
    ifr = [h.get("If-Range") for m, _, h in http_server.requests if m == "GET"][1:]
    assert all(v and v.startswith('"') for v in ifr)  # resumed against the ETag seen first


def test_resume_across_processes_from_partial_file(http_server, tmp_path):
    data = os.urandom(500_000)
    (http_server.root / "m.bin").write_bytes(data)
    dest = tmp_path / "d"
    dest.mkdir()
    # a killed earlier run left the first 200 kB (and its state file) behind
    http_server.faults = [None, ("cut", 200_000)] + ["500"] * 20
    with pytest.raises(SourceError, match="partial file is kept"):
        fetch(f"{http_server.url}/m.bin", dest)
    assert (dest / ("m.bin" + C.STORAGE_PART_SUFFIX)).stat().st_size == 200_000
    assert not (dest / "m.bin").exists()  # never a partial file under the real name

    http_server.faults, http_server.requests[:] = [], []
    _, stats = fetch_with_stats(f"{http_server.url}/m.bin", dest)
    assert (dest / "m.bin").read_bytes() == data
    assert _ranges(http_server) == ["bytes=200000-"]
    assert stats.bytes == 300_000


def test_changed_file_restarts_instead_of_mixing(http_server, tmp_path):
    (http_server.root / "f.bin").write_bytes(b"A" * 100_000)
    dest = tmp_path / "d"
    http_server.faults = [None, ("cut", 40_000)] + ["503"] * 20
    with pytest.raises(SourceError):
        fetch(f"{http_server.url}/f.bin", dest)
    (http_server.root / "f.bin").write_bytes(b"B" * 120_000)  # new version: new ETag
    http_server.faults = []
    out = fetch(f"{http_server.url}/f.bin", dest)
    assert out.read_bytes() == b"B" * 120_000


def test_server_ignoring_range_restarts_from_zero(http_server, tmp_path):
    data = os.urandom(400_000)
    (http_server.root / "x.bin").write_bytes(data)
    http_server.faults = [None, ("cut", 100_000), "norange"]
    out = fetch(f"{http_server.url}/x.bin", tmp_path / "d")
    assert out.read_bytes() == data


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset"])
def test_first_requests_fail_then_byte_exact(http_server, tmp_path, fault):
    data = os.urandom(200_000)
    (http_server.root / "d.bin").write_bytes(data)
    http_server.faults = [fault, fault, fault]  # HEAD and the first GETs fail
    out = fetch(f"{http_server.url}/d.bin", tmp_path / "d")
    assert out.read_bytes() == data
    assert len(http_server.requests) >= 4


def test_persistent_failure_gives_up_with_message(http_server, tmp_path):
    (http_server.root / "d.bin").write_bytes(b"x" * 10)
    http_server.faults = ["500"] * 100
    with pytest.raises(SourceError) as e:
        fetch(f"{http_server.url}/d.bin", tmp_path / "d")
    assert f"{http_server.url}/d.bin" in str(e.value) and "HTTP 500" in str(e.value)


def test_sha256_checked(http_server, tmp_path):
    data = b"hello world\n" * 1000
    (http_server.root / "h.txt").write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    assert fetch(f"{http_server.url}/h.txt", tmp_path / "ok", sha256=good).read_bytes() == data
    with pytest.raises(SourceError, match="sha256 mismatch"):
        fetch(f"{http_server.url}/h.txt", tmp_path / "bad", sha256="0" * 64)
    assert not (tmp_path / "bad" / "h.txt").exists()


def test_sha256_in_the_uri_fragment(http_server, tmp_path):
    # a job spec has no sha256 field: dataset.source: https://host/data.jsonl#sha256=HEX carries it
    data = b'{"text": "hi"}\n' * 100
    (http_server.root / "f.jsonl").write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    out = fetch(f"{http_server.url}/f.jsonl#sha256={good}", tmp_path / "ok")
    assert out.name == "f.jsonl" and out.read_bytes() == data
    with pytest.raises(SourceError, match="sha256 mismatch"):
        fetch(f"{http_server.url}/f.jsonl#sha256={'0' * 64}", tmp_path / "bad", use_cache=False)
    assert not (tmp_path / "bad" / "f.jsonl").exists()
    with pytest.raises(SourceError, match="only fragment kubetune reads"):
        fetch(f"{http_server.url}/f.jsonl#md5=abc", tmp_path / "frag")
    with pytest.raises(SourceError, match="disagree"):
        fetch(f"{http_server.url}/f.jsonl#sha256={good}", tmp_path / "two", sha256="1" * 64)


def test_sha256_fragment_in_a_job_spec_validates():
    from kubetune import load_spec

    uri = "https://data.example.com/capitals.jsonl#sha256=" + "a" * 64
    job = load_spec({"name": "frag", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": uri}})
    assert job.dataset.source == uri


def test_cache_by_etag(http_server):
    (http_server.root / "c.jsonl").write_bytes(b"v1\n")
    url = f"{http_server.url}/c.jsonl"
    p1, s1 = fetch_with_stats(url)
    p2, s2 = fetch_with_stats(url)
    assert p1 == p2 and s2.cached and not s1.cached
    assert [m for m, _, _ in http_server.requests].count("GET") == 1  # the hit only asked HEAD

    (http_server.root / "c.jsonl").write_bytes(b"version two\n")
    p3, s3_ = fetch_with_stats(url)
    assert not s3_.cached and p3.read_bytes() == b"version two\n"


def test_tarball_is_unpacked_and_single_folder_returned(http_server, tmp_path):
    files = {"config.json": b"{}", "model.safetensors": os.urandom(5000)}
    make_tree(tmp_path / "src" / "tiny", files)
    with tarfile.open(http_server.root / "tiny.tgz", "w:gz") as tf:
        tf.add(tmp_path / "src" / "tiny", arcname="tiny")
    out = fetch(f"{http_server.url}/tiny.tgz", tmp_path / "dest")
    assert out == tmp_path / "dest" / "tiny"
    assert read_tree(out) == files
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["tiny"]  # archive and scratch removed

    cached = fetch(f"{http_server.url}/tiny.tgz")  # into the cache, same shape
    assert cached.name == "tiny" and read_tree(cached) == files


def test_not_found_and_denied(http_server, tmp_path):
    with pytest.raises(SourceError) as e:
        fetch(f"{http_server.url}/missing.bin", tmp_path / "d")
    assert f"{http_server.url}/missing.bin: not found (HTTP 404)" in str(e.value)

    (http_server.root / "p.bin").write_bytes(b"private")
    http_server.auth = ("alice", "s3cr3t-pass")
    with pytest.raises(SourceError) as e:
        fetch(f"{http_server.url}/p.bin", tmp_path / "d")
    assert "access denied (HTTP 401)" in str(e.value) and ".netrc" in str(e.value)

    host = http_server.url.split("//", 1)[1]
    out = fetch(f"http://alice:s3cr3t-pass@{host}/p.bin", tmp_path / "d2")  # credentials in the URL work
    assert out.read_bytes() == b"private"


def test_netrc_gives_credentials_for_its_host_and_the_url_s_own_win(http_server, tmp_path, monkeypatch):
    """docs/storage.md: `~/.netrc` is read for http(s) sources (httpx 0.28 no longer does it by itself)."""
    (http_server.root / "p.bin").write_bytes(b"private")
    http_server.auth = ("alice", "s3cr3t-pass")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("NETRC", raising=False)
    netrc = home / ".netrc"
    netrc.write_text("machine 127.0.0.1 login alice password s3cr3t-pass\n")
    netrc.chmod(0o600)
    assert fetch(f"{http_server.url}/p.bin", tmp_path / "d").read_bytes() == b"private"

    host = http_server.url.split("//", 1)[1]
    with pytest.raises(SourceError, match="HTTP 401"):  # credentials in the URL win over the netrc entry
        fetch(f"http://alice:wrong@{host}/p.bin", tmp_path / "d2")

    other = tmp_path / "other-netrc"  # $NETRC names another file, as for curl
    other.write_text("machine example.org login bob password x\n")
    other.chmod(0o600)
    monkeypatch.setenv("NETRC", str(other))
    with pytest.raises(SourceError, match="HTTP 401"):  # no entry for this host: no credentials sent
        fetch(f"{http_server.url}/p.bin", tmp_path / "d3")


def test_unreachable(tmp_path):
    from _support.fixtures_servers import free_port

    url = f"http://127.0.0.1:{free_port()}/x.bin"
    with pytest.raises(SourceError) as e:
        fetch(url, tmp_path / "d")
    assert url in str(e.value) and "cannot reach" in str(e.value) and "HTTPS_PROXY" in str(e.value)


def test_refetch_into_same_dest_skips_unchanged(http_server, tmp_path):
    (http_server.root / "s.bin").write_bytes(b"x" * 5000)
    url = f"{http_server.url}/s.bin"
    fetch(url, tmp_path / "d")
    http_server.requests.clear()
    _, stats = fetch_with_stats(url, tmp_path / "d")
    assert stats.bytes == 0 and stats.skipped_bytes == 5000
    assert [m for m, _, _ in http_server.requests] == ["HEAD"]

    time.sleep(1.1)  # a new Last-Modified
    (http_server.root / "s.bin").write_bytes(b"y" * 5000)  # same size, new content
    out, stats = fetch_with_stats(url, tmp_path / "d")
    assert out.read_bytes() == b"y" * 5000 and stats.bytes == 5000
