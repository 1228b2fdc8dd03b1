"""Shared by the benchmark scripts: recording a result section in docs/benchmarks.md, medians, machine facts.

Each benchmark owns one ``## Title (bench/NAME.py)`` section of docs/benchmarks.md and replaces only that
section, so benchmarks can be rerun in any order without touching each other's results.
"""

from __future__ import annotations

import fcntl
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Measured results and the command that produced each. Every benchmark compares kubetune with a named\n"
    "baseline in the same run (ratios of medians), so the numbers are comparable on the machine that ran them.\n"
    "Rerun one with its command; it replaces only its own section.\n"
)


def write_section(section: str, body: str) -> None:
    """Replace (or append) ``section`` (a ``## ...`` heading line) with ``body`` in docs/benchmarks.md."""
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    lock = DOCS.with_name(".benchmarks.md.lock")
    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)  # several benchmarks may finish at once
        text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else HEADER
        block = f"{section}\n\n{body.strip()}\n"
        if section in text:
            start = text.index(section)
            nxt = text.find("\n## ", start + len(section))
            text = text[:start] + block + (text[nxt:] if nxt >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + block
        tmp = DOCS.with_name(".benchmarks.md.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, DOCS)


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    """One line about the machine a result was measured on (CPU model, cores, GPU, torch version)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = "no GPU"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            gpu = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import torch

        tv = f"torch {torch.__version__}"
    except ImportError:
        tv = "no torch"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, Python {sys.version.split()[0]}, {tv}"


def training_clock():
    """A TrainerCallback that times training the way kubetune's progress callback does: from the trainer's first
    hook (``t0``) to its last loss log (``t1``). transformers loads only when this is called."""
    import time

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        t0 = t1 = None

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.t1 = time.time()

    return Clock()
