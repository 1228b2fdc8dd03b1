"""A sweep over DPO trials ranks them by a preference metric and shows reward accuracy and margin in its table."""

from __future__ import annotations

import io

import pytest

from kubetune import constants as C
from kubetune.sweep import report as R
from kubetune.sweep.state import Sweep, Trial


def _sweep(objective="eval_reward_accuracy", direction="maximize"):
    def trial(name, beta, acc, margin):
        metrics = {"eval_loss": 0.4, "train_loss": 0.5, "eval_reward_accuracy": acc, "eval_reward_margin": margin, "reward_accuracy": acc, "reward_margin": margin}
        return Trial(name, {"method.dpo.beta": beta}, state=C.STATE_SUCCEEDED, objective=metrics.get(objective), metrics=metrics, step=8, total_steps=8)

    return Sweep("s1", "/tmp/s1", objective=objective, direction=direction, params=["method.dpo.beta"],
                 trials=[trial("t0", 0.1, 0.62, 0.8), trial("t1", 0.3, 0.91, 2.5)])  # fmt: skip


def test_rows_rank_by_reward_accuracy_and_carry_the_margins():
    sweep = _sweep()
    table = R.rows(sweep)
    assert [r["trial"] for r in table] == ["t1", "t0"] and table[0]["best"]
    assert table[0]["eval_reward_margin"] == 2.5 and table[0]["reward_accuracy"] == 0.91
    assert "eval_reward_accuracy" not in table[0]  # it is the objective column already


def test_the_cli_table_shows_preference_columns_only_for_preference_trials():
    from rich.console import Console

    from kubetune.cli.sweep import _table

    def render(sweep):
        buf = io.StringIO()
        Console(file=buf, width=200).print(_table(sweep))
        return buf.getvalue()

    out = render(_sweep())
    assert "EVAL_REWARD_MARGIN" in out and "REWARD_ACCURACY" in out and "2.5" in out
    sft = _sweep("eval_loss", "minimize")
    for t in sft.trials:
        t.metrics = {"eval_loss": 0.4, "train_loss": 0.5}
    assert "REWARD" not in render(sft)


@pytest.mark.timeout(900)
def test_a_dpo_sweep_runs_unchanged_and_ranks_by_held_out_reward_accuracy(tmp_path, tiny_model, kubetune_cli):
    import json
    import subprocess

    import yaml

    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w", encoding="utf-8") as f:
        for i in range(40):
            q = [{"role": "user", "content": f"What is {i} plus {i}?"}]
            f.write(json.dumps({"prompt": q, "chosen": f"Sure! It is {2 * i}.", "rejected": f"No. It is {2 * i + 3}."}) + "\n")
    spec = tmp_path / "dpo.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "pref",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(pairs), "eval_split": 0.2},
        "method": {"type": "lora", "objective": "dpo", "lora": {"r": 8, "alpha": 16}},
        "training": {"max_steps": 4, "batch_size": 8, "learning_rate": 3e-3, "max_seq_length": 64, "save_steps": 4, "logging_steps": 2},
        "sweep": {"dir": str(tmp_path / "sweeps" / "{id}"), "objective": "eval_reward_accuracy", "direction": "maximize"},
    }))  # fmt: skip
    run = subprocess.run([*kubetune_cli, "sweep", str(spec), "--grid", "method.dpo.beta=0.05,0.5", "--run-id", "t"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "EVAL_REWARD_ACCURACY" in run.stdout and "REWARD_MARGIN" in run.stdout
    out = subprocess.run([*kubetune_cli, "sweep", "status", "pref-t", "-o", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    trials = json.loads(out.stdout)["trials"]
    assert len(trials) == 2 and all(t["state"] == C.STATE_SUCCEEDED for t in trials)
    assert all(isinstance(t["objective"], float) and "eval_reward_margin" in t for t in trials)
