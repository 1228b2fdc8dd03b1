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
    measured = "busy cores" if os.path.exists("/proc/stat") else "load average"  # measured now where Linux allows
    line = re.search(rf"using (\d+) of (\d+) CPU threads?: {measured} (\d+\.\d)", out.stdout)
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


def test_cli_run_in_a_pipe_prints_compact_whole_lines(tiny_job, tmp_path, kubetune_cli):
    """Issue 22: through a pipe or in CI `kubetune run` prints a progress line every few seconds or tenth of the steps
    (not one per step), never wraps a line at 80 columns, and `list`/`status` print whole values for scripts."""
    import re

    import yaml

    from kubetune.cli._output import PROGRESS_INTERVAL_S
    from kubetune.events import RunDir

    run_dir = tmp_path / ("a-run-directory-with-a-long-name-" + "x" * 40)  # the lines below pass 80 columns
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(tiny_job(training={"max_steps": 30, "save_steps": 15, "eval_steps": 15, "batch_size": 2}, output={"dir": str(run_dir)})))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    r = subprocess.run([*kubetune_cli, "run", str(f)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    job_id = RunDir(run_dir).read_status().job_id
    assert f"{job_id} on local -> {run_dir}" in lines  # one line, however long
    assert "  plan: 30 steps (training.max_steps=30); global batch 2 = 2 x 1 process(es) x 1 accumulation" in lines, lines
    steps = [int(m.group(1)) for line in lines if (m := re.match(r"\s*step (\d+)/30 loss=", line))]
    assert steps[0] == 1 and steps[-1] == 30 and steps == sorted(set(steps))
    # every step printed after the first is 3 steps (a tenth) or PROGRESS_INTERVAL_S after the one printed before
    times = {ev["data"]["step"]: ev["time"] for ev in RunDir(run_dir).read_events() if ev["type"] == "metrics" and "loss" in (ev.get("data") or {})}
    for before, step in zip(steps, steps[1:]):
        assert step == 30 or step - before >= 3 or times[step] - times[before] >= PROGRESS_INTERVAL_S, (before, step)
    assert len(steps) < 30 or min(b - a for a, b in zip(sorted(times.values()), sorted(times.values())[1:])) >= PROGRESS_INTERVAL_S
    assert sum("eval at step 15/30" in line or "eval at step 30/30" in line for line in lines) == 2
    assert sum(line.startswith("checkpoint saved checkpoint-") for line in lines) == 2
    assert lines[-2].startswith("succeeded (train_loss=")

    listed = subprocess.run([*kubetune_cli, "list"], capture_output=True, text=True, timeout=120, env=env).stdout
    assert any(line.split()[0] == job_id and line.split()[-1] == str(run_dir) for line in listed.splitlines() if line.strip()), listed
    assert "…" not in listed and "..." not in listed
    status = subprocess.run([*kubetune_cli, "status", job_id], capture_output=True, text=True, timeout=120, env=env).stdout
    times_shown = dict(line.split(None, 1) for line in status.splitlines() if line.split()[0].endswith("_at"))
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.fullmatch(stamp, times_shown["created_at"]), status
    assert re.fullmatch(stamp + r" \(took (\d+m)?\d+s\)", times_shown["finished_at"]), status


def test_plain_progress_prints_a_tenth_of_a_long_run():
    """680 steps (the quickstart's), 0.05 s apart: about ten progress lines, the first and the last step, and every
    evaluation, checkpoint and warning; steps 10 s apart: every one (a line at most every few seconds)."""
    from rich.text import Text

    from kubetune.cli._output import PROGRESS_INTERVAL_S, PlainProgress
    from kubetune.events import make_event

    def step(n: int, total: int, t: float) -> dict:
        ev = make_event("metrics", f"step {n}/{total} loss=1.0000", step=n, total_steps=total, loss=1.0, tokens_per_second=900.0, eta_seconds=65)
        ev["time"] = t
        return ev

    progress = PlainProgress()
    out = []
    for n in range(1, 681):
        out += progress.lines(step(n, 680, 1000 + n * 0.05))
        if n == 200:
            out += progress.lines(make_event("checkpoint", "saved checkpoint-200"))
            out += progress.lines(make_event("metrics", "eval_loss=0.6000 perplexity=1.82", step=200, total_steps=680, eval_loss=0.6))
            out += progress.lines(make_event("warning", "the gradient norm has been 0 [for 5 steps]"))
    out = [Text.from_markup(line).plain for line in out]  # as printed
    steps = [line for line in out if "step " in line and "loss=1.0000" in line]
    assert 10 <= len(steps) <= 12
    assert steps[0] == "  step 1/680 loss=1.0000 900 tok/s eta 1m05s" and steps[-1].startswith("  step 680/680 ")
    assert "checkpoint saved checkpoint-200" in out and "  eval at step 200/680: eval_loss=0.6000 perplexity=1.82" in out
    assert "warning the gradient norm has been 0 [for 5 steps]" in out  # shown as written, not taken for markup

    slow = PlainProgress()
    printed = [line for n in range(1, 51) for line in slow.lines(step(n, 5000, n * (PROGRESS_INTERVAL_S + 1)))]
    assert len(printed) == 50
    stopped = PlainProgress()
    for n in range(1, 6):
        stopped.lines(step(n, 680, n * 0.1))
    assert stopped.end() == ["  step 5/680 loss=1.0000 900 tok/s eta 1m05s"]  # the job ended early: its last step


def test_run_help_is_plain_and_says_how_resume_and_ctrl_c_work(kubetune_cli):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    r = subprocess.run([*kubetune_cli, "run", "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.replace("│", " ").split())
    for label in ("<bool>", "<list[str]>", "<str>", "<path>", "{spec}"):
        assert label not in r.stdout, label
    assert "run [OPTIONS] SPEC" in text and "--set KEY=VALUE" in text and "--backend -b BACKEND" in text
    assert "resumes" in text and "newest complete one" in text and "nothing to do" in text and "--restart starts over" in text
    assert "Ctrl-C cancels the job" in text and "without saving" in text and "SIGTERM or SIGHUP" in text
