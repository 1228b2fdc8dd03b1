"""The baseline of the training benchmarks: a bare TRL SFTTrainer script, no kubetune in the training path.

It trains what a kubetune job trains, with the same settings spelled out by hand: the builtin tiny model
(``kubetune.training.builtin.materialize('tiny-chat')``, used only to find the model directory), the same
JSONL data and evaluation split size, the same LoRA config (r, alpha, dropout, all-linear,
modules_to_save kept tied), loss on the answers only, batch size, learning rate and schedule, optimizer,
steps, max length, seed, logging/eval/save intervals, on the CPU. It is what a user would write without
kubetune.

It prints one JSON line at the end: tokens (non-padding input tokens), train_seconds (from the trainer's
first step hook to its last log, measured the way kubetune's progress callback measures), tokens/s,
final loss, eval loss, steps.

    python bench/_trl_baseline.py --data examples/data/capitals.jsonl --out /tmp/base --epochs 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

T0 = time.time()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import training_clock  # noqa: E402  (bench/_common.py: no kubetune import)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="JSONL of chat rows ({'messages': [...]})")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--epochs", type=float, default=20.0)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--eval-split", type=float, default=0.1)
    p.add_argument("--save-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--modules-to-save", default="embed_tokens", help="comma-separated; '' for none")
    p.add_argument("--model", default="builtin:tiny-chat", help="model directory (default: the builtin tiny model)")
    a = p.parse_args(argv)

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if a.model.startswith("builtin:"):
        from kubetune.training.builtin import materialize  # only to locate the generated model directory

        model_dir = str(materialize(a.model.split(":", 1)[1]))
    else:
        model_dir = a.model

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    data = load_dataset("json", data_files=a.data, split="train")
    # The loss on the answers only, as kubetune's default (dataset.train_on_inputs: false): TRL does that for
    # conversational prompt/completion rows (completion_only_loss); on plain `messages` it would train on every
    # token (assistant_only_loss needs {% generation %} markers this chat template lacks).
    data = data.map(lambda r: {"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}, remove_columns=data.column_names)
    if a.eval_split:
        n_eval = max(1, int(round(len(data) * a.eval_split)))
        split = data.train_test_split(test_size=n_eval, seed=a.seed)
        train, evald = split["train"], split["test"]
    else:
        train, evald = data, None

    samples = len(train)
    steps_per_epoch = math.ceil(samples / a.batch_size)
    max_steps = a.max_steps if a.max_steps > 0 else max(1, math.ceil(a.epochs * steps_per_epoch))

    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mts = [m for m in a.modules_to_save.split(",") if m]
    lora = LoraConfig(
        r=a.r,
        lora_alpha=a.alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        modules_to_save=mts or None,
        task_type="CAUSAL_LM",
        **({"ensure_weight_tying": True} if mts and "ensure_weight_tying" in LoraConfig.__dataclass_fields__ else {}),
    )
    args = SFTConfig(
        output_dir=os.path.join(a.out, "checkpoints"),
        per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=a.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=a.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=a.seed,
        data_seed=a.seed,
        max_steps=max_steps,
        logging_steps=1,
        eval_strategy="steps" if evald is not None else "no",
        eval_steps=a.save_steps,
        save_strategy="steps",
        save_steps=a.save_steps,
        save_total_limit=2,
        gradient_checkpointing=False,  # TRL's default is True; the kubetune lora preset says false
        use_cpu=True,
        # TRL's SFTConfig defaults to bf16=True, i.e. bf16 autocast even on a CPU; kubetune (model.dtype auto)
        # trains in fp32 on a CPU, so the baseline does too.
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        report_to="none",
        max_length=a.max_length,
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
    )


    clock = training_clock()
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=evald, processing_class=tokenizer, peft_config=lora, callbacks=[clock])
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    eval_loss = None
    if evald is not None:
        eval_loss = evals[-1]["eval_loss"] if evals and evals[-1]["step"] == trainer.state.global_step else trainer.evaluate()["eval_loss"]
    trainer.save_model(os.path.join(a.out, "adapter"))
    tokenizer.save_pretrained(os.path.join(a.out, "adapter"))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    secs = (clock.t1 or time.time()) - (clock.t0 or T0)
    tokens = int(trainer.state.num_input_tokens_seen)
    print(
        json.dumps(
            {
                "tokens": tokens,
                "train_seconds": round(secs, 3),
                "tokens_per_second": round(tokens / secs, 1) if secs > 0 else None,
                "final_loss": losses[-1] if losses else None,
                "eval_loss": eval_loss,
                "global_step": trainer.state.global_step,
                "samples": samples,
                "in_process_seconds": round(time.time() - T0, 3),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
