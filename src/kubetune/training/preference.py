"""Preference tuning (``method.objective: dpo | orpo``) through TRL's trainers: configs, trainers and metrics.

:func:`~.sft.run_sft` runs every objective (the same planning, checkpoints, resume, progress and outputs);
this module supplies what differs: :func:`preference_config` (TRL's ``DPOConfig`` or ``ORPOConfig`` from
the common training arguments), :func:`make_preference_trainer` and :func:`preference_metrics` for
``result.json``. The losses are TRL's own; nothing here computes one.

The data arrives tokenized by :mod:`kubetune.data.preference` (``prompt_ids``, ``chosen_ids``,
``rejected_ids``; the prompt never trained), so the trainers are given it as is: DPO's own tokenization is
skipped (its collator takes exactly these columns), and ORPO gets the rows in its tokenized layout.

The reference model (DPO): adapters (LoRA, QLoRA, DoRA) use the frozen base, that is the policy with its
adapter switched off (TRL copies a passed adapter as ``ref``; ours starts as the identity, so the copy is
dropped: one adapter to train, save and serve). A full fine-tune gets a frozen copy of ``method.dpo.reference``,
or of the base model when that is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import constants as C
from ..spec import TuneJob

__all__ = ["preference_config", "make_preference_trainer", "preference_metrics", "log_metrics"]

IGNORE = -100


def preference_config(job: TuneJob, common: dict) -> Any:
    """TRL's ``DPOConfig`` or ``ORPOConfig``: ``common`` (the training arguments every objective shares) plus the
    objective's settings from ``method.dpo`` / ``method.orpo``."""
    m = job.method
    if m.objective == "dpo":
        from trl import DPOConfig

        return DPOConfig(
            **common,
            beta=m.dpo.beta,
            loss_type=[m.dpo.loss_type],
            label_smoothing=m.dpo.label_smoothing,
            pad_to_multiple_of=None,
        )
    return _orpo().ORPOConfig(**common, beta=m.orpo.beta)


def make_preference_trainer(
    job: TuneJob, model: Any, args: Any, prepared: Any, tokenizer: Any, callbacks: list, *, model_path: Path, reference_path: Path | None
) -> Any:
    """The TRL trainer for the job's objective over the prepared pairs."""
    if job.method.objective == "dpo":
        ref = _reference_model(job, model, reference_path or model_path) if job.method.type == "full" else None
        trainer = _DPOTrainer()(
            model=model, ref_model=ref, args=args, train_dataset=prepared.train, eval_dataset=prepared.eval,
            processing_class=tokenizer, callbacks=callbacks,
        )  # fmt: skip
        peft_config = getattr(trainer.model, "peft_config", None)
        if isinstance(peft_config, dict) and "ref" in peft_config:  # the base (adapter off) is the reference
            trainer.model.delete_adapter("ref")
        return trainer
    return _ORPOTrainer()(
        model=model, args=args, train_dataset=_orpo_rows(prepared.train),
        eval_dataset=_orpo_rows(prepared.eval) if prepared.eval is not None else None,
        processing_class=tokenizer, callbacks=callbacks,
    )  # fmt: skip


def _reference_model(job: TuneJob, policy: Any, path: Path) -> Any:
    """The frozen reference for a full fine-tune, in the policy's dtype, on its device."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=policy.dtype, trust_remote_code=job.model.trust_remote_code,
        attn_implementation=policy.config._attn_implementation,
    )  # fmt: skip
    ref.eval()
    ref.requires_grad_(False)
    return ref.to(policy.device)


def _orpo() -> Any:
    """``trl.experimental.orpo`` (where TRL 1.x keeps ORPO), without its "experimental API" notice: kubetune pins
    the TRL versions it supports, so the notice is not the user's to act on."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*trl.experimental.*")
        from trl.experimental import orpo

    return orpo


def _DPOTrainer() -> type:  # noqa: N802 - a class, built on first use (trl is heavy)
    """TRL's DPOTrainer, given rows kubetune already tokenized (its collator's columns)."""
    from trl import DPOTrainer

    class KubetuneDPOTrainer(DPOTrainer):
        """DPOTrainer over pre-tokenized pairs: ``prompt_ids``, ``chosen_ids``, ``rejected_ids``."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            """The rows as they are: tokenized, with the prompt split off and fitted to the maximum length."""
            return dataset

    return KubetuneDPOTrainer


def _ORPOTrainer() -> type:  # noqa: N802 - a class, built on first use (trl is heavy)
    """TRL's ORPOTrainer (trl.experimental in TRL 1.x), given rows already in its tokenized layout."""
    class KubetuneORPOTrainer(_orpo().ORPOTrainer):
        """ORPOTrainer over pre-tokenized pairs; counts the tokens of both sequences of a pair."""

        def tokenize_row(self, feature, model=None):
            """The row as it is (:func:`_orpo_rows` laid it out)."""
            return feature

        def _track_num_input_tokens(self, inputs):
            """Tokens seen: both sequences of every pair (the batch has no ``input_ids`` for the Trainer to count)."""
            import torch

            n = inputs["chosen_attention_mask"].sum() + inputs["rejected_attention_mask"].sum()
            n = torch.as_tensor(n, device=self.args.device, dtype=torch.int64)
            self.state.num_input_tokens_seen += self.accelerator.gather(n).sum().item()

    return KubetuneORPOTrainer


def _orpo_rows(dataset: Any) -> Any:
    """Pairs in ORPO's layout: the prompt alone, and prompt + answer with the prompt masked out of the labels."""

    def layout(row: dict) -> dict:
        p, c, r = row["prompt_ids"], row["chosen_ids"], row["rejected_ids"]
        return {
            "prompt_input_ids": p, "prompt_attention_mask": [1] * len(p),
            "chosen_input_ids": p + c, "chosen_attention_mask": [1] * (len(p) + len(c)), "chosen_labels": [IGNORE] * len(p) + c,
            "rejected_input_ids": p + r, "rejected_attention_mask": [1] * (len(p) + len(r)), "rejected_labels": [IGNORE] * len(p) + r,
        }  # fmt: skip

    return dataset.map(layout, remove_columns=list(dataset.column_names))


def log_metrics(logs: dict, *, prefix: str = "") -> dict:
    """The preference metrics in a trainer log, under kubetune's names (``reward_accuracy``, ``reward_margin``,
    ``rewards_chosen``, ``rewards_rejected``, ``logps_chosen``, ``logps_rejected``; ``prefix`` ``eval_`` for
    evaluations). Empty for an SFT log."""
    out = {}
    for theirs, ours in C.PREFERENCE_LOG_KEYS.items():
        v = logs.get(prefix + theirs)
        if v is not None:
            out[prefix + ours] = round(float(v), 6)
    return out


def preference_metrics(job: TuneJob, log_history: list[dict]) -> dict:
    """``result.json``'s preference section: the objective's settings, the last training log's metrics and the
    last evaluation's."""
    m = job.method
    out: dict[str, Any] = {"objective": m.objective}
    if m.objective == "dpo":
        out.update(beta=m.dpo.beta, loss_type=m.dpo.loss_type, reference=m.dpo.reference or ("base model" if m.type == "full" else "base model (adapter off)"))
    else:
        out.update(beta=m.orpo.beta, reference=None)
    train = [log_metrics(e) for e in log_history if "loss" in e]
    evals = [log_metrics(e, prefix="eval_") for e in log_history if "eval_loss" in e]
    out["train"] = next((x for x in reversed(train) if x), {})
    out["eval"] = next((x for x in reversed(evals) if x), {})
    return out
