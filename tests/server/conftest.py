"""Fixtures of the jobs-service tests: the real ``kubetune server`` in a child process on 127.0.0.1 (so a test
can SIGKILL it), its database on SQLite or on a real PostgreSQL started here with initdb/pg_ctl, API keys made
by the real CLI, and the official ``openai`` client."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared helpers
from _support.fixtures_servers import free_port, wait_for_child_http  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"
PG_BIN = next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None)

# Few, fast steps on builtin://tiny-chat: a checkpoint at step 2 and at the end.
FAST = {"method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}},
        "training": {"max_seq_length": 128, "max_steps": 4, "save_steps": 2, "learning_rate": 3e-3}}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``kubetune ARGS`` in a child process (the real CLI, its real exit code)."""
    proc = subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubetune {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


class Server:
    """``kubetune server`` as a child process; ``url`` ends in /v1."""

    def __init__(self, tmp: Path, db: str, *, host: str = "127.0.0.1", **settings) -> None:
        self.tmp, self.db, self.host = tmp, db, host
        self.data = tmp / "data"
        self.config = tmp / "server.yaml"
        settings = {"data_dir": str(self.data), "poll_seconds": 0.5, "method_defaults": {"supervised": FAST}, **settings}
        self.config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "server.log"

    @property
    def url(self) -> str:
        """The API's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def key(self, project: str) -> str:
        """A new API key of ``project``, made with ``kubetune server keys create``."""
        return cli("server", "keys", "create", "--project", project, "--db", self.db).stdout.strip()

    def start(self) -> "Server":
        """Start the server and wait until it answers."""
        cmd = [sys.executable, "-m", "kubetune.cli", "server", "--port", str(self.port), "--db", self.db, "--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait_for_child_http(self.proc, f"http://127.0.0.1:{self.port}/health", self.log, what="kubetune server", timeout=60)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``signal.SIGKILL``: as a crash would); its jobs' workers run on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def openai(self, key: str | None):
        """The official client, no retries (a test sees the first answer)."""
        import openai

        return openai.OpenAI(base_url=self.url, api_key=key or "none", max_retries=0, timeout=120)

    def kill_workers(self) -> None:
        """End every worker this server's jobs started (they live in their own process groups)."""
        for status in self.data.glob("runs/*/status.json"):
            try:
                pid = json.loads(status.read_text()).get("pid")
            except (OSError, ValueError):
                continue
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL cluster of this session (initdb in a temp dir, listening on a free local port and a socket).

    PostgreSQL refuses to run as root: as root, the cluster is the ``postgres`` user's (Debian's package makes it).
    """
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (initdb/pg_ctl: Debian's postgresql package, `make test-deps`)")
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="kubetune-pg-"))  # not under pytest's root-only folder: postgres must reach it
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_user, f"{PG_BIN}/initdb", "-D", str(data), "-U", "kubetune", "--auth=trust", "-E", "UTF8"], check=True, capture_output=True)
    port = free_port()
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*as_user, f"{PG_BIN}/pg_ctl", "-D", str(data), "-o", opts, "-l", str(root / "pg.log"), "-w", "start"], check=True, capture_output=True)
    yield {"port": port, "host": "127.0.0.1"}
    subprocess.run([*as_user, f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'server.db'}"
    pg = request.getfixturevalue("postgres")
    import psycopg

    name = f"kt_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(host=pg["host"], port=pg["port"], user="kubetune", dbname="postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql://kubetune@{pg['host']}:{pg['port']}/{name}"


@pytest.fixture
def make_server(tmp_path, db_url):
    """Build servers on this test's database; each is stopped and its workers ended afterwards."""
    made: list[Server] = []

    def make(**settings) -> Server:
        server = Server(tmp_path, db_url, **settings)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
        server.kill_workers()


@pytest.fixture
def train_file(tmp_path) -> Path:
    """A small chat JSONL file (40 rows of the capitals dataset)."""
    out = tmp_path / "train.jsonl"
    out.write_text("".join(CAPITALS.read_text(encoding="utf-8").splitlines(keepends=True)[:40]), encoding="utf-8")
    return out


def wait_for(client, job_id: str, statuses: tuple[str, ...], timeout: float = 180):
    """Poll the job until its status is one of ``statuses``; the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {job.status} after {timeout} s")


def wait_for_step(client, job_id: str, step: int, timeout: float = 180) -> float:
    """Wait until the job's events report training step ``step`` or later; how long after the worker recorded
    that event the API first showed it (seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in client.fine_tuning.jobs.list_events(job_id, limit=100).data:
            if ev.type == "metrics" and (ev.data or {}).get("step", 0) >= step:
                return time.time() - ev.created_at
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach step {step} in {timeout} s")


__all__ = ["Server", "cli", "wait_for", "wait_for_step"]
