"""The baseline of bench/preference.py: a bare TRL DPOTrainer script, no kubetune in the training path.

It trains what a kubetune DPO job with LoRA trains, with the settings spelled out by hand: the builtin tiny model
(``kubetune.training.builtin.materialize('tiny-chat')``, used only to find the model directory), a conversational
preference JSONL (prompt / chosen / rejected message lists), LoRA r16/alpha32 on all linear layers given to the
trainer as ``peft_config`` (the frozen base is the reference), beta 0.1 and the sigmoid loss, batch size,
learning rate and schedule, optimizer, steps, max length and seed, in fp32 on the CPU. It is what a user would
write without kubetune.

It prints one JSON line at the end: tokens (non-padding input tokens), train_seconds (from the trainer's first
hook to its last log, measured the way kubetune's progress callback measures), tokens/s, final loss, steps.

    python bench/_trl_dpo_baseline.py --data pairs.jsonl --out /tmp/base --max-steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.time()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import training_clock  # noqa: E402  (bench/_common.py: no kubetune import)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="JSONL of conversational preference rows")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--model", default="builtin:tiny-chat", help="model directory (default: the builtin tiny model)")
    a = p.parse_args(argv)

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    if a.model.startswith("builtin:"):
        from kubetune.training.builtin import materialize  # only to locate the generated model directory

        model_dir = str(materialize(a.model.split(":", 1)[1]))
    else:
        model_dir = a.model

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train = load_dataset("json", data_files=a.data, split="train")
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    args = DPOConfig(
        output_dir=os.path.join(a.out, "checkpoints"),
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=a.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=a.seed,
        data_seed=a.seed,
        max_steps=a.max_steps,
        logging_steps=1,
        eval_strategy="no",
        save_strategy="steps",
        save_steps=a.max_steps,
        gradient_checkpointing=False,  # DPOConfig's default is True; kubetune's lora preset says false
        use_cpu=True,
        bf16=False,  # DPOConfig defaults to bf16 autocast; kubetune trains in fp32 on a CPU
        fp16=False,
        disable_tqdm=True,
        report_to="none",
        max_length=a.max_length,
        beta=a.beta,
        loss_type=["sigmoid"],
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
    )
    clock = training_clock()
    trainer = DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer, peft_config=lora, callbacks=[clock])
    trainer.train()
    trainer.save_model(os.path.join(a.out, "adapter"))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    accs = [e["rewards/accuracies"] for e in trainer.state.log_history if "rewards/accuracies" in e]
    secs = (clock.t1 or time.time()) - (clock.t0 or T0)
    tokens = int(trainer.state.num_input_tokens_seen)
    print(json.dumps({
        "tokens": tokens, "train_seconds": round(secs, 3), "tokens_per_second": round(tokens / secs, 1) if secs > 0 else None,
        "final_loss": losses[-1] if losses else None, "reward_accuracy": accs[-1] if accs else None,
        "global_step": trainer.state.global_step, "in_process_seconds": round(time.time() - T0, 3),
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
