"""The llama-stack tests' helpers (tests/integrations, tests/server): a real ``llama stack run`` server started on
127.0.0.1 with the run config ``kubetune llama-stack config`` writes, polled through the official ``llama-stack-client``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .fixtures_servers import free_port, wait_for_child_http

REPO = Path(__file__).resolve().parents[2]
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"
LLAMA = Path(sys.executable).parent / "llama"  # llama-stack's CLI, installed by the test extra (kubetune[llama-stack])


def capitals(n: int, skip: int = 0) -> list[dict]:
    """``n`` rows of the quickstart's chat dataset (what a user registers from a local JSONL)."""
    with open(CAPITALS, encoding="utf-8") as f:
        return [json.loads(line) for line in f][skip:skip + n]


class LlamaStack:
    """``llama stack run`` as a child process, serving a config made by ``kubetune llama-stack config ARGS``."""

    def __init__(self, tmp: Path, *config_args: str) -> None:
        self.tmp, self.port = tmp, free_port()
        self.config = tmp / "run.yaml"
        self.log = tmp / "llama-stack.log"
        self.state = tmp / "kubetune-state"
        cmd = [sys.executable, "-m", "kubetune.cli", "llama-stack", "config", "--store-dir", str(tmp / "store"), "--state-dir", str(self.state),
               "--model", "tiny-chat=builtin://tiny-chat", "--port", str(self.port), "-o", str(self.config), *config_args]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, env: dict | None = None) -> "LlamaStack":
        """Start it and wait until its routes answer."""
        self.proc = subprocess.Popen([str(LLAMA), "stack", "run", str(self.config), "--port", str(self.port)], stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True)
        wait_for_child_http(self.proc, f"{self.url}/v1/health", self.log, what="llama stack run", timeout=120, interval=0.5)
        return self

    def stop(self) -> None:
        """Stop the server (its process group: the server and its workers)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_status(client, job_uuid: str, wanted: set[str], timeout: float = 300) -> object:
    """Poll ``post_training.job.status`` until the job's status is one of ``wanted``."""
    deadline = time.monotonic() + timeout
    st = None
    while time.monotonic() < deadline:
        st = client.post_training.job.status(job_uuid=job_uuid)
        if st.status in wanted:
            return st
        if st.status in {"completed", "failed", "cancelled"}:
            raise AssertionError(f"{job_uuid} ended {st.status}, not {wanted}: {st}")
        time.sleep(1)
    raise AssertionError(f"{job_uuid} still {st.status if st else None} after {timeout}s, not {wanted}")
