"""Packing is exact: a packed batch gives every row the loss it has when run alone, on the attention
implementations we train with (no attention across rows, positions restarting per row)."""

from __future__ import annotations

import random

import pytest

from kubetune.data.packing import plan_bins

from .conftest import IGNORE, write_rows


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = "the capital of france is paris and the capital of peru is lima what is it tell me".split()
    out = []
    for _ in range(n):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))
        a = " ".join(rng.choice(words) for _ in range(rng.randint(1, 25)))
        out.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    return out


def test_best_fit_decreasing_respects_capacity_and_places_every_row_once():
    rng = random.Random(1)
    lengths = [rng.randint(1, 100) for _ in range(500)]
    bins = plan_bins(lengths, 128)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert len(bins) <= sum(lengths) / 128 * 1.1 + 1  # close to the lower bound


def test_packed_dataset_holds_the_same_rows(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", _rows(60))
    plain = prepare(src, training={"max_seq_length": 96})
    packed = prepare(src, training={"max_seq_length": 96, "packing": True})
    assert set(packed.train.column_names) == {"input_ids", "labels", "seq_lengths"}
    assert len(packed.train) < len(plain.train)
    assert packed.stats["packed_sequences"] == len(packed.train) and 0 < packed.stats["packing_efficiency"] <= 1
    pieces = []
    for seq in packed.train:
        assert sum(seq["seq_lengths"]) == len(seq["input_ids"]) == len(seq["labels"]) <= 96
        start = 0
        for n in seq["seq_lengths"]:
            pieces.append((tuple(seq["input_ids"][start : start + n]), tuple(seq["labels"][start : start + n])))
            start += n
    assert sorted(pieces) == sorted((tuple(r["input_ids"]), tuple(r["labels"])) for r in plain.train)


def _per_row_losses(logits, labels, bounds):
    import torch.nn.functional as F

    shift_logits, shift_labels = logits[0, :-1], labels[0, 1:]
    tok_loss = F.cross_entropy(shift_logits.float(), shift_labels, ignore_index=IGNORE, reduction="none")
    out = []
    for a, b in bounds:  # row tokens [a, b): their targets are positions a+1..b-1, predicted from a..b-2
        sel = slice(a, b - 1)
        mask = shift_labels[sel] != IGNORE
        out.append((tok_loss[sel][mask].sum() / mask.sum()).item())
    return out


def _single_losses(model, rows, device):
    import torch

    out = []
    for r in rows:
        ids = torch.tensor([r["input_ids"]], device=device)
        labels = torch.tensor([r["labels"]], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        out.append(_per_row_losses(logits, labels, [(0, ids.shape[1])])[0])
    return out


def _attn_params():
    import importlib.util

    import torch

    params = [pytest.param("cpu", "sdpa"), pytest.param("cpu", "eager")]
    gpu = torch.cuda.is_available()
    for impl in ("sdpa", "eager", "flash_attention_2"):
        ok = gpu and (impl != "flash_attention_2" or importlib.util.find_spec("flash_attn") is not None)
        params.append(pytest.param("cuda", impl, marks=pytest.mark.skipif(not ok, reason=f"needs a GPU{' and flash-attn' if impl.startswith('flash') else ''}")))
    return params


@pytest.mark.parametrize("device,attn", _attn_params())
def test_packing_is_exact(tmp_path, prepare, tiny_model, device, attn):
    """Per-row losses from a packed batch equal those of the rows run one by one."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    dtype = torch.bfloat16 if attn == "flash_attention_2" else torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
    src = write_rows(tmp_path / "rows.jsonl", _rows(24, seed=7))
    packed = prepare(src, training={"max_seq_length": 128, "packing": True})
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn, dtype=dtype).to(device).eval()
    # The trainer's own collator for packed rows (training.packing -> TRL's padding-free collator).
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    checked = 0
    for seq in packed.train.select(range(min(4, len(packed.train)))):
        batch = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in collator([dict(seq)]).items()}
        assert "attention_mask" not in batch  # rows are kept apart by position_ids, not by padding
        bounds, start = [], 0
        for n in seq["seq_lengths"]:
            bounds.append((start, start + n))
            start += n
        assert [int(batch["position_ids"][0, a]) for a, _ in bounds] == [0] * len(bounds)  # positions restart per row
        labels = batch.pop("labels")
        with torch.no_grad():
            # use_cache=False as SFTTrainer.compute_loss passes it: transformers detects packed rows from
            # position_ids only without a KV cache (with one, rows would see each other).
            logits = model(**batch, use_cache=False).logits
        packed_losses = _per_row_losses(logits, labels, bounds)
        rows = [{"input_ids": seq["input_ids"][a:b], "labels": seq["labels"][a:b]} for a, b in bounds]
        single = _single_losses(model, rows, device)
        assert packed_losses == pytest.approx(single, abs=tol, rel=0), attn
        if len(bounds) > 1:
            # The check has teeth: the same tokens as one plain causal sequence give different losses.
            with torch.no_grad():
                naive = model(input_ids=batch["input_ids"]).logits
            naive_losses = _per_row_losses(naive, labels, bounds)
            assert max(abs(x - y) for x, y in zip(naive_losses[1:], single[1:])) > 1e-3
            checked += 1
    assert checked >= 2


def test_training_with_packing_runs_end_to_end(tiny_job, tmp_path):
    """A job with training.packing trains through the worker (TRL's padding-free collator)."""
    from kubetune.events import RunDir
    from kubetune.spec import load_spec
    from kubetune.worker import run_worker

    job = load_spec(tiny_job(training={"packing": True, "max_steps": 2, "save_steps": 2, "batch_size": 2}))
    assert run_worker(job) == 0
    result = RunDir(job.output_dir).read_result()
    assert result["data"]["packed_sequences"] < result["data"]["rows"]
    assert result["train_loss"] > 0
