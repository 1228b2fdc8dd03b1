"""Local mode for real: the tiny job as a KFP local pipeline (SubprocessRunner, use_venv=False) on this machine.

Each test trains builtin://tiny-chat for a couple of steps through fetch -> train -> [merge ->] publish and
checks what a user reads afterwards: the run directory contract, the KFP artifacts, the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from kubetune import Client
from kubetune import constants as C
from kubetune.events import RunDir

pytestmark = pytest.mark.slow

FAST = {"max_steps": 2, "save_steps": 1, "batch_size": 4, "max_seq_length": 64}


def _pipeline_run_dir(run_dir: Path, task: str) -> Path:
    """The local runner's folder of one task: <run>/kfp/<pipeline run>/<task>."""
    (found,) = list((run_dir / C.KFP_LOCAL_ROOT).glob(f"kubetune-*/{task}"))
    return found


def _check_contract(run_dir: Path, *, artifact: str = C.ADAPTER_DIR) -> dict:
    run = RunDir(run_dir)
    st = run.read_status()
    assert st.state == C.STATE_SUCCEEDED, st.reason
    assert st.backend == "kfp" and st.job_id and st.extra["kfp_mode"] == "local"
    assert st.step == st.total_steps == FAST["max_steps"]
    assert yaml.safe_load(run.spec_file.read_text())["name"] == "tiny"
    events = run.read_events()
    stages = [e["data"]["stage"] for e in events if e["type"] == "stage"]
    order = [C.STAGE_FETCH, C.STAGE_PREPARE, C.STAGE_TRAIN, C.STAGE_PUBLISH]
    assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == order
    assert events[-1]["type"] == "done"
    assert any(e["type"] == "metrics" and (e.get("data") or {}).get("loss") is not None for e in events)
    result = run.read_result()
    assert result["train_loss"] > 0 and result["data"]["rows"] > 0 and result["total_seconds"] > 0
    assert (run_dir / artifact / "adapter_model.safetensors").is_file() or (run_dir / artifact / "model.safetensors").is_file()
    ckpts = sorted((run_dir / C.CHECKPOINTS_DIR).glob("checkpoint-*"))
    assert ckpts and all((c / C.CHECKPOINT_COMPLETE).is_file() for c in ckpts)
    done = run.done_file.stat().st_mtime
    assert done >= run.result_file.stat().st_mtime and done >= max(p.stat().st_mtime for p in (run_dir / artifact).iterdir())
    log = run.worker_log.read_text()
    assert "Pipeline 'kubetune-tiny' finished with status SUCCESS" in log and "\x1b[" not in log
    # The same outputs as KFP artifacts: the trained adapter, and the run record of the publish task.
    trained = _pipeline_run_dir(run_dir, "train") / "trained"
    assert sorted(p.name for p in trained.iterdir()) == sorted(p.name for p in (run_dir / artifact).iterdir())
    record = next((run_dir / C.KFP_LOCAL_ROOT).glob("kubetune-*/publish*/run"))
    assert json.loads((record / C.RESULT_FILE).read_text()) == result
    assert (record / C.DONE_FILE).is_file() and (record / artifact).is_dir()
    return result


def test_tiny_job_runs_as_a_local_pipeline_through_the_cli(tiny_job, tmp_path, kubetune_cli):
    spec = tiny_job(training=FAST, dataset={"eval_split": 0.0, "max_rows": 64})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    env = {**os.environ, "COLUMNS": "400"}

    out = subprocess.run([*kubetune_cli, "run", str(spec_file), "--backend", "kfp", "--mode", "local"],
                         capture_output=True, text=True, env=env, timeout=1200)

    assert out.returncode == 0, out.stdout + out.stderr
    assert "succeeded (train_loss=" in out.stdout
    run_dir = Path(spec["output"]["dir"])
    _check_contract(run_dir)
    fetched = _pipeline_run_dir(run_dir, "fetch")
    assert (fetched / "model" / "config.json").is_file() and (fetched / "dataset" / "capitals.jsonl").is_file()
    # status and logs work as for any job: by run directory with the default backend, by id with --backend kfp.
    job_id = RunDir(run_dir).read_status().job_id
    st = subprocess.run([*kubetune_cli, "status", str(run_dir), "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(st.stdout)["state"] == "succeeded"
    logs = subprocess.run([*kubetune_cli, "logs", job_id, "--backend", "kfp"], capture_output=True, text=True, timeout=120)
    assert "[kubetune] training" in logs.stdout and "Executing task 'publish'" in logs.stdout
    listed = subprocess.run([*kubetune_cli, "list", "--backend", "kfp"], capture_output=True, text=True, env=env, timeout=120)
    assert job_id in listed.stdout and "succeeded" in listed.stdout


def test_model_tarball_with_merge(tiny_job, tiny_model, tmp_path):
    tarball = tmp_path / "tiny-chat.tar.gz"  # seed 000's flow: the model as one tarball with a top folder
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tiny_model, arcname="tiny-chat")
    spec = tiny_job(model={"source": str(tarball)}, training=FAST, output={"merge": True},
                    dataset={"eval_split": 0.0, "max_rows": 64})
    client = Client("kfp")

    ref = client.submit(spec)
    st = client.wait(ref, timeout=1200, poll=1.0)

    run_dir = Path(ref.run_dir)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    _check_contract(run_dir)
    assert (run_dir / C.MERGED_DIR / "config.json").is_file()
    assert any((run_dir / C.MERGED_DIR).glob("*.safetensors"))
    merged = _pipeline_run_dir(run_dir, "merge") / "merged"
    assert sorted(p.name for p in merged.iterdir()) == sorted(p.name for p in (run_dir / C.MERGED_DIR).iterdir())
    unpacked = _pipeline_run_dir(run_dir, "fetch") / "model"
    assert (unpacked / "config.json").is_file() and not list(unpacked.glob("*.tar.gz"))
    record = next((run_dir / C.KFP_LOCAL_ROOT).glob("kubetune-*/publish-merged/run"))
    assert (record / C.MERGED_DIR / "config.json").is_file()
    messages = [e.get("message", "") for e in RunDir(run_dir).read_events()]
    assert "merged adapter into merged/" in messages


def test_a_bad_dataset_fails_the_pipeline_with_the_row_named(tiny_job, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
                   '{"messages": "not a list"}\n', encoding="utf-8")
    client = Client("kfp")
    ref = client.submit(tiny_job(dataset={"source": str(bad)}, training=FAST))

    st = client.wait(ref, timeout=900, poll=1.0)

    assert st.state == C.STATE_FAILED
    assert "bad.jsonl:2" in st.reason
    assert st.extra["exit_code"] == 2  # a user's mistake, recorded by the train task itself
    run = RunDir(ref.run_dir)
    assert not run.is_done() and run.read_result() is None
    assert [e["message"] for e in run.read_events() if e["type"] == "error"] == [st.reason]
    assert "Task 'train' finished with status FAILURE" in run.worker_log.read_text()


def test_cancel_stops_the_runner_and_its_tasks(tiny_job):
    client = Client("kfp")
    ref = client.submit(tiny_job(training={"max_steps": 500}))
    deadline = time.monotonic() + 300
    while client.status(ref).stage is None and time.monotonic() < deadline:
        time.sleep(0.2)  # wait until a task has started

    client.cancel(ref)

    st = client.status(ref)
    assert st.state == C.STATE_CANCELLED and st.reason == "cancelled by user"
    pgid = ref.extra["pid"]
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgrp(p) == pgid]
    assert alive == []


def _pgrp(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def test_a_dpo_job_runs_unchanged_as_a_local_pipeline(tiny_job, tmp_path):
    """method.objective dpo through fetch -> train -> publish: the same contract, with the preference metrics."""
    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w", encoding="utf-8") as f:
        for i in range(16):
            q = [{"role": "user", "content": f"What is {i} plus {i}?"}]
            f.write(json.dumps({"prompt": q, "chosen": f"Sure! It is {2 * i}.", "rejected": f"No. It is {2 * i + 3}."}) + "\n")
    spec = tiny_job(dataset={"source": str(pairs)}, method={"type": "lora", "objective": "dpo", "lora": {"r": 8, "alpha": 16}}, training=FAST)
    client = Client("kfp")

    ref = client.submit(spec)
    st = client.wait(ref, timeout=1200, poll=1.0)

    assert st.state == C.STATE_SUCCEEDED, st.reason
    _check_contract(Path(ref.run_dir))
    result = RunDir(ref.run_dir).read_result()
    assert result["objective"] == "dpo" and result["data"]["format"] == "preference"
    assert "reward_accuracy" in result["preference"]["train"] and result["eval_reward_accuracy"] is not None
    assert "reward_accuracy" in st.extra
