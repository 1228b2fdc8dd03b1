"""The same job on a busy machine: kubetune's CPU thread choice against torch's default (every core).

A one-epoch run of the quickstart (builtin://tiny-chat, LoRA, 270 rows) is trained while ``--busy N`` other
processes keep N cores busy (pure-Python spin loops, what another job or a test suite does to a shared
machine). Two configurations, interleaved round by round, each run a fresh process:

- ``torch default`` (the baseline): ``OMP_NUM_THREADS`` set to the core count, which is torch's own default and
  what ``kubetune run`` used before it chose: every core, busy or not;
- ``kubetune's choice``: no ``training.cpu_threads`` and no ``OMP_NUM_THREADS``, so the worker takes the free
  cores (cores minus those busy with other work, within the cgroup quota; docs/training.md#cpu-threads).

Reported: the medians of the training loop's wall time and tokens/s (from result.json), the whole command's
wall time, the threads each run used, and the ratio. Nothing is asserted; ``--write-docs`` records the table in
docs/benchmarks.md.

    python bench/busy_cpu.py [--busy 3] [--rounds 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, median, write_section  # noqa: E402

SECTION = "## CPU threads on a busy machine (bench/busy_cpu.py)"


def _spin(stop) -> None:  # one busy core
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def run_once(out: Path, threads: int | None, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(KUBETUNE_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "kubetune.cli", "run", str(REPO / "examples" / "quickstart.yaml"),
           "--set", "training.epochs=1", "--set", f"output.dir={out}", "--set", "output.merge=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    res = json.loads((out / "result.json").read_text())
    m = res.get("metrics", res)
    shutil.rmtree(out, ignore_errors=True)
    return {"train_s": m["train_seconds"], "tps": m["tokens_per_second"], "wall_s": wall, "threads": m.get("cpu_threads")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes beside the job (default: one per core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    configs = [(f"torch default ({cores} threads, the baseline)", cores), ("kubetune's choice (free cores)", None)]

    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    time.sleep(60)  # let the 1-minute load average see the busy cores, as it would on a machine that was busy already
    results: dict[str, list[dict]] = {name: [] for name, _ in configs}
    loads: list[float] = []
    started = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="kubetune-busy-") as tmp:
            work, home = Path(tmp), Path(tmp) / "home"
            for r in range(args.rounds):
                order = configs if r % 2 == 0 else configs[::-1]
                for name, threads in order:
                    loads.append(os.getloadavg()[0])
                    res = run_once(work / f"run-{r}-{threads}", threads, home)
                    results[name].append(res)
                    print(f"round {r + 1}/{args.rounds} {name:<40} train {res['train_s']:7.2f}s  {res['tps']:8.1f} tokens/s  "
                          f"wall {res['wall_s']:6.1f}s  threads {res['threads']}  load {loads[-1]:.1f}", flush=True)
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)
    minutes = (time.time() - started) / 60

    rows = ["| configuration | threads | training loop (s) | tokens/s | whole command (s) |", "|---|---|---|---|---|"]
    med = {}
    for name, _ in configs:
        rs = results[name]
        med[name] = {k: median([x[k] for x in rs]) for k in ("train_s", "tps", "wall_s")}
        threads = sorted({x["threads"] for x in rs if x["threads"] is not None})
        rows.append(f"| {name} | {', '.join(map(str, threads)) or '?'} | {med[name]['train_s']:.1f} | {med[name]['tps']:.0f} | {med[name]['wall_s']:.1f} |")
    base, ours = configs[0][0], configs[1][0]
    ratio = med[ours]["tps"] / med[base]["tps"]
    table = "\n".join(rows)
    print(f"\n{table}\n\nkubetune's choice / torch default tokens/s: {ratio:.2f}x")
    if args.write_docs:
        cmd = f"python bench/busy_cpu.py --busy {args.busy} --rounds {args.rounds}"
        write_section(SECTION, f"""
Command: `{cmd}` (add `--write-docs` to record). Machine: {machine()}; {args.busy} busy process(es) spinning beside the job;
the 1-minute load average when each run started: {min(loads):.1f} to {max(loads):.1f} (other work on the machine included). {args.rounds} rounds, interleaved; medians; {minutes:.0f} minutes.

The job: the quickstart for one epoch (`--set training.epochs=1`, 34 steps). Baseline: `OMP_NUM_THREADS={cores}`,
torch's default of one thread per core, which `kubetune run` used before it chose from the free cores.

{table}

**kubetune's choice / torch default, training tokens/s: {ratio:.2f}x.** With every core already busy, torch's
OpenMP threads wait for each other on oversubscribed cores; kubetune takes the cores that are free (at least one)
and says so in the run's first line (`using N of M CPU threads: busy cores ...`).
""")


if __name__ == "__main__":
    main()
