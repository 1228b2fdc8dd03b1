"""Preference tuning end to end on the builtin tiny model: DPO and ORPO learn a preference they can show on
held-out pairs, QLoRA + DPO runs on the CPU, a full fine-tune takes an explicit reference, and resume, merge and
chat work on the result as for SFT."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from kubetune import constants as C
from kubetune.spec import load_spec

from .conftest import events, run_worker_subprocess, status, write_spec


def _pairs(path, n, seed):
    """Arithmetic questions; the chosen answer always opens politely ("Sure!"), the rejected one curtly ("No.")
    and gets the sum wrong: a rule the model can learn and show on pairs it never saw."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a, b = rng.randint(1, 60), rng.randint(1, 60)
            q = [{"role": "user", "content": f"What is {a} plus {b}?"}]
            f.write(json.dumps({"prompt": q, "chosen": f"Sure! {a} plus {b} is {a + b}.", "rejected": f"No. {a} plus {b} is {a + b + rng.randint(1, 9)}."}) + "\n")
    return path


@pytest.fixture
def pref_job(tmp_path):
    train, held_out = _pairs(tmp_path / "train.jsonl", 96, seed=1), _pairs(tmp_path / "held_out.jsonl", 24, seed=2)

    def make(objective="dpo", method=None, training=None, **sections):
        spec = {
            "name": f"pref-{objective}",
            "model": {"source": "builtin://tiny-chat"},
            "dataset": {"source": str(train), "eval_source": str(held_out), "cache": False},
            "method": {"type": "lora", "objective": objective, "lora": {"r": 8, "alpha": 16}, **(method or {})},
            "training": {"max_steps": 24, "batch_size": 8, "max_seq_length": 64, "learning_rate": 2e-3, "eval_steps": 4,
                         "save_steps": 12, "logging_steps": 4, **(training or {})},  # fmt: skip
            "output": {"dir": str(tmp_path / f"run-{objective}")},
            **sections,
        }
        return spec

    return make


def _run(spec, tmp_path):
    proc = run_worker_subprocess(write_spec(spec, tmp_path / f"{spec['name']}.yaml"), timeout=600)
    run_dir = load_spec(spec).output_dir
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, json.loads((run_dir / C.RESULT_FILE).read_text())


def _learned_the_preference(result):
    evals = result["evals"]
    first, last = evals[0], evals[-1]
    assert len(evals) >= 3 and [e["step"] for e in evals][-1] == result["global_step"]
    # Held-out pairs: the chosen answer out-scores the rejected one far above chance...
    assert last["eval_reward_accuracy"] > 0.75, evals
    assert last["eval_reward_accuracy"] >= first["eval_reward_accuracy"]
    # ...and the chosen answer's log-probability lead over the rejected one grows with training.
    lead = [e["eval_logps_chosen"] - e["eval_logps_rejected"] for e in evals]
    assert lead[-1] > lead[0] and lead[-1] > 0, lead
    assert last["eval_reward_margin"] > first["eval_reward_margin"]


def test_dpo_lora_learns_the_preference_and_reports_it_everywhere(pref_job, tmp_path):
    run_dir, result = _run(pref_job("dpo", output={"dir": str(tmp_path / "run-dpo"), "merge": True}), tmp_path)
    _learned_the_preference(result)
    pref = result["preference"]
    assert pref["objective"] == "dpo" and pref["beta"] == 0.1 and pref["loss_type"] == "sigmoid"
    assert pref["reference"] == "base model (adapter off)"
    assert pref["train"]["reward_accuracy"] > 0.75 and pref["eval"]["eval_reward_margin"] > 0
    assert result["objective"] == "dpo" and result["perplexity"] is None  # a preference loss is no likelihood
    assert result["tokens"] > 0 and result["tokens_per_second"] > 0
    # Progress: metrics events and status.json carry the reward accuracy and margin.
    steps = [e["data"] for e in events(run_dir) if e["type"] == "metrics" and "loss" in (e.get("data") or {})]
    assert steps and all("reward_accuracy" in d and "reward_margin" in d for d in steps)
    st = status(run_dir)
    assert st["state"] == C.STATE_SUCCEEDED and st["extra"]["eval_reward_accuracy"] == pref["eval"]["eval_reward_accuracy"]
    # The result is an ordinary adapter: one adapter (TRL's reference copy is not saved), merged, and chat answers.
    adapter = run_dir / C.ADAPTER_DIR
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "ref").exists()
    assert (run_dir / "merged" / "config.json").is_file()
    from kubetune.serve.loading import load_chat_model

    reply = load_chat_model(run_dir).reply([{"role": "user", "content": "What is 2 plus 3?"}], max_new_tokens=8)
    assert isinstance(reply, str) and reply


def test_orpo_lora_learns_the_preference(pref_job, tmp_path):
    _, result = _run(pref_job("orpo", training={"learning_rate": 3e-3}), tmp_path)
    _learned_the_preference(result)
    pref = result["preference"]
    assert pref["objective"] == "orpo" and pref["reference"] is None and "nll_loss" in pref["train"]
    assert result["tokens"] > 0  # both sequences of each pair are counted


@pytest.mark.parametrize("method", ["qlora", "dora"])
def test_qlora_and_dora_dpo_run_on_the_cpu(method, pref_job, tmp_path):
    spec = pref_job("dpo", method={"type": method}, training={"max_steps": 4, "eval_steps": 4, "save_steps": 4, "logging_steps": 2})
    run_dir, result = _run(spec, tmp_path)
    assert result["method"] == method and result["global_step"] == 4 and result["device"] == "cpu"
    assert "eval_reward_accuracy" in result["preference"]["eval"] and result["reward_accuracy"] is not None
    config = json.loads((run_dir / C.ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["use_dora"] is (method == "dora")  # the adapter it was asked for, alone (no reference copy)


def test_full_dpo_uses_the_explicit_reference(pref_job, tmp_path):
    spec = pref_job("dpo", method={"type": "full", "dpo": {"reference": "builtin://tiny-chat"}},
                    training={"max_steps": 4, "eval_steps": 4, "save_steps": 4, "logging_steps": 2, "learning_rate": 1e-4})  # fmt: skip
    run_dir, result = _run(spec, tmp_path)
    assert result["preference"]["reference"] == "builtin://tiny-chat"
    assert (run_dir / C.MODEL_DIR / "config.json").is_file()
    first = result["evals"][0]
    assert first["eval_reward_margin"] != 0  # the policy moved away from its frozen reference


def test_dpo_resumes_from_its_checkpoint_like_sft(pref_job, tmp_path):
    spec = pref_job("dpo", training={"max_steps": 8, "save_steps": 4, "eval_steps": 8, "logging_steps": 1})
    run_dir, reference = _run(spec, tmp_path)
    # As if it had stopped after checkpoint-4: the rest of the run is gone, the same spec runs again.
    for name in (C.RESULT_FILE, C.DONE_FILE):
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / C.CHECKPOINTS_DIR / "checkpoint-8")
    shutil.rmtree(run_dir / C.ADAPTER_DIR)
    _, result = _run(spec, tmp_path)
    assert result["resumed_at_step"] == 4 and result["global_step"] == 8
    mine = {x["step"]: x["loss"] for x in result["losses"]}
    theirs = {x["step"]: x["loss"] for x in reference["losses"]}
    for step in range(5, 9):
        assert mine[step] == pytest.approx(theirs[step], rel=1e-3, abs=1e-4), step
    assert result["preference"]["eval"]["eval_reward_accuracy"] == pytest.approx(reference["preference"]["eval"]["eval_reward_accuracy"])


def test_dpo_checkpoints_sync_to_output_uri_and_a_fresh_machine_resumes_from_there(pref_job, tmp_path):
    published = tmp_path / "published"
    spec = pref_job("dpo", training={"max_steps": 4, "save_steps": 2, "eval_steps": 4, "logging_steps": 1},
                    output={"dir": str(tmp_path / "run-dpo"), "uri": f"file://{published}"})  # fmt: skip
    run_dir, first = _run(spec, tmp_path)
    assert {p.name for p in published.rglob("checkpoint-*") if p.is_dir()} >= {"checkpoint-4"}
    assert any(json.loads(p.read_text()).get("objective") == "dpo" for p in published.rglob(C.RESULT_FILE))
    shutil.rmtree(run_dir)  # a new machine: nothing local, the same spec
    _, again = _run(spec, tmp_path)
    assert again["resumed_at_step"] == 4 and again["global_step"] == 4  # pulled from output.uri, not trained again
    assert again["preference"]["objective"] == "dpo"


def test_kubetune_status_lists_the_reward_metrics():
    from kubetune.cli._output import status_rows

    rows = dict(status_rows({"state": "running", "step": 3, "extra": {"worker_pid": 1, "reward_accuracy": 0.875, "eval_reward_margin": 1.23456}}, 0.0))
    assert rows["reward_accuracy"] == "0.875" and rows["eval_reward_margin"] == "1.235"
    assert "worker_pid" not in rows and "reward_margin" not in rows  # only what the run reported
