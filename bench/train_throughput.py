"""Training throughput: kubetune's tokens/s vs a bare TRL SFTTrainer script, and packing vs unpacked TRL.

Part 1, same work: the quickstart settings (builtin tiny model, examples/data/capitals.jsonl, LoRA r16 on all
linear layers + tied embeddings, batch 8, lr 3e-3, max length 256, seed 42, CPU) for ``--steps`` steps,
through `kubetune run` and through bench/_trl_baseline.py. Target: kubetune >= 0.95x the baseline's tokens/s.

Part 2, packing: a generated mixed-length chat dataset (answers from one sentence to a few hundred
tokens, seeded) with ``training.packing: true`` in kubetune against the same data unpacked (padded
batches) in the bare TRL script: the ratio of non-padding tokens/s.

Both count non-padding input tokens from the trainer's first hook to its last loss log. One untimed warm-up
per side, then ``--runs`` runs each, interleaved (baseline, kubetune, ...), medians reported.

    .venv/bin/python bench/train_throughput.py                # 5 runs each, 30 steps
    .venv/bin/python bench/train_throughput.py --write-docs   # record the result in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402
from overhead import CAPITALS, LOAD0, TOKENS_NOTE, bench_env, builtin_model_dir, interleave, run_baseline, run_kubetune  # noqa: E402

SECTION = "## Training throughput: kubetune vs bare TRL, and packing (bench/train_throughput.py)"

_FACTS = [
    "{c} is the capital of {k}.",
    "The government of {k} sits in {c}.",
    "Many visitors to {k} start their trip in {c}.",
    "{c} is also the largest city of {k} by some measures.",
    "Maps of {k} mark {c} with a star.",
]
_PLACES = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("India", "New Delhi")]


def mixed_length_data(path: Path, rows: int = 400, seed: int = 7) -> Path:
    """Chat rows whose answers range from one sentence to dozens (long-tailed), as real SFT data does."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(rows):
            k, c = rng.choice(_PLACES)
            n = min(40, max(1, int(rng.paretovariate(1.2))))  # mostly short, a few long
            answer = " ".join(rng.choice(_FACTS).format(k=k, c=c) for _ in range(n))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Tell me about the capital of {k}."}, {"role": "assistant", "content": answer}]}) + "\n")
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each side per comparison (default 5)")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    p.add_argument("--skip-packing", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides (OMP_NUM_THREADS; default 1: steadier on a shared machine; 0: each side's own default: torch's for the bare script, the free cores for kubetune)")
    p.add_argument("--write-docs", action="store_true", help="record the result in docs/benchmarks.md")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-throughput-"))
    env = bench_env(work / "home", a.threads)
    steps = a.steps
    # No evaluation and one save at the end: the measured loop is training steps only, on both sides.
    k_same = [f"training.max_steps={steps}", "dataset.eval_split=0", f"training.save_steps={steps}"]
    try:
        b_same = ["--model", builtin_model_dir(env), "--data", str(CAPITALS), "--max-steps", str(steps), "--eval-split", "0", "--save-steps", str(steps)]
        print(f"part 1: same work, {steps} steps, {a.runs} runs each (after one warm-up each)")
        run_baseline(work / "wb", env, b_same)
        run_kubetune(work / "wk", env, k_same)
        base, kt = interleave(a.runs, lambda i: run_baseline(work / f"b{i}", env, b_same), lambda i: run_kubetune(work / f"k{i}", env, k_same))
        packed = None
        if not a.skip_packing:
            data = mixed_length_data(work / "mixed.jsonl")
            k_pack = [f"dataset.source={data}", "training.packing=true", *k_same]
            b_pad = [*b_same[:2], "--data", str(data), *b_same[4:]]
            print(f"part 2: packing on a mixed-length dataset ({data}), {a.runs} runs each")
            run_baseline(work / "wpb", env, b_pad)
            run_kubetune(work / "wpk", env, k_pack)
            packed = interleave(a.runs, lambda i: run_baseline(work / f"pb{i}", env, b_pad), lambda i: run_kubetune(work / f"pk{i}", env, k_pack))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def tps(rs):
        return median([r["tokens_per_second"] for r in rs])

    threads = f"OMP_NUM_THREADS={a.threads}" if a.threads else "its own default thread count (torch's: every core; kubetune's: the free cores)"
    ratio = tps(kt) / tps(base)
    verdict = "meets" if ratio >= 0.95 else "MISSES"
    lines = [
        f"Part 1, the same work: the quickstart settings for {steps} steps (no evaluation, one save at the end) through",
        "`kubetune run` and through bench/_trl_baseline.py (bare TRL SFTTrainer, same model, data, LoRA config, batch,",
        f"lr, schedule, max length, seed), both with {threads}. {a.runs} runs each after one warm-up each, interleaved.",
        "Tokens/s counts non-padding input tokens over the training loop on both sides.",
        "",
        "| | bare TRL | kubetune | ratio |",
        "|---|---|---|---|",
        f"| tokens/s (median) | {tps(base):.1f} | {tps(kt):.1f} | **{ratio:.3f}** (target >= 0.95: {verdict}) |",
        f"| tokens/s per run | {', '.join(str(r['tokens_per_second']) for r in base)} | {', '.join(str(r['tokens_per_second']) for r in kt)} | |",
        f"| tokens per run | {base[0]['tokens']} | {kt[0]['tokens']} | |",
    ]
    if packed:
        pb, pk = packed
        pr = tps(pk) / tps(pb)
        lines += [
            "",
            f"Part 2, packing: a generated mixed-length chat dataset (400 rows, answers of 1 to 40 sentences, long-tailed),",
            f"max length 256, batch 8, {steps} steps: kubetune with `training.packing: true` (rows packed into full",
            "256-token sequences, attention kept within each row) against the bare TRL script unpacked (each batch",
            "padded to its longest row). Both count non-padding tokens.",
            "",
            "| | bare TRL, unpacked | kubetune, packed | ratio |",
            "|---|---|---|---|",
            f"| tokens/s (median) | {tps(pb):.1f} | {tps(pk):.1f} | **{pr:.2f}x** |",
            f"| tokens/s per run | {', '.join(str(r['tokens_per_second']) for r in pb)} | {', '.join(str(r['tokens_per_second']) for r in pk)} | |",
            f"| tokens per run ({steps} steps) | {pb[0]['tokens']} | {pk[0]['tokens']} | |",
        ]
    cmd = "python bench/train_throughput.py" + (f" --steps {steps}" if steps != 30 else "") + (f" --runs {a.runs}" if a.runs != 5 else "") + (f" --threads {a.threads}" if a.threads != 1 else "") + " --write-docs"
    lines += [
        "",
        f"Command: `{cmd}`. Machine: {machine()}. 1-minute load average {LOAD0:.1f} when it started and "
        f"{os.getloadavg()[0]:.1f} at the end (about 1: the benchmark had the machine to itself).",
    ]
    lines += [
        "",
        "What part 1 found: kubetune used to rewrite `status.json` (write + rename) at every training step. On this",
        "machine's ext4, mounted with `discard`, each rename over the old file frees its blocks with a synchronous",
        "discard, so the training thread slept in the kernel a few times a second and woke on the other core with",
        "cold caches (`perf stat`: 7 CPU migrations/s and 34 context switches/s for the kubetune worker against 0",
        "and 3/s for the bare script; every operator ran 20-40% slower, most runs: 0.917 was recorded). Progress",
        "now folds into `status.json` at most once a second (events.jsonl still gets every step at once); the",
        "worker then migrates 0 times in the same window.",
    ]
    body = "\n".join(lines)
    body += "\n" + TOKENS_NOTE
    print(body)
    if a.write_docs:
        write_section(SECTION, body)
        print("recorded in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
