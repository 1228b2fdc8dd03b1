"""Several jobs in one run directory (issue 22): each job id keeps its own status and its own part of the log.

Built by hand (no worker): two submissions recorded the way the local backend records them, then read back
through :class:`LocalBackend` by job id and by run directory.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from kubetune import constants as C
from kubetune.backends._history import log_header
from kubetune.backends.base import JobRef
from kubetune.backends.local import LocalBackend
from kubetune.errors import JobNotFound
from kubetune.events import EventType, RunDir, make_event


def _submit(run: RunDir, job_id: str, log_lines: list[str], *, header: bool = True) -> None:
    run.submitted(job_id, name="hist", backend="local", spec_text="name: hist\n")
    with open(run.worker_log, "a", encoding="utf-8") as f:
        if header:
            f.write(log_header(job_id) + "\n")
        f.writelines(line + "\n" for line in log_lines)


def _ref(run: RunDir, job_id: str) -> JobRef:
    return JobRef(id=job_id, backend="local", name="hist", run_dir=str(run.path))


@pytest.fixture
def two_jobs(tmp_path):
    """Job a failed at step 3 of 10; job b, started after it in the same directory, succeeded at step 5 of 5."""
    run = RunDir(tmp_path / "run", status_interval=0)
    _submit(run, "hist-a", ["[kubetune] step 3/10 loss=2.0", "boom"])
    run.start(worker_pid=1)
    run.emit(make_event(EventType.METRICS, "step 3/10 loss=2.0", step=3, total_steps=10, loss=2.0))
    run.fail("bad row in data.jsonl:7", 2)
    time.sleep(0.01)
    _submit(run, "hist-b", ["[kubetune] step 5/5 loss=0.5"])
    run.start(worker_pid=1)
    run.emit(make_event(EventType.METRICS, "step 5/5 loss=0.5", step=5, total_steps=5, loss=0.5))
    run.succeed()
    return run


def test_an_earlier_job_id_shows_that_jobs_final_status_not_the_newest(two_jobs):
    backend = LocalBackend()
    a = backend.status(_ref(two_jobs, "hist-a"))
    assert (a.job_id, a.state, a.step, a.total_steps, a.reason) == ("hist-a", C.STATE_FAILED, 3, 10, "bad row in data.jsonl:7")
    assert a.extra.get("exit_code") == 2
    assert a.created_at <= a.started_at <= a.finished_at
    b = backend.status(_ref(two_jobs, "hist-b"))
    assert (b.job_id, b.state, b.step, b.total_steps) == ("hist-b", C.STATE_SUCCEEDED, 5, 5)
    assert a.finished_at < b.created_at
    # the run directory means its newest job, as before
    by_dir = backend.status(backend.resolve(str(two_jobs.path)))
    assert (by_dir.job_id, by_dir.state) == ("hist-b", C.STATE_SUCCEEDED)


def test_cancelling_an_earlier_job_leaves_the_running_one_alone(tmp_path):
    run = RunDir(tmp_path / "run", status_interval=0)
    _submit(run, "hist-a", [])
    run.succeed()
    _submit(run, "hist-b", [])
    worker = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands in for job b's worker
    try:
        st = run.read_status()
        st.pid = worker.pid  # what the local backend records once it has started the worker
        run.write_status(st)
        run.start(worker_pid=worker.pid)
        backend = LocalBackend()
        backend.cancel(_ref(run, "hist-a"))
        assert backend.preempt(_ref(run, "hist-a")).state == C.STATE_SUCCEEDED
        assert worker.poll() is None
        assert backend.status(_ref(run, "hist-b")).state == C.STATE_RUNNING
    finally:
        worker.kill()
        worker.wait()


def test_each_job_id_gets_its_own_part_of_the_worker_log(two_jobs):
    backend = LocalBackend()
    a = list(backend.logs(_ref(two_jobs, "hist-a")))
    assert a == [log_header_line(two_jobs, "hist-a"), "[kubetune] step 3/10 loss=2.0", "boom"]
    b = list(backend.logs(_ref(two_jobs, "hist-b"), follow=True))  # it has ended: following stops at once
    assert b[0].startswith(f"{C.LOG_JOB_HEADER_PREFIX}hist-b ") and b[1:] == ["[kubetune] step 5/5 loss=0.5"]
    every = list(backend.logs(_ref(two_jobs, "hist-b"), all_runs=True))
    assert every == a + b


def log_header_line(run: RunDir, job_id: str) -> str:
    return next(line for line in run.worker_log.read_text().splitlines() if line.startswith(C.LOG_JOB_HEADER_PREFIX + job_id + " "))


def test_an_earlier_job_that_never_recorded_its_end_is_reported_failed(tmp_path):
    """A worker killed before anything recorded its end, then a new job in the directory: the earlier job is over."""
    run = RunDir(tmp_path / "run", status_interval=0)
    _submit(run, "hist-a", ["[kubetune] step 1/10 loss=2.0"])
    run.start(worker_pid=1)
    _submit(run, "hist-b", [])
    st = LocalBackend().status(_ref(run, "hist-a"))
    assert st.state == C.STATE_FAILED and st.terminal
    assert "without recording a result before job hist-b" in st.reason


def test_a_log_written_before_jobs_were_marked_is_shown_whole(tmp_path):
    """A run directory from an older kubetune (no header lines): a job's log is the whole file, as before."""
    run = RunDir(tmp_path / "run", status_interval=0)
    _submit(run, "old-1", ["first run"], header=False)
    _submit(run, "old-2", ["second run"], header=False)
    assert list(LocalBackend().logs(_ref(run, "old-1"))) == ["first run", "second run"]


def test_an_earlier_job_whose_events_are_gone_is_one_clear_error(two_jobs):
    two_jobs.events_file.write_text("")
    with pytest.raises(JobNotFound, match="no longer holds its events") as e:
        LocalBackend().status(_ref(two_jobs, "hist-a"))
    assert "hist-b" in str(e.value)
