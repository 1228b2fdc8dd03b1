"""Helpers for the distributed tests: 2-process jobs through `kubetune run`, rank processes, fault injection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C

CAPITALS = Path(__file__).resolve().parents[2] / "examples" / "data" / "capitals.jsonl"
FAULT_DIR = Path(__file__).parent / "fault"  # sitecustomize.py: KT_FAULT_RANK / KT_FAULT_STEP / KT_FAULT
# One thread per process, as torchrun gives each rank: the 1-process baseline competes on equal terms.
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def dist_spec(out_dir: Path, *, procs: int, dropout: float = 0.0, **training) -> dict:
    """The tiny job with a global batch of 8 whatever the process count (4 per process, accumulation derived)."""
    return {
        "name": "tiny-dist",
        "model": {"source": "builtin://tiny-chat"},
        # 24 eval rows: 6 batches of 4, the same batches on 1 or 2 processes (an uneven last batch would be padded
        # with repeated rows on one rank, which moves the eval loss a little: docs/distributed.md)
        "dataset": {"source": str(CAPITALS), "eval_split": 0.08},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": dropout}},
        "training": {
            "max_steps": 4, "batch_size": 4, "global_batch_size": 8, "max_seq_length": 64, "save_steps": 2,
            "logging_steps": 1, "learning_rate": 3e-3, **training,
        },
        "resources": {"processes_per_node": procs},
        "output": {"dir": str(out_dir)},
    }


def write_spec(spec: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def cli_env(**extra: str) -> dict:
    return {**os.environ, **ENV, **extra}


def kubetune_run(spec_file: Path, *, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`kubetune run SPEC` in the foreground, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", "kubetune.cli", "run", str(spec_file)],
        capture_output=True, text=True, timeout=timeout, env=env or cli_env(),
    )


def fault_env(rank: int, step: int, mode: str) -> dict:
    """Environment that makes rank ``rank`` raise (mode raise) or hang (mode hang) from optimizer step ``step``."""
    path = os.pathsep.join([str(FAULT_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return cli_env(PYTHONPATH=path, KT_FAULT_RANK=str(rank), KT_FAULT_STEP=str(step), KT_FAULT=mode)


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / C.STATUS_FILE).read_text())


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / C.RESULT_FILE).read_text())


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / C.EVENTS_FILE).read_text().splitlines() if line.strip()]


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{global rank: pid} of the worker processes that the launcher with pid ``launcher_pid`` started."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(
                kv.split("=", 1) for kv in (entry / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in kv
            )
        except OSError:
            continue
        if env.get(C.ENV_LAUNCHER_PID) == str(launcher_pid) and "RANK" in env and int(entry.name) != launcher_pid:
            out[int(env["RANK"])] = int(entry.name)
    return out


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the job ended before {what} (exit {proc.returncode}):\n{out[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"no {what} within {timeout:.0f}s")


@pytest.fixture(scope="package")
def two_process_run(tmp_path_factory):
    """A 2-process run through `kubetune run` (the reference of the parity and resume tests)."""
    tmp = tmp_path_factory.mktemp("two-process")
    run_dir = tmp / "run"
    proc = kubetune_run(write_spec(dist_spec(run_dir, procs=2), tmp / "spec.yaml"))
    return proc, run_dir
