"""GPU LoRA throughput: kubetune vs TRL defaults on a randomly initialised Llama-3.2-1B-shaped model.

Needs one CUDA GPU; it refuses to run without one (exit 2) and is not part of the test suite or CI.
No download: the model is built from a Llama-3.2-1B-shaped config (16 layers, hidden 2048, MLP 8192, 32
heads / 8 KV heads, vocabulary 128256, tied embeddings) with random weights, saved once in bf16 to a work
directory; the tokenizer is the builtin tiny-chat one (its ids all fit the vocabulary). The data is a
generated mixed-length chat dataset. Both sides train LoRA r16/alpha32 on all linear layers, sequence
length 2048, packed, bf16, the same batch, learning rate and steps:

* kubetune: a job spec run by the kubetune worker (``training.packing: true``, ``model.dtype: bfloat16``,
  the lora preset: no gradient checkpointing), with ``--attn`` (default: the fastest available,
  flash_attention_2 when flash-attn is installed, else sdpa) and optionally ``--liger`` (Liger kernels:
  RMSNorm, RoPE, SwiGLU, fused linear cross-entropy, applied before the model is built).
* TRL defaults: SFTTrainer with a default SFTConfig except for what defines the task (max_length 2048,
  packing, bf16, batch, lr, steps, logging every step, no saving); so TRL's default gradient
  checkpointing and default attention stay on.

Reported per side (medians of ``--runs`` interleaved runs): tokens/s (non-padding tokens over the training
loop), MFU and peak GPU memory (torch.cuda.max_memory_allocated).

MFU = tokens/s x FLOPs per token / peak bf16 FLOP/s of the GPU, with
FLOPs per token = 4 N + 6 L s d: N counts the weights of every matmul (attention and MLP projections of
the L layers, plus the output head; embeddings are lookups). A LoRA step does the forward (2N) and the
backward to the activations (2N) but no weight gradients for the frozen base, hence 4N (6N for full
fine-tuning); LoRA's own FLOPs are negligible. 6 L s d is causal attention (QK^T and AV, forward and
backward) over the s = 2048 window, a slight overestimate when packed documents are shorter and the
kernel keeps attention within each. Recomputation from gradient checkpointing is not counted (model
FLOPs, not hardware FLOPs). Peak: --peak-tflops, else a table of dense bf16 peaks (H100/H200 SXM 989).
Anchors: NeMo AutoModel reports ~40% MFU for Llama-3.1-8B LoRA on one H100; Unsloth claims 2x HF speed.

    python bench/gpu_lora.py                       # 2 runs each, 40 steps, batch 4
    python bench/gpu_lora.py --liger --write-docs  # with Liger kernels; record in docs/benchmarks.md
    python bench/gpu_lora.py --cpu-smoke-test      # a tiny model on the CPU: checks this script's code paths only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, median, training_clock, write_section  # noqa: E402

SECTION = "## GPU LoRA: Llama-3.2-1B shape, kubetune vs TRL defaults (bench/gpu_lora.py)"
SECTION_LIGER = "## GPU LoRA with Liger kernels: Llama-3.2-1B shape, kubetune + Liger vs TRL defaults (bench/gpu_lora.py --liger)"

LLAMA_3_2_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    tie_word_embeddings=True,
    hidden_act="silu",
)
# A tiny model of the same architecture, only for --cpu-smoke-test.
SMOKE = dict(LLAMA_3_2_1B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=4096)

# Dense bf16 peak TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("H800", 989.4), ("A100", 312.0), ("L40S", 362.0), ("A10G", 125.0), ("L4", 121.0), ("B200", 2250.0)]

_WORDS = (
    "the capital river mountain city museum train market harbour festival bridge north south east west old new "
    "quiet busy green ancient modern station castle garden square library winter summer rain sun island coast "
    "valley forest lake road street tower church palace school bakery coffee walk visit travel history people"
).split()


def matmul_params(cfg: dict) -> int:
    """N: weights of every matmul per token (attention + MLP projections of all layers, and the output head)."""
    d, f, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * f
    return L * per_layer + d * V


def flops_per_token(cfg: dict, seq: int) -> float:
    """4 N + 6 L s d (see the module docstring)."""
    return 4 * matmul_params(cfg) + 6 * cfg["num_hidden_layers"] * seq * cfg["num_attention_heads"] * cfg["head_dim"]


def libraries() -> str:
    import importlib.metadata as md

    names = ["transformers", "trl", "peft", "accelerate"] + (["liger-kernel"] if importlib.util.find_spec("liger_kernel") else [])
    return ", ".join(f"{n} {md.version(n)}" for n in names)


def fastest_attention() -> str:
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"


def make_data(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(rows):
            n = min(1500, max(20, int(40 * rng.paretovariate(1.1))))  # mixed lengths, long-tailed
            text = " ".join(rng.choice(_WORDS) for _ in range(n))
            f.write(json.dumps({"messages": [{"role": "user", "content": "Write about a city."}, {"role": "assistant", "content": text}]}) + "\n")
    return path


def make_model(path: Path, cfg: dict, device: str) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from kubetune.training.builtin import materialize

    torch.manual_seed(0)
    config = LlamaConfig(**cfg, bos_token_id=None, eos_token_id=None)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(materialize("tiny-chat"))
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    del model
    return path


# --- one side, in its own process -------------------------------------------------------------
def side_kubetune(a) -> dict:
    import yaml

    spec = {
        "name": "gpu-lora",
        "model": {"source": str(a.model_dir), "dtype": "bfloat16", "attn_implementation": a.attn},
        "dataset": {"source": str(a.data), "eval_split": 0},
        "method": {"type": "lora", "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}},
        "training": {
            "max_steps": a.steps, "batch_size": a.batch_size, "learning_rate": 2e-4, "max_seq_length": a.seq,
            "packing": True, "save_steps": a.steps, "logging_steps": 1, "seed": 42,
        },
        "output": {"dir": str(a.out)},
        "resources": {"accelerators": 0 if a.cpu_smoke_test else 1},
    }  # fmt: skip
    if a.cpu_smoke_test:
        spec["model"]["dtype"] = "bfloat16"
    spec_file = Path(a.out).with_suffix(".yaml")
    spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    if a.liger:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()  # patches the Llama classes before the worker builds the model
    from kubetune.worker import main as worker_main

    rc = worker_main(["--spec", str(spec_file)])
    if rc != 0:
        raise SystemExit(f"kubetune worker failed ({rc}); see {a.out}/events.jsonl")
    r = json.loads((Path(a.out) / "result.json").read_text())
    return {"tokens": r["tokens"], "tokens_per_second": r["tokens_per_second"], "peak_memory_mb": r["peak_memory_mb"], "final_loss": r["final_loss"]}


def side_trl(a) -> dict:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer


    tok = AutoTokenizer.from_pretrained(a.model_dir)
    args = SFTConfig(
        output_dir=str(a.out),
        max_length=a.seq,
        packing=True,
        bf16=True,
        per_device_train_batch_size=a.batch_size,
        learning_rate=2e-4,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        include_num_input_tokens_seen="non_padding",
        seed=42,
        use_cpu=bool(a.cpu_smoke_test),
    )
    clock = training_clock()
    trainer = SFTTrainer(
        model=str(a.model_dir),
        args=args,
        train_dataset=load_dataset("json", data_files=str(a.data), split="train"),
        processing_class=tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[clock],
    )
    trainer.train()
    secs = clock.t1 - clock.t0
    tokens = int(trainer.state.num_input_tokens_seen)
    peak = round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"tokens": tokens, "tokens_per_second": round(tokens / secs, 1), "peak_memory_mb": peak, "final_loss": losses[-1]}


# --- the comparison ---------------------------------------------------------------------------
def run_side(side: str, a, work: Path, i: int, model_dir: Path, data: Path) -> dict:
    out = work / f"{side}-{i}"
    cmd = [sys.executable, __file__, "--side", side, "--model-dir", str(model_dir), "--data", str(data), "--out", str(out),
           "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--seq", str(a.seq), "--attn", a.attn]  # fmt: skip
    if a.liger:
        cmd.append("--liger")
    if a.cpu_smoke_test:
        cmd.append("--cpu-smoke-test")
    env = {**os.environ, "KUBETUNE_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{side} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    res = json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"tokens"')][-1])
    print(f"  {side} run {i + 1}: {res['tokens_per_second']} tokens/s, peak {res['peak_memory_mb']} MiB", flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each side, interleaved (default 2)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=4, help="sequences of --seq tokens per step (default 4)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--attn", default="fastest", help="kubetune's model.attn_implementation: fastest (default), flash_attention_2, sdpa, eager")
    p.add_argument("--liger", action="store_true", help="apply Liger kernels on the kubetune side (pip install liger-kernel)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: from a table by GPU name)")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one, removed at the end)")
    p.add_argument("--cpu-smoke-test", action="store_true", help="a tiny model on the CPU to check the script itself; measures nothing")
    p.add_argument("--write-docs", action="store_true", help="record the result in docs/benchmarks.md")
    # internal: one side in this process
    p.add_argument("--side", choices=["kubetune", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()

    import torch

    if not torch.cuda.is_available() and not a.cpu_smoke_test:
        print(
            "error: bench/gpu_lora.py needs a CUDA GPU (torch.cuda.is_available() is False here"
            + ("" if torch.version.cuda else f"; this torch {torch.__version__} has no CUDA support")
            + "). Run it on a machine with an NVIDIA GPU and a CUDA build of torch; it is not part of CI.",
            file=sys.stderr,
        )
        return 2
    if a.cpu_smoke_test and a.write_docs:
        print("error: --cpu-smoke-test measures nothing worth recording; drop --write-docs", file=sys.stderr)
        return 2
    if a.attn == "fastest":
        a.attn = "sdpa" if a.cpu_smoke_test else fastest_attention()
    if a.liger:
        if not importlib.util.find_spec("liger_kernel"):
            print("error: --liger needs the liger-kernel package: pip install liger-kernel", file=sys.stderr)
            return 2

    if a.side:  # a child: one side, one run
        res = side_kubetune(a) if a.side == "kubetune" else side_trl(a)
        print(json.dumps(res), flush=True)
        return 0

    cfg = SMOKE if a.cpu_smoke_test else LLAMA_3_2_1B
    if a.cpu_smoke_test:
        a.steps, a.seq, a.batch_size, a.runs = min(a.steps, 3), min(a.seq, 256), min(a.batch_size, 2), 1
    work = Path(a.work or tempfile.mkdtemp(prefix="kubetune-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(f"building the random {'smoke' if a.cpu_smoke_test else 'Llama-3.2-1B-shaped'} model and the data in {work}", flush=True)
        model_dir = make_model(work / "model", cfg, "cpu" if a.cpu_smoke_test else "cuda")
        rows = max(200, a.steps * a.batch_size * a.seq // 400 * 2)  # about twice the tokens the steps need
        data = make_data(work / "data.jsonl", rows)
        kt, trl = [], []
        for i in range(a.runs):  # interleaved
            trl.append(run_side("trl", a, work, i, model_dir, data))
            kt.append(run_side("kubetune", a, work, i, model_dir, data))
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = a.peak_tflops or next((v for k, v in PEAK_TFLOPS if k in name), None)
    fpt = flops_per_token(cfg, a.seq)

    def summary(rs):
        tps = median([r["tokens_per_second"] for r in rs])
        mfu = tps * fpt / (peak * 1e12) if peak else None
        mem = median([r["peak_memory_mb"] for r in rs]) if rs[0]["peak_memory_mb"] is not None else None
        return tps, mfu, mem

    (tt, tm, tmem), (kt_tps, km, kmem) = summary(trl), summary(kt)

    def pct(x):
        return f"{100 * x:.1f}%" if x is not None else "n/a (unknown peak: --peak-tflops)"

    def gib(x):
        return f"{x / 1024:.1f} GiB" if x is not None else "n/a"

    opts = f"attention {a.attn}" + (", Liger kernels" if a.liger else "")
    cmd = "python bench/gpu_lora.py" + (" --liger" if a.liger else "") + (f" --steps {a.steps}" if a.steps != 40 else "") + (f" --batch-size {a.batch_size}" if a.batch_size != 4 else "") + " --write-docs"
    body = f"""
LoRA r16/alpha32 on all linear layers of a randomly initialised Llama-3.2-1B-shaped model
(N = {matmul_params(cfg) / 1e9:.3f} B matmul weights), sequence length {a.seq}, packed, bf16, batch {a.batch_size},
{a.steps} steps, {a.runs} interleaved runs each. kubetune: {opts}, no gradient checkpointing (lora preset).
TRL: SFTTrainer defaults (gradient checkpointing on, default attention) plus max_length, packing, bf16,
batch, lr and steps. MFU = tokens/s x (4N + 6·L·s·d) / peak; peak {peak} TFLOP/s ({name}).

| | TRL defaults | kubetune | ratio |
|---|---|---|---|
| tokens/s (median) | {tt:.0f} | {kt_tps:.0f} | **{kt_tps / tt:.2f}x** |
| MFU | {pct(tm)} | {pct(km)} | |
| peak GPU memory | {gib(tmem)} | {gib(kmem)} | |

Anchors: NeMo AutoModel ~40% MFU for Llama-3.1-8B LoRA on one H100; Unsloth claims 2x HF speed.
Command: `{cmd}`. Machine: {machine()}. Libraries: {libraries()}.
"""
    print(body)
    if a.write_docs:
        write_section(SECTION_LIGER if a.liger else SECTION, body)
        print("recorded in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
