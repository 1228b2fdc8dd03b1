"""End to end on the local backend: the run-directory contract, state transitions, cancel, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetune import Client, load_spec
from kubetune import constants as C


def _states(run_dir: Path) -> list[str]:
    out = []
    for line in (run_dir / C.EVENTS_FILE).read_text().splitlines():
        ev = json.loads(line)
        if ev["type"] == "state":
            out.append(ev["data"]["state"])
    return out


def _assert_contract(run_dir: Path, artifact: str) -> dict:
    for name in (C.SPEC_FILE, C.STATUS_FILE, C.EVENTS_FILE, C.RESULT_FILE, C.DONE_FILE):
        assert (run_dir / name).is_file(), name
    assert (run_dir / C.LOGS_DIR / C.WORKER_LOG).is_file()
    assert (run_dir / artifact).is_dir()
    ckpts = sorted((run_dir / C.CHECKPOINTS_DIR).glob("checkpoint-*"))
    assert ckpts and all((c / C.CHECKPOINT_COMPLETE).is_file() for c in ckpts)
    # DONE is written last.
    done_t = (run_dir / C.DONE_FILE).stat().st_mtime
    assert all(done_t >= (run_dir / n).stat().st_mtime for n in (C.RESULT_FILE, C.EVENTS_FILE))
    status = json.loads((run_dir / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_SUCCEEDED
    assert status["step"] == status["total_steps"] == 6
    assert _states(run_dir) == [C.STATE_PENDING, C.STATE_RUNNING, C.STATE_SUCCEEDED]
    events = [json.loads(x) for x in (run_dir / C.EVENTS_FILE).read_text().splitlines()]
    stages = [e["data"]["stage"] for e in events if e["type"] == "stage"]
    assert stages[:3] == [C.STAGE_FETCH, C.STAGE_PREPARE, C.STAGE_PREPARE] or stages[0] == C.STAGE_FETCH
    assert C.STAGE_TRAIN in stages and C.STAGE_PUBLISH in stages
    metrics = [e["data"] for e in events if e["type"] == "metrics" and "loss" in (e.get("data") or {})]
    assert metrics and all({"step", "total_steps", "loss", "tokens_per_second", "eta_seconds"} <= set(m) for m in metrics)
    result = json.loads((run_dir / C.RESULT_FILE).read_text())
    for key in ("train_loss", "eval_loss", "tokens", "tokens_per_second", "runtime_seconds"):
        assert result[key] is not None, key
    return result


@pytest.mark.parametrize("method,artifact", [("lora", C.ADAPTER_DIR), ("full", C.MODEL_DIR)])
def test_local_run_writes_the_run_directory(tiny_job, method, artifact):
    client = Client("local")
    ref = client.submit(tiny_job(method={"type": method}))
    st = client.wait(ref, timeout=300)
    run_dir = Path(ref.run_dir)
    assert st.state == C.STATE_SUCCEEDED, (st.reason, (run_dir / "logs/worker.log").read_text()[-3000:])
    result = _assert_contract(run_dir, artifact)
    assert result["tokens"] > 0
    # The saved spec is the resolved one.
    saved = load_spec(run_dir / C.SPEC_FILE)
    assert saved.method.type == method and saved.training.max_steps == 6
    # The job is listed and found by id, name and run directory.
    assert ref.id in [r.id for r in client.list()]
    assert client.status(run_dir.as_posix()).state == C.STATE_SUCCEEDED
    assert client.status("tiny").job_id == ref.id
    assert any("step 6/6" in line for line in client.logs(ref))


def test_trained_model_answers_in_process(tiny_job):
    """A longer LoRA run learns the training answers (what the quickstart shows)."""
    from kubetune.serve.loading import load_chat_model

    job = tiny_job(
        method={"type": "lora", "lora": {"r": 16, "alpha": 32, "modules_to_save": ["embed_tokens"]}},
        training={"max_steps": None, "epochs": 20, "save_steps": 1000, "max_seq_length": 256},
    )
    client = Client()
    st = client.wait(client.submit(job), timeout=600)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    result = json.loads((Path(job["output"]["dir"]) / C.RESULT_FILE).read_text())
    first_loss = result["losses"][0]["loss"]
    assert result["eval_loss"] < first_loss / 5  # eval loss falls far below its starting value
    model = load_chat_model(job["output"]["dir"])
    right = 0
    for country, capital in [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima")]:
        right += model.reply([{"role": "user", "content": f"What is the capital of {country}?"}]).strip() == f"{capital}."
    assert right >= 3


def test_cancel_ends_the_process_group(tiny_job):
    client = Client()
    ref = client.submit(tiny_job(training={"max_steps": 5000, "save_steps": 1000}))
    deadline = time.time() + 120
    while client.status(ref).stage != C.STAGE_TRAIN and time.time() < deadline:
        time.sleep(0.3)
    assert client.status(ref).state == C.STATE_RUNNING
    pid = ref.extra["pid"]
    client.cancel(ref)
    st = client.status(ref)
    assert st.state == C.STATE_CANCELLED
    time.sleep(0.3)
    alive = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pid)], capture_output=True, text=True).stdout
    assert all("Z" in line.split()[1] for line in alive.strip().splitlines() if line.strip()), alive
    assert not (Path(ref.run_dir) / C.DONE_FILE).exists()


def test_failing_job_reports_the_reason(tiny_job, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": [oops\n')
    client = Client()
    ref = client.submit(tiny_job(dataset={"source": str(bad), "eval_split": 0.0}))
    st = client.wait(ref, timeout=120)
    assert st.state == C.STATE_FAILED
    assert f"{bad}:2" in st.reason
    assert _states(Path(ref.run_dir))[-1] == C.STATE_FAILED


def test_killed_worker_is_reported_failed(tiny_job):
    client = Client()
    ref = client.submit(tiny_job(training={"max_steps": 5000, "save_steps": 1000}))
    deadline = time.time() + 120
    while client.status(ref).stage != C.STAGE_TRAIN and time.time() < deadline:
        time.sleep(0.3)
    os.kill(ref.extra["pid"], signal.SIGKILL)
    time.sleep(0.5)
    st = client.status(ref)
    assert st.state == C.STATE_FAILED
    assert "ended without recording a result" in st.reason


def test_cli_run_exit_codes(tiny_job, tmp_path, kubetune_cli):
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(tiny_job(training={"max_steps": 2, "save_steps": 2})))
    ok = subprocess.run([*kubetune_cli, "run", str(f)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "succeeded" in ok.stdout
    missing = subprocess.run([*kubetune_cli, "run", str(f), "--set", f"dataset.source={tmp_path}/nope.jsonl"], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2
    assert "nope.jsonl" in missing.stdout + missing.stderr
    assert "Traceback" not in missing.stdout + missing.stderr


def test_a_cpu_run_says_first_how_many_threads_it_uses_and_why(tiny_job, tmp_path, kubetune_cli):
    """Without OMP_NUM_THREADS or training.cpu_threads the worker takes the free cores (not torch's default of
    every core), says so before anything else, and records the count torch trained with."""
    import re

    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(tiny_job(training={"max_steps": 2, "save_steps": 2})))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "KUBETUNE_CPU_THREADS_AUTO")}
    out = subprocess.run([*kubetune_cli, "run", str(f)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    line = re.search(r"using (\d+) of (\d+) CPU threads?: load average (\d+\.\d)", out.stdout)
    assert line, out.stdout
    threads, available = int(line.group(1)), int(line.group(2))
    assert 1 <= threads <= available == len(os.sched_getaffinity(0))
    run_dir = tmp_path / "run"
    events = [json.loads(x) for x in (run_dir / C.EVENTS_FILE).read_text().splitlines()]
    stages = [e for e in events if e["type"] == "stage"]
    assert stages[0]["message"].startswith(f"using {threads} of {available} CPU thread")  # the run's first word
    assert json.loads((run_dir / C.RESULT_FILE).read_text())["cpu_threads"] == threads


def test_a_job_whose_submitter_died_before_starting_it_is_reported_never_started(tmp_path, monkeypatch):
    """A submitter killed between recording a job (pending) and starting its worker leaves no process behind:
    the job must end as failed, with that reason, instead of staying pending forever."""
    from kubetune.backends.base import JobRef
    from kubetune.backends.local import LocalBackend
    from kubetune.events import JobStatus, RunDir

    run = RunDir(tmp_path / "run")
    run.write_status(JobStatus(state=C.STATE_PENDING, job_id="j1", name="j", backend="local", run_dir=str(run.path), created_at=time.time()))
    ref = JobRef(id="j1", backend="local", name="j", run_dir=str(run.path))
    backend = LocalBackend()
    assert backend.status(ref).state == C.STATE_PENDING  # just submitted: its worker may be starting
    monkeypatch.setattr(C, "LOCAL_START_GRACE_S", 0.0)
    time.sleep(0.01)
    st = backend.status(ref)
    assert st.state == C.STATE_FAILED and st.reason == C.REASON_NEVER_STARTED
    # a worker that did start records its own pid: its death is noticed even without the submitter's pid
    run2 = RunDir(tmp_path / "run2")
    run2.write_status(JobStatus(state=C.STATE_PENDING, job_id="j2", name="j", backend="local", run_dir=str(run2.path)))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run2.set_state(C.STATE_RUNNING, job_id="j2", worker_pid=dead.pid)
    st = backend.status(JobRef(id="j2", backend="local", name="j", run_dir=str(run2.path)))
    assert st.state == C.STATE_FAILED and "ended without recording a result" in st.reason
