"""Helpers for the training-engine tests: run a job in this process or as a worker subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C


def small(tiny_job, **sections):
    """tiny_job with even smaller defaults: 4 steps of 4 rows of at most 64 tokens, no dropout."""
    base = {
        "training": {"max_steps": 4, "batch_size": 4, "max_seq_length": 64, "save_steps": 2, "learning_rate": 3e-3},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged = {**base[key], **value}
            if key == "method" and "lora" in value:
                merged["lora"] = {**base["method"]["lora"], **value["lora"]}
            base[key] = merged
        else:
            base[key] = value
    return tiny_job(**base)


@pytest.fixture
def run_inprocess():
    """Run a spec dict through the worker in this process; returns (exit code, run dir, result or None)."""
    from kubetune.spec import load_spec
    from kubetune.worker import run_worker

    def run(spec: dict):
        job = load_spec(spec)
        old = signal.getsignal(signal.SIGTERM)
        try:
            rc = run_worker(job)
        finally:
            signal.signal(signal.SIGTERM, old)
        run_dir = job.output_dir
        result = json.loads((run_dir / C.RESULT_FILE).read_text()) if (run_dir / C.RESULT_FILE).is_file() else None
        return rc, run_dir, result

    return run


def write_spec(spec: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def worker_command(spec_file: Path) -> list[str]:
    return [sys.executable, "-m", "kubetune.worker", "--spec", str(spec_file)]


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / C.EVENTS_FILE).read_text().splitlines() if line.strip()]


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / C.STATUS_FILE).read_text())


def run_worker_subprocess(spec_file: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(worker_command(spec_file), capture_output=True, text=True, timeout=timeout)
