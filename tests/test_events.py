"""The run directory's event log and status file: every event is logged at once; progress folds into
status.json at most once per interval (rewriting it at every step slows training on small machines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kubetune import constants as C
import pytest

from kubetune.events import EventType, RunDir, event_line, make_event, parse_event_line, status_from_events


def _step(n: int) -> dict:
    return make_event("metrics", f"step {n}", step=n, total_steps=100, loss=1.0 / n)


def test_every_event_is_logged_at_once_and_progress_is_folded_in_at_the_next_write(tmp_path):
    run = RunDir(tmp_path / "run", status_interval=3600)
    run.set_state(C.STATE_RUNNING)
    for n in range(1, 11):
        run.emit(_step(n))
    assert [e["data"]["step"] for e in run.read_events() if e["type"] == "metrics"] == list(range(1, 11))
    assert run.read_status().step == 0  # the state was written just now: all ten are held back
    run.emit(make_event("checkpoint", "saved checkpoint-10", step=10))  # any other event writes at once
    st = run.read_status()
    assert st.step == 10 and st.loss == 0.1 and st.state == C.STATE_RUNNING


def test_progress_is_written_again_once_the_interval_has_passed(tmp_path, monkeypatch):
    import kubetune.events as ev

    now = [1000.0]
    monkeypatch.setattr(ev.time, "monotonic", lambda: now[0])
    run = RunDir(tmp_path / "run", status_interval=1.0)
    run.emit(_step(1))
    now[0] += 0.5
    run.emit(_step(2))
    assert run.read_status().step == 1
    now[0] += 0.6  # 1.1 s after the last write
    run.emit(_step(3))
    assert run.read_status().step == 3


def test_a_state_written_by_another_process_meanwhile_is_kept(tmp_path):
    run = RunDir(tmp_path / "run", status_interval=3600)
    run.set_state(C.STATE_RUNNING)
    run.emit(_step(1))
    run.emit(_step(2))  # held back
    other = RunDir(tmp_path / "run")  # e.g. the launcher recording the worker's pid
    st = other.read_status()
    st.pid = 4242
    other.write_status(st)
    run.flush()
    st = run.read_status()
    assert st.step == 2 and st.pid == 4242


def test_progress_held_back_reaches_status_json_when_the_process_ends(tmp_path):
    code = (
        "from kubetune.events import RunDir, make_event\n"
        f"run = RunDir({str(tmp_path / 'run')!r}, status_interval=3600)\n"
        "for n in range(1, 6):\n"
        "    run.emit(make_event('metrics', 'step', step=n, total_steps=5, loss=0.5))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    status = json.loads((tmp_path / "run" / C.STATUS_FILE).read_text())
    assert status["step"] == 5


def test_interval_zero_writes_status_at_every_event(tmp_path):
    run = RunDir(tmp_path / "run", status_interval=0)
    for n in range(1, 4):
        run.emit(_step(n))
        assert run.read_status().step == n


def test_events_from_two_threads_all_arrive_and_the_status_ends_at_the_last_step(tmp_path):
    import threading

    run = RunDir(tmp_path / "run", status_interval=0.01)

    def progress():
        for n in range(1, 201):
            run.emit(_step(n))

    def uploads():  # the output sync's thread reports uploads while training goes on
        for n in range(100):
            run.emit(make_event("checkpoint", f"uploaded checkpoint-{n}", step=n, uploaded=True))

    threads = [threading.Thread(target=progress), threading.Thread(target=uploads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.flush()
    events = run.read_events()
    assert len(events) == 300
    assert [e["data"]["step"] for e in events if e["type"] == "metrics"] == list(range(1, 201))
    assert run.read_status().step == 200


def test_event_types_are_written_as_plain_strings_in_the_log_and_on_stdout(tmp_path, capsys):
    run = RunDir(tmp_path / "run", echo=True)
    run.set_state(C.JobState.RUNNING)
    run.emit(make_event(EventType.STAGE, "fetching", stage=C.STAGE_FETCH))
    raw = (tmp_path / "run" / C.EVENTS_FILE).read_text().splitlines()
    assert [json.loads(line)["type"] for line in raw] == ["state", "stage"]
    assert '"type":"stage"' in raw[1] and "EventType" not in "".join(raw)
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith(C.EVENT_LINE_PREFIX) and '"type":"stage"' in printed[1] and "EventType" not in printed[1]
    assert json.loads((tmp_path / "run" / C.STATUS_FILE).read_text())["state"] == "running"
    ev = make_event(EventType.DONE, "job succeeded")
    assert type(ev["type"]) is str and f"{EventType.DONE}" == str(EventType.DONE) == "done"
    assert '"type":"done"' in event_line(ev) and parse_event_line(event_line(ev))["type"] == EventType.DONE


def test_an_event_read_back_folds_like_one_made_with_the_enum():
    events = [json.loads(json.dumps(make_event(t, **d))) for t, d in [
        ("state", {"state": C.STATE_RUNNING}), (EventType.STAGE, {"stage": C.STAGE_TRAIN}), (EventType.METRICS, {"step": 3, "loss": 0.5})]]
    st = status_from_events(events)
    assert (st.state, st.stage, st.step, st.loss) == (C.JobState.RUNNING, C.STAGE_TRAIN, 3, 0.5)


def test_an_unknown_event_type_is_refused():
    with pytest.raises(ValueError, match="EventType"):
        make_event("progress", "step 1")


def test_job_states_are_the_state_names():
    assert [s.value for s in C.JobState] == [C.STATE_PENDING, C.STATE_RUNNING, C.STATE_SUCCEEDED, C.STATE_FAILED, C.STATE_CANCELLED, C.STATE_PREEMPTED]
    assert {s for s in C.JobState if s.terminal} == C.TERMINAL_STATES
    assert f"{C.JobState.FAILED}" == "failed" and json.dumps(C.JobState.FAILED) == '"failed"'


def test_event_types_are_named_by_the_enum_everywhere():
    """Every event kubetune writes names its type through EventType (a typo would make readers miss it)."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "kubetune"
    literals = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "make_event":
                if node.args and isinstance(node.args[0], ast.Constant):
                    literals.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not literals, literals


def test_the_run_lifecycle_is_recorded_the_same_way_by_every_writer(tmp_path):
    """submitted -> start -> stage -> succeed, and fail: what `kubetune status`/`list` and the dashboard read."""
    run = RunDir(tmp_path / "run")
    run.submitted("j-1", name="demo", backend="local", spec_text="name: demo\n", host=None)
    st = run.read_status()
    assert st.state == C.STATE_PENDING and st.job_id == "j-1" and st.backend == "local" and st.name == "demo"
    assert run.spec_file.read_text() == "name: demo\n" and "host" not in st.extra  # None extras are left out
    run.start(worker_pid=1234)
    run.stage(C.STAGE_TRAIN, "training")
    st = run.read_status()
    assert st.state == C.STATE_RUNNING and st.stage == C.STAGE_TRAIN and st.extra["worker_pid"] == 1234
    run.succeed()
    assert run.read_status().state == C.STATE_SUCCEEDED and run.is_done()
    assert [e["type"] for e in run.read_events()] == ["state", "state", "stage", "state", "done"]

    failed = RunDir(tmp_path / "failed")
    failed.start()
    failed.fail("model.source: no such file", 2)
    failed.fail("a later, worse reason", 1, unless_ended=True)  # the first reason recorded stays
    st = failed.read_status()
    assert st.state == C.STATE_FAILED and st.reason == "model.source: no such file" and st.extra["exit_code"] == 2
    assert [e["message"] for e in failed.read_events() if e["type"] == "error"] == ["model.source: no such file"]
    assert not failed.is_done()
