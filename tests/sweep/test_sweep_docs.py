"""docs/sweeps.md stays true: its seed-002 command plans the trials the page promises, and its
``sweep:`` section is a valid spec."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

import kubetune.sweep.run
from kubetune.cli import app
from kubetune.spec import load_spec
from kubetune.sweep.run import plan_values, sweep_dir_for, sweep_id_for, trial_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "sweeps.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_seed_002_rank_sweep_is_one_command(tmp_path, monkeypatch):
    spec_text = next(b for b in _blocks("yaml") if b.startswith("name: tiny-llama-argilla-r-sweep"))
    (tmp_path / "tiny-llama-argilla.yaml").write_text(spec_text)
    command = next(b for b in _blocks("bash") if "kubetune sweep tiny-llama-argilla.yaml" in b)
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["kubetune", "sweep"]

    calls = []

    def capture(job, **kw):  # no cluster here: record what would run, then stop as Ctrl-C would
        calls.append((job, kw))
        raise KeyboardInterrupt

    monkeypatch.setattr(kubetune.sweep.run, "run_sweep", capture)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv[1:])
    assert result.exit_code == 130 and calls, result.output  # stopped right where the sweep would start
    job, kw = calls[0]
    assert kw["backend"] == "kubernetes" and kw["run_id"] == "alpha" and job.sweep.parallel == 10
    assert job.kubernetes.namespace == "silo"

    sweep_id = sweep_id_for(job, kw["run_id"])
    trials = [trial_spec(job, sweep_id, v, sweep_dir_for(job, sweep_id)) for v in plan_values(job.sweep)]
    ranks = [4, 6, 8, 10, 12, 16, 20, 24, 32, 64]
    assert [t.name for t in trials] == [f"tiny-llama-argilla-r-sweep-alpha-r{r}" for r in ranks]
    assert [t.method.lora.r for t in trials] == ranks
    assert [t.output.uri for t in trials] == [f"s3://default-bucket/experiments/{t.name}" for t in trials]
    assert all(t.training.resume == "auto" for t in trials)  # relaunched trials continue from their checkpoints


def test_the_documented_sweep_section_is_valid(capitals):
    section = yaml.safe_load(next(b for b in _blocks("yaml") if b.startswith("sweep:")))
    job = load_spec({"name": "doc", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(capitals), "eval_split": 0.1},
                     "training": {"eval_steps": 10}, **section})
    values = plan_values(job.sweep)
    assert len(values) == 12 and job.sweep.early_stopping.rule == "median"
    assert {v["method.lora.r"] for v in values} <= {4, 8, 16}


def test_python_example_assigns_a_sweep_section(capitals):
    job = load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(capitals), "eval_split": 0.1}})
    job.sweep = {"grid": {"method.lora.r": [4, 8, 16]}, "parallel": 2}
    assert job.sweep.grid == {"method.lora.r": [4, 8, 16]} and job.sweep.parallel == 2
