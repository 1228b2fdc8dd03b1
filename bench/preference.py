"""Preference tuning throughput: kubetune DPO's tokens/s vs a bare TRL DPOTrainer script with the same settings.

Same work on both sides: the builtin tiny model, a generated conversational preference file (arithmetic
questions; the chosen answer polite and right, the rejected one curt and wrong; 256 pairs, seeded), LoRA r16 /
alpha 32 on all linear layers with the frozen base as the reference, beta 0.1, the sigmoid loss, batch 8, lr
5e-4 with a cosine schedule and no warm-up, max length 128, seed 42, fp32 on the CPU, ``--steps`` steps, no
evaluation and one save at the end: through `kubetune run` and through bench/_trl_dpo_baseline.py. Target:
kubetune >= 0.95x the baseline's tokens/s.

Both count non-padding input tokens (prompt + chosen and prompt + rejected) from the trainer's first hook to
its last loss log. One untimed warm-up per side, then ``--runs`` runs each, interleaved, medians reported.

    python bench/preference.py                # 5 runs each, 30 steps
    python bench/preference.py --write-docs   # record the result in docs/benchmarks.md
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
from _common import REPO, machine, median, write_section  # noqa: E402
from overhead import LOAD0, PY, bench_env, builtin_model_dir, interleave, run_baseline, run_kubetune  # noqa: E402

SECTION = "## Preference tuning: kubetune DPO vs bare TRL DPOTrainer (bench/preference.py)"
DPO_BASELINE = [PY, str(REPO / "bench" / "_trl_dpo_baseline.py")]


def pairs(path: Path, rows: int = 256, seed: int = 3) -> Path:
    """Conversational prompt / chosen / rejected rows, the shape both sides read as it is."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(rows):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            q = [{"role": "user", "content": f"What is {a} plus {b}? Answer in one sentence."}]
            good = [{"role": "assistant", "content": f"Sure! {a} plus {b} is {a + b}, happy to help."}]
            bad = [{"role": "assistant", "content": f"No. It is {a + b + rng.randint(1, 99)}."}]
            f.write(json.dumps({"prompt": q, "chosen": good, "rejected": bad}) + "\n")
    return path


def spec(path: Path, data: Path, steps: int) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": "bench-dpo",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(data), "cache": False},
        "method": {"type": "lora", "objective": "dpo", "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
                   "dpo": {"beta": 0.1, "loss_type": "sigmoid"}},
        "training": {"max_steps": steps, "batch_size": 8, "learning_rate": 5e-4, "lr_scheduler": "cosine", "warmup_ratio": 0.0,
                     "max_seq_length": 128, "seed": 42, "save_steps": steps, "logging_steps": 1},
    }))  # fmt: skip
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each side (default 5: single runs vary a lot on a shared machine)")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides (OMP_NUM_THREADS; default 1: steadier on a shared machine)")
    p.add_argument("--write-docs", action="store_true", help="record the result in docs/benchmarks.md")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-preference-"))
    env = bench_env(work / "home", a.threads)
    try:
        data = pairs(work / "pairs.jsonl")
        job = spec(work / "dpo.yaml", data, a.steps)
        base_args = ["--model", builtin_model_dir(env), "--data", str(data), "--max-steps", str(a.steps)]

        def baseline(out: Path) -> dict:
            import overhead

            saved, overhead.BASELINE = overhead.BASELINE, DPO_BASELINE
            try:
                return run_baseline(out, env, base_args)
            finally:
                overhead.BASELINE = saved

        print(f"DPO, {a.steps} steps, {a.runs} runs each (after one warm-up each)")
        baseline(work / "wb")
        run_kubetune(work / "wk", env, [], spec=job)
        base, kt = interleave(a.runs, lambda i: baseline(work / f"b{i}"), lambda i: run_kubetune(work / f"k{i}", env, [], spec=job))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def tps(rs):
        return median([r["tokens_per_second"] for r in rs])

    ratio = tps(kt) / tps(base)
    verdict = "meets" if ratio >= 0.95 else "MISSES"
    load1 = os.getloadavg()[0]
    cmd = "python bench/preference.py" + (f" --steps {a.steps}" if a.steps != 30 else "") + (f" --runs {a.runs}" if a.runs != 5 else "") + (f" --threads {a.threads}" if a.threads != 1 else "") + " --write-docs"
    lines = [
        f"The same work: DPO with LoRA (r16, alpha 32, all linear layers; the frozen base as the reference; beta 0.1,",
        f"sigmoid loss) on the builtin tiny model, 256 generated conversational pairs, batch 8, lr 5e-4 cosine, max",
        f"length 128, seed 42, fp32 on the CPU with OMP_NUM_THREADS={a.threads}, {a.steps} steps, no evaluation, one save at",
        "the end: `kubetune run` (method.objective dpo) against bench/_trl_dpo_baseline.py (bare TRL DPOTrainer with",
        f"peft_config). {a.runs} runs each after one warm-up each, interleaved. Tokens/s counts non-padding input tokens",
        "(prompt + chosen and prompt + rejected) over the training loop on both sides.",
        "",
        "| | bare TRL DPOTrainer | kubetune DPO | ratio |",
        "|---|---|---|---|",
        f"| tokens/s (median) | {tps(base):.1f} | {tps(kt):.1f} | **{ratio:.3f}** (target >= 0.95: {verdict}) |",
        f"| tokens/s per run | {', '.join(str(r['tokens_per_second']) for r in base)} | {', '.join(str(r['tokens_per_second']) for r in kt)} | |",
        f"| tokens per run | {base[0]['tokens']} | {kt[0]['tokens']} | |",
        "",
        f"Command: `{cmd}`. Machine: {machine()}. 1-minute load average {LOAD0:.1f} when it started and {load1:.1f}",
        "at the end; the machine is shared (2 cores, other people's jobs), so single runs vary and the ratio of",
        "medians is the number to read.",
        "",
        "Differences in the work itself: kubetune tokenizes the pairs with its own chat-template renderer (the prompt",
        "ends with the assistant header, as at inference), TRL with `apply_chat_template`; the prompt tokens are the",
        "template's generation prompt on both sides (tests/data/test_preference.py checks it). Both shuffle with seed 42, but the order of the rows differs (kubetune shuffles while preparing),",
        "so the tokens per run differ slightly.",
    ]
    body = "\n".join(lines)
    print(body)
    if a.write_docs:
        write_section(SECTION, body)
        print("recorded in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
