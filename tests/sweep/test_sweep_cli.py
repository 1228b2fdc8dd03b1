"""``kubetune sweep`` on the command line: option parsing, one-message errors, light imports, and a
detached sweep stopped with ``kubetune sweep cancel``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from kubetune import constants as C
from kubetune.cli.sweep import _job_from_options, _parse_dist, _parse_grid, _split
from kubetune.errors import SpecError
from kubetune.events import RunDir
from kubetune.sweep.run import load_sweep


def test_grid_and_dist_options_parse_values_as_yaml():
    assert _split('4,8,[q_proj,v_proj],"a,b"') == ["4", "8", "[q_proj,v_proj]", '"a,b"']
    assert _parse_grid("training.learning_rate=1e-4,3e-4") == ("training.learning_rate", ["1e-4", "3e-4"])
    assert _parse_grid("method.lora.target_modules=[q_proj,v_proj],all-linear") == ("method.lora.target_modules", [["q_proj", "v_proj"], "all-linear"])
    assert _parse_dist("training.learning_rate=log-uniform:1e-5,1e-3") == (
        "training.learning_rate", {"type": "log_uniform", "low": "1e-5", "high": "1e-3", "integer": False})
    assert _parse_dist("method.lora.r=int-uniform:4,64")[1] == {"type": "uniform", "low": 4, "high": 64, "integer": True}
    assert _parse_dist("method.lora.r=choice:4,8") == ("method.lora.r", {"type": "choice", "values": [4, 8]})
    for bad in ("method.lora.r", "method.lora.r="):
        with pytest.raises(SpecError, match="expected KEY=V1,V2"):
            _parse_grid(bad)
    with pytest.raises(SpecError, match="TYPE one of choice"):
        _parse_dist("training.learning_rate=gauss:1,2")
    with pytest.raises(SpecError, match="two numbers"):
        _parse_dist("training.learning_rate=uniform:1")


def test_command_line_extends_the_spec_sweep_section(tmp_path, tiny_job):
    spec = tiny_job()
    spec["sweep"] = {"grid": {"method.lora.r": [4, 8], "training.warmup_ratio": [0.0, 0.1]}, "parallel": 3}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    job = _job_from_options(path, ["training.max_steps=2"], ["training.learning_rate=1e-4,3e-4"],
                            ["training.warmup_ratio=uniform:0,0.2"], 5, 3, None, None, "maximize", True, None)
    s = job.sweep
    assert job.training.max_steps == 2
    assert s.grid == {"method.lora.r": [4, 8], "training.learning_rate": [1e-4, 3e-4]}
    assert s.random["training.warmup_ratio"].high == 0.2  # the command line replaced the grid entry
    assert (s.trials, s.seed, s.parallel, s.direction, s.early_stopping.rule) == (5, 3, 3, "maximize", "median")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "method.lora.rr=1,2"], "did you mean method.lora.r?"),
        (["--dist", "training.learning_rate=gauss:1,2"], "TYPE one of choice"),
        ([], "the sweep has no parameters"),
        (["--grid", "method.lora.r=4,8", "--objective", "perplexity", "--set", "dataset.eval_split=0"], "perplexity needs evaluation data"),
        (["--grid", "method.lora.r=0,8"], "trial tiny-r0"),
    ],
)
def test_mistakes_end_in_one_message_and_exit_code_2(args, message, tmp_path, tiny_job, kubetune_cli):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_job()))
    r = subprocess.run([*kubetune_cli, "sweep", str(path), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_status_of_an_unknown_sweep(kubetune_cli, tmp_path):
    r = subprocess.run([*kubetune_cli, "sweep", "status", "no-such-sweep"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no sweep 'no-such-sweep'" in r.stderr and "kubetune sweep list" in r.stderr


def test_status_refuses_an_unknown_output_format(kubetune_cli, tmp_path):
    r = subprocess.run([*kubetune_cli, "sweep", "status", "no-such-sweep", "-o", "xml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "-o/--output: 'xml' is not one of table, wide, json, yaml, csv" in r.stderr


def test_sweep_commands_do_not_import_torch_matplotlib_or_optuna():
    code = (
        "import sys, kubetune.cli, kubetune.sweep.run, kubetune.sweep.report, kubetune.sweep.optuna_search, kubetune.cli.sweep; "
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib', 'optuna') if m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_detached_sweep_is_stopped_by_cancel_and_its_trials_with_it(tmp_path, tiny_model, tiny_job, kubetune_cli):
    spec = tiny_job(name="bg", training={"max_steps": 200, "save_steps": 50})
    spec["sweep"] = {"dir": str(tmp_path / "sweeps" / "{id}")}
    path = tmp_path / "bg.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = subprocess.run([*kubetune_cli, "sweep", str(path), "--grid", "method.lora.r=2,4", "--parallel", "1", "--detach"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "bg", r.stdout + r.stderr
    trial = tmp_path / "sweeps" / "bg" / C.SWEEP_TRIALS_DIR / "bg-r2"
    deadline = time.monotonic() + 300
    while (st := RunDir(trial).read_status()) is None or st.stage != C.STAGE_TRAIN:  # the first trial is training
        assert time.monotonic() < deadline, (tmp_path / "sweeps" / "bg" / C.SWEEP_LOG).read_text()
        time.sleep(0.2)
    worker = st.pid
    out = subprocess.run([*kubetune_cli, "sweep", "cancel", "bg"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    sweep = load_sweep("bg")
    assert sweep.state == C.TRIAL_INTERRUPTED and sweep.pid is None
    assert [t.state for t in sweep.trials] == [C.TRIAL_INTERRUPTED, C.STATE_PENDING]
    assert RunDir(trial).read_status().state == C.STATE_CANCELLED
    assert not _alive(worker)
    assert "interrupted" in (tmp_path / "sweeps" / "bg" / C.SWEEP_LOG).read_text()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
