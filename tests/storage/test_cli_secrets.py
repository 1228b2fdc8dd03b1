"""The fetch/push CLI, and credentials: never in messages, logs, events, the cache or the CLI's output."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from kt_storage_util import make_tree, read_tree
from typer.testing import CliRunner

from kubetune import constants as C
from kubetune.errors import KubetuneError
from kubetune.storage import OutputSync, fetch, push, redact


@pytest.fixture
def app() -> typer.Typer:
    from kubetune.cli.storage import register

    a = typer.Typer()
    register(a)
    return a


def test_cli_push_and_fetch_with_summary(app, s3, tmp_path):
    files = {"config.json": b"{}", "w.bin": os.urandom(50_000)}
    src = make_tree(tmp_path / "m", files)
    runner = CliRunner()
    r = runner.invoke(app, ["push", str(src), s3.uri("cli/m"), "--annotation", "owner=team-a", "-q"])
    assert r.exit_code == 0, r.output
    assert f"pushed {src} -> {s3.uri('cli/m')}: 48.8 KiB in 2 file(s)" in r.stderr and "/s" in r.stderr
    head = s3.client.head_object(Bucket=s3.bucket, Key="cli/m/config.json")
    assert head["Metadata"]["owner"] == "team-a"

    r = runner.invoke(app, ["fetch", s3.uri("cli/m"), str(tmp_path / "d"), "-q"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(tmp_path / "d")
    assert f"fetched {s3.uri('cli/m')} -> {tmp_path / 'd'}: 48.8 KiB in 2 file(s)" in r.stderr
    assert read_tree(tmp_path / "d") == files

    r = runner.invoke(app, ["push", str(src), s3.uri("cli/x"), "--annotation", "novalue"])
    assert isinstance(r.exception, KubetuneError) and "expected KEY=VALUE" in str(r.exception)


def test_cli_user_error_is_one_message_exit_2(s3, tmp_path):
    env = {**os.environ}
    r = subprocess.run([sys.executable, "-m", "kubetune.cli", "fetch", "s3://kt-no-such-bucket-cli/m", str(tmp_path / "d"), "-q"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "s3://kt-no-such-bucket-cli/m: bucket 'kt-no-such-bucket-cli' does not exist" in r.stderr
    assert s3.secret not in r.stderr + r.stdout


def test_redact():
    assert redact("https://user:pa55@host/x?X-Amz-Signature=abc&X-Amz-Credential=AKIA1/2&v=1") == \
        "https://***@host/x?X-Amz-Signature=***&X-Amz-Credential=***&v=1"  # the user name too: it may be a token
    assert redact("s3://bucket/key") == "s3://bucket/key"
    assert redact("/plain/path") == "/plain/path"


def test_credentials_never_appear(s3, http_server, oci_auth_registry, tmp_path, monkeypatch, caplog, capfd, kubetune_home):
    caplog.set_level(logging.DEBUG, logger="kubetune")
    secrets_ = {
        "aws": s3.secret,
        "session": "kt-session-token-0123456789",
        "http": "kt-http-pass-9876",
        "sig": "KTSIGNATURE0123456789",
        "registry": oci_auth_registry.password,
        "hf": "hf_ktSECRETtoken0000",
    }
    monkeypatch.setenv("AWS_SESSION_TOKEN", secrets_["session"])
    monkeypatch.setenv(C.ENV_HF_TOKEN, secrets_["hf"])
    monkeypatch.setenv(C.ENV_REGISTRY_USERNAME, oci_auth_registry.user)
    monkeypatch.setenv(C.ENV_REGISTRY_PASSWORD, secrets_["registry"])
    http_server.auth = ("alice", secrets_["http"])
    (http_server.root / "d.jsonl").write_bytes(b'{"a": 1}\n')
    host = http_server.url.split("//", 1)[1]
    messages: list[str] = []
    events: list[dict] = []

    def attempt(fn, *a, **k):
        try:
            return fn(*a, **k)
        except KubetuneError as e:
            messages.append(str(e))

    src = make_tree(tmp_path / "m", {"adapter_config.json": b"{}", "adapter_model.safetensors": b"\0" * 100})
    attempt(push, src, s3.uri("s/m"))
    attempt(fetch, s3.uri("s/m"))  # into the cache
    attempt(fetch, f"http://alice:{secrets_['http']}@{host}/d.jsonl")
    attempt(fetch, f"http://alice:{secrets_['http']}@{host}/d.jsonl?X-Amz-Signature={secrets_['sig']}")
    attempt(fetch, f"http://alice:wrong-{secrets_['http']}@{host}/d.jsonl", tmp_path / "x")  # denied
    attempt(fetch, f"http://alice:{secrets_['http']}@{host}/missing?token={secrets_['sig']}", tmp_path / "y")  # 404
    attempt(push, src, f"oci://{oci_auth_registry.host}/sec/a:v1")
    attempt(fetch, f"oci://{oci_auth_registry.host}/sec/a:v1")
    monkeypatch.setenv(C.ENV_REGISTRY_PASSWORD, "wrong-" + secrets_["registry"])
    attempt(fetch, f"oci://{oci_auth_registry.host}/sec/a:v2", tmp_path / "z")  # denied
    attempt(fetch, "hf://org/not-cached-model", tmp_path / "h")  # offline, not cached
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{__import__('_support.fixtures_servers', fromlist=['_']).free_port()}")
    sync = OutputSync(s3.uri("s/out"), emit=events.append)
    ck = make_tree(tmp_path / "run" / "checkpoints" / "checkpoint-1", {"a.bin": b"1", C.CHECKPOINT_COMPLETE: b""})
    sync.checkpoint_saved(ck)
    sync.close(30)
    assert len(messages) >= 4 and len(events) == 1, messages  # the failures happened and were reported

    out, err = capfd.readouterr()
    cache_text = "".join(p.read_text(errors="replace") for p in Path(kubetune_home).rglob("*.json") if p.is_file())
    names = " ".join(str(p) for p in Path(kubetune_home).rglob("*"))
    haystack = "\n".join(messages + [str(e) for e in events] + sync.errors + [caplog.text, out, err, cache_text, names])
    for what, value in secrets_.items():
        assert value not in haystack, f"{what} credential leaked"
    assert any(f"http://***@{host}/d.jsonl" in m for m in messages)  # redacted, not dropped: the user still sees which URL
    assert not any("alice" in m for m in messages)  # the user name is masked too (it may be a token)
    assert any("token=***" in m for m in messages)
