"""The cost of running a job as a KFP local pipeline: `kubetune run --backend kfp --mode local` vs `--backend local`.

Both run the quickstart job (examples/quickstart.yaml: builtin tiny model, capitals.jsonl with a 10% eval
split, LoRA on the CPU) with the same settings. The baseline is kubetune's own local backend (one worker
process); the measured side builds the fetch -> train -> publish pipeline and runs it with the kfp SDK's
``kfp.local.SubprocessRunner(use_venv=False)``: a driver process, one subprocess per task (each imports
kubetune and the kfp executor again), KFP artifacts in the run directory. One untimed warm-up each, then
``--runs`` timed runs each, interleaved (baseline, kfp, baseline, ...), because the machine is shared and noisy.

Measured: wall time of the whole command (process start to exit), and the training loop's own time
(result.json ``train_seconds``), so the difference of the two is the pipeline's overhead, not training.

    .venv/bin/python bench/kfp_local.py                # 1 epoch, 3 runs each
    .venv/bin/python bench/kfp_local.py --write-docs   # record the result in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, median, write_section  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
KUBETUNE = [PY, "-m", "kubetune.cli"]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
SECTION = "## KFP local pipeline vs the local backend (bench/kfp_local.py)"


def run(out: Path, env: dict, backend: list[str], sets: list[str]) -> dict:
    """`kubetune run quickstart.yaml BACKEND --set ...` in a fresh output dir; wall time and result.json's numbers."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*KUBETUNE, "run", str(QUICKSTART), *backend, "--set", f"output.dir={out}", *(x for s in sets for x in ("--set", s))]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(backend)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    return {"wall": wall, "train_seconds": result["train_seconds"], "final_loss": result["final_loss"],
            "global_step": result["global_step"]}


def report(base: list[dict], measured: list[dict], *, epochs: float, runs: int, load: float) -> str:
    """The docs/benchmarks.md section for the timed runs of each side."""
    bw, kw = median([r["wall"] for r in base]), median([r["wall"] for r in measured])
    bt, kt = median([r["train_seconds"] for r in base]), median([r["train_seconds"] for r in measured])
    bo, ko = median([r["wall"] - r["train_seconds"] for r in base]), median([r["wall"] - r["train_seconds"] for r in measured])
    cmd = "python bench/kfp_local.py" + (f" --epochs {epochs:g}" if epochs != 1.0 else "") + (f" --runs {runs}" if runs != 3 else "") + " --write-docs"
    rows = "\n".join(f"| {i + 1} | {b['wall']:.1f} | {k['wall']:.1f} | {b['train_seconds']:.1f} | {k['train_seconds']:.1f} |"
                     for i, (b, k) in enumerate(zip(base, measured)))
    return f"""
The quickstart job (examples/quickstart.yaml, {epochs:g} epoch(s) = {base[0]['global_step']} steps) with
`kubetune run --backend kfp --mode local` (the fetch -> train -> publish pipeline on the kfp SDK's
SubprocessRunner: a driver process and one process per task, KFP artifacts in the run directory) against
the baseline `kubetune run --backend local` (one worker process). One untimed warm-up each, then {runs}
timed runs each, interleaved.

| | local backend (median) | KFP local pipeline (median) | ratio / difference |
|---|---|---|---|
| wall time, whole command | {bw:.1f} s | {kw:.1f} s | **{kw / bw:.2f}x** ({kw - bw:+.1f} s) |
| training loop (result.json train_seconds) | {bt:.1f} s | {kt:.1f} s | {kt / bt:.2f}x |
| outside the training loop (wall - train_seconds) | {bo:.1f} s | {ko:.1f} s | {ko - bo:+.1f} s |

Per run (seconds):

| run | local wall | kfp wall | local training | kfp training |
|---|---|---|---|---|
{rows}

Both sides train with the same code and settings (final train loss, median: local
{median([r['final_loss'] for r in base]):.4f}, kfp {median([r['final_loss'] for r in measured]):.4f}); the pipeline's own cost is the
time outside the training loop (a driver and one process per task, each importing kubetune and the kfp
executor, and the runner's artifact handling). {spread_text(base, measured, kw - bw)}

Command: `{cmd}`. Machine: {machine()}. 1-minute load average {load:.1f} at the end (about 1: the benchmark had the
machine to itself; much more: other work shared its 2 cores and single runs get noisy).
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs of each side (default 3)")
    p.add_argument("--epochs", type=float, default=1.0, help="training.epochs (default 1 keeps the run short)")
    p.add_argument("--write-docs", action="store_true", help="record the result in docs/benchmarks.md")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-kfp-"))
    env = {**os.environ, "KUBETUNE_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("KUBETUNE_DEBUG", None)
    sets = [f"training.epochs={a.epochs:g}"]
    local, kfp = ["--backend", "local"], ["--backend", "kfp", "--mode", "local"]
    base, measured = [], []
    try:
        print(f"warm-up (untimed): the builtin model, page cache, prepared data; {a.epochs:g} epoch(s) per run", flush=True)
        run(work / "warm-l", env, local, sets)
        run(work / "warm-k", env, kfp, sets)
        for i in range(a.runs):
            base.append(run(work / f"l{i}", env, local, sets))
            print(f"  run {i + 1}/{a.runs} local backend: {base[-1]['wall']:.1f}s wall, {base[-1]['train_seconds']:.1f}s training", flush=True)
            measured.append(run(work / f"k{i}", env, kfp, sets))
            print(f"  run {i + 1}/{a.runs} kfp local:     {measured[-1]['wall']:.1f}s wall, {measured[-1]['train_seconds']:.1f}s training", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    body = report(base, measured, epochs=a.epochs, runs=a.runs, load=os.getloadavg()[0])
    print(body)
    if a.write_docs:
        write_section(SECTION, body)
        print("recorded in docs/benchmarks.md")
    return 0


def spread_text(base: list[dict], measured: list[dict], diff: float) -> str:
    """Whether single runs varied less or more than the difference between the medians."""
    spread = max(max(r["wall"] for r in rs) - min(r["wall"] for r in rs) for rs in (base, measured))
    if spread < abs(diff):
        return (f"Single runs varied by at most {spread:.1f} s on either side, less than the {abs(diff):.1f} s difference, "
                "so the difference is the pipeline's fixed cost.")
    return (f"Single runs varied by up to {spread:.1f} s, more than the {abs(diff):.1f} s difference, so read the medians "
            "as a rough size of the fixed cost, not a precise one.")


if __name__ == "__main__":
    sys.exit(main())
