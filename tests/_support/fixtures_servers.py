"""Real servers on 127.0.0.1 for storage tests (and any test that needs one): S3, OCI registry, HTTP.

Import the fixtures into a conftest.py::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the tests/ folder
    from fixtures_servers import *  # noqa: F401,F403

Fixtures:
    s3_server      (session) moto's ThreadedMotoServer; ``.endpoint``
    s3             (function) AWS_* env pointing at s3_server, a fresh bucket; ``.client``, ``.bucket``, ``.uri(key)``
    s3_auth_server (session) a moto_server process that enforces IAM: ``.endpoint``, ``.denied_key`` (no permissions)
    oci_registry   (session) Debian's docker-registry, anonymous; ``.host``
    oci_auth_registry (session) the same with htpasswd auth; ``.host``, ``.user``, ``.password``
    http_server    (function) a threaded file server with Range/If-Range, ETags, Basic auth, a required query
                   token (``.query``) and fault injection
    fault_proxy    (function) factory: ``fault_proxy(upstream_url)`` -> FaultProxy in front of any HTTP server

The one stand-in here is FaultProxy's injected failure itself; every request it passes reaches the real server.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.client
import http.server
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qsl, urlsplit

import pytest

__all__ = [
    "free_port", "wait_for_http", "S3Server", "s3_server", "s3", "s3_auth_server", "oci_registry",
    "oci_auth_registry", "http_server", "fault_proxy", "FileServer", "FaultProxy", "DOCKER_REGISTRY",
]

DOCKER_REGISTRY = shutil.which("docker-registry") or ("/usr/bin/docker-registry" if os.path.exists("/usr/bin/docker-registry") else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, timeout: float = 30.0, ok=(200, 401)) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status in ok:
                    return
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return
            last = e
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up: {last}")


def wait_for_child_http(proc, url: str, log, *, what: str, timeout: float, interval: float = 0.2) -> None:
    """Poll ``url`` until it answers 200 while the child ``proc`` runs. An AssertionError with the end of its
    ``log`` file when it exits first or does not answer within ``timeout`` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise AssertionError(f"{what} did not start:\n{log.read_text()[-5000:]}")


# --- S3 ------------------------------------------------------------------------------------------
@dataclass
class S3Server:
    endpoint: str
    denied_key: tuple[str, str] | None = None


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on a free loopback port, for the whole session."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    wait_for_http(endpoint + "/moto-api/", ok=(200,))
    yield S3Server(endpoint)
    server.stop()


@dataclass
class S3Env:
    endpoint: str
    bucket: str
    client: object
    secret: str = ""

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


def _aws_env(monkeypatch, endpoint: str, key_id: str, secret: str) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def s3(s3_server, monkeypatch):
    """AWS_* variables aimed at the session's moto server (distinct secret values) and a fresh bucket."""
    import boto3

    secret = "kt-secret-" + secrets.token_hex(8)
    _aws_env(monkeypatch, s3_server.endpoint, "AKIAKUBETUNETEST" + secrets.token_hex(2).upper(), secret)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")
    bucket = "kt-" + secrets.token_hex(6)
    client.create_bucket(Bucket=bucket)
    return S3Env(s3_server.endpoint, bucket, client, secret)


@pytest.fixture(scope="session")
def s3_auth_server(tmp_path_factory):
    """A moto_server process that enforces IAM, with bucket ``kt-locked`` and a user that may do nothing."""
    import boto3

    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # the first 3 requests set the user up
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                     aws_secret_access_key="setup").create_bucket(Bucket="kt-locked")
        yield S3Server(endpoint, denied_key=(key["AccessKeyId"], key["SecretAccessKey"]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- OCI registry ------------------------------------------------------------------------------------
@dataclass
class OciRegistry:
    host: str
    user: str = ""
    password: str = ""


def _start_registry(root: Path, htpasswd: Path | None = None):
    if not DOCKER_REGISTRY:
        pytest.skip("docker-registry is not installed (run `make test-deps`: Debian package docker-registry)")
    port = free_port()
    auth = f"auth:\n  htpasswd:\n    realm: kubetune-test\n    path: {htpasswd}\n" if htpasswd else ""
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n" + auth,
        encoding="utf-8",
    )
    proc = subprocess.Popen([DOCKER_REGISTRY, "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=open(root / "registry.log", "wb"))
    try:
        wait_for_http(f"http://127.0.0.1:{port}/v2/")
    except RuntimeError:
        proc.terminate()
        raise
    return proc, f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory):
    """Debian's docker-registry (distribution) on a free loopback port, storing under a temp dir."""
    proc, host = _start_registry(tmp_path_factory.mktemp("registry"))
    yield OciRegistry(host)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def oci_auth_registry(tmp_path_factory):
    """The same registry requiring a user name and password (htpasswd, bcrypt)."""
    import bcrypt

    root = tmp_path_factory.mktemp("registry-auth")
    user, password = "kubetune", "kt-regpass-" + secrets.token_hex(8)
    htpasswd = root / "htpasswd"
    htpasswd.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
    proc, host = _start_registry(root, htpasswd)
    yield OciRegistry(host, user, password)
    proc.terminate()
    proc.wait(timeout=10)


# --- HTTP file server ----------------------------------------------------------------------------
@dataclass
class FileServer:
    """A threaded static file server. ``faults`` is a list consumed one item per request:

    ``"500"``/``"503"``/``"429"`` answer that status; ``"reset"`` resets the connection before answering;
    ``("cut", n)`` sends headers and n bytes of the body, then closes; ``"norange"`` ignores Range.
    """

    root: Path
    url: str
    faults: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # (method, path, headers dict)
    auth: tuple[str, str] | None = None
    query: dict[str, str] = field(default_factory=dict)  # parameters every request must carry (a token in the URL)
    etags: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_fault(self):
        with self.lock:
            return self.faults.pop(0) if self.faults else None


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def _make_file_handler(state: FileServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._serve(head=True)

        def do_GET(self):
            self._serve(head=False)

        def _serve(self, head: bool):
            state.requests.append((self.command, self.path, dict(self.headers)))
            fault = state.next_fault()
            if fault == "reset":
                self.close_connection = True
                _reset(self.connection)
                return
            if fault in ("500", "503", "429"):
                body = b"injected failure"
                self.send_response(int(fault))
                self.send_header("Content-Length", str(len(body)))
                if fault != "500":
                    self.send_header("Retry-After", "0")
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                return
            if state.auth:
                want = "Basic " + base64.b64encode(f"{state.auth[0]}:{state.auth[1]}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            given = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
            if any(given.get(k) != v for k, v in state.query.items()):
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path = state.root / self.path.split("?", 1)[0].lstrip("/")
            if not path.is_file():
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = path.read_bytes()
            st = path.stat()
            etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
            start, status = 0, 200
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if rng and fault != "norange" and (if_range is None or if_range == etag):
                start = int(rng.split("=", 1)[1].split("-", 1)[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            body = data[start:]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            if state.etags:
                self.send_header("ETag", etag)
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            if isinstance(fault, tuple) and fault[0] == "cut":
                self.wfile.write(body[: fault[1]])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_WR)  # a clean close mid-body: exactly n bytes arrive
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def http_server(tmp_path):
    """Serves ``server.root`` (a temp dir) at ``server.url``; see FileServer for fault injection."""
    root = tmp_path / "www"
    root.mkdir()
    port = free_port()
    state = FileServer(root, f"http://127.0.0.1:{port}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _make_file_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# --- fault-injecting proxy ---------------------------------------------------------------------------
class FaultProxy:
    """An HTTP/1.1 reverse proxy to ``upstream`` that fails chosen requests on purpose.

    ``fail(n, kind, when)`` makes the next ``n`` requests matching ``when(method, path)`` fail: ``"500"``
    (an S3-style InternalError), ``"503"`` (SlowDown, throttling), ``"reset"`` (connection reset before
    any answer), ``"cut"`` (the real answer's headers and half its body, then a reset), ``"flip"`` (the real
    answer, full length, with one bit of its body flipped: corruption in transit) or ``"slow"`` (forwarded
    after ``slow_seconds``). Everything else
    is forwarded unchanged, Host header included (so registries build their Location URLs through us).
    """

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port or 80)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.host = f"127.0.0.1:{self.port}"
        self.rules: list[list] = []  # [remaining, kind, when]
        self.seen: list[tuple[str, str]] = []
        self.injected: list[tuple[str, str, str]] = []
        self.slow_seconds = 1.0
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def fail(self, n: int, kind: str = "500", when: Callable[[str, str], bool] | None = None) -> None:
        with self.lock:
            self.rules.append([n, kind, when or (lambda m, p: True)])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _pick(self, method: str, path: str) -> str | None:
        with self.lock:
            self.seen.append((method, path))
            for rule in self.rules:
                if rule[0] > 0 and rule[2](method, path):
                    rule[0] -= 1
                    self.injected.append((rule[1], method, path))
                    return rule[1]
        return None

    def _handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _any(self):
                body = self._body()
                kind = proxy._pick(self.command, self.path)
                if kind == "reset":
                    self.close_connection = True
                    _reset(self.connection)
                    return
                if kind == "slow":
                    time.sleep(proxy.slow_seconds)
                if kind in ("500", "503"):
                    code = "InternalError" if kind == "500" else "SlowDown"
                    payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                               f"<Message>injected by FaultProxy</Message></Error>").encode()
                    self.send_response(int(kind))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection", "content-length")}
                if body or self.command in ("PUT", "POST", "PATCH"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
                if self.command == "HEAD":
                    return
                if kind == "cut" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    _reset(self.connection)
                    return
                if kind == "flip" and data and 200 <= resp.status < 300:
                    i = len(data) // 2
                    data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        return Handler


@pytest.fixture
def fault_proxy():
    """Factory: ``fault_proxy("http://127.0.0.1:PORT")`` -> a FaultProxy (closed after the test)."""
    made: list[FaultProxy] = []

    def make(upstream: str) -> FaultProxy:
        p = FaultProxy(upstream)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
