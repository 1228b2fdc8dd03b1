"""A real TPE sweep on the builtin tiny model, through the command line: 3 trials chosen one at a time by
Optuna's TPE (parallel 1), told their real eval_loss, kept in optuna.db; the same command again trains nothing."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kubetune import constants as C
from kubetune.events import RunDir

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.slow

MAX_STEPS = 3


@pytest.mark.timeout(600)
def test_tpe_sweep_trains_three_trials_and_a_rerun_trains_none(tmp_path, tiny_model, capitals, kubetune_cli):
    spec = tmp_path / "tpe.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "tpe",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(capitals), "eval_split": 0.1},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16}},
        "training": {"max_steps": MAX_STEPS, "batch_size": 8, "learning_rate": 3e-3, "max_seq_length": 64, "save_steps": 100, "logging_steps": 1},
        "sweep": {"dir": str(tmp_path / "sweeps" / "{id}")},
    }))
    cmd = [*kubetune_cli, "sweep", str(spec), "--tpe", "3", "--parallel", "1", "--seed", "1", "--run-id", "e",
           "--dist", "training.learning_rate=log-uniform:1e-4,1e-2", "--grid", "method.lora.r=2,4"]
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    assert first.returncode == 0, first.stdout + first.stderr
    directory = tmp_path / "sweeps" / "tpe-e"
    study = optuna.load_study(study_name="tpe-e", storage=f"sqlite:///{directory / C.SWEEP_OPTUNA_DB}")
    assert [ft.state for ft in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    trials = sorted((directory / C.SWEEP_TRIALS_DIR).iterdir())
    assert [t.name.split("-")[2] for t in trials] == ["t0", "t1", "t2"]
    results = [RunDir(t).read_result() for t in trials]
    assert all(r["global_step"] == MAX_STEPS for r in results)
    assert [ft.value for ft in study.trials] == pytest.approx([r["eval_loss"] for r in results])
    for ft, t in zip(study.trials, trials):
        job = yaml.safe_load((t / "spec.yaml").read_text())
        assert job["training"]["learning_rate"] == pytest.approx(ft.params["training.learning_rate"])
        assert job["method"]["lora"]["r"] == ft.params["method.lora.r"]

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0 and again.stdout.count("skipped (succeeded earlier") == 3 and "submitted" not in again.stdout, again.stdout
    assert len(optuna.load_study(study_name="tpe-e", storage=f"sqlite:///{directory / C.SWEEP_OPTUNA_DB}").trials) == 3
