"""The sweep's scheduling decisions, on a test double of the Backend protocol (backend_double.py):
early stopping, interrupts, following trials an earlier sweep process left running, refusing reruns
that would mix different specs, and one sweep process at a time."""

from __future__ import annotations

import json

import pytest

from kubetune import constants as C
from kubetune.errors import BackendError, SpecError
from kubetune.spec import load_spec
from kubetune.sweep.run import load_sweep, run_sweep
from kubetune.sweep.state import sweep_lock

from .backend_double import installer, sweep_jobs

GOOD, FINE, BAD, LATE = 1e-3, 2e-3, 5e-2, 4e-3


def curve(job) -> list[float]:
    """Loss per step by learning rate: two trials that learn, one that does not."""
    steps = job.training.max_steps or 1
    lr = job.training.learning_rate
    if lr == BAD:
        return [3.0] * steps
    start = 2.0 if lr == GOOD else 2.1
    return [round(start - 0.1 * s, 3) for s in range(1, steps + 1)]


@pytest.fixture
def double(monkeypatch):
    return installer(monkeypatch, curve)


@pytest.fixture
def job(tiny_job, tmp_path):
    return sweep_jobs(tiny_job, tmp_path, grid={"training.learning_rate": [GOOD, FINE, BAD]})


def test_median_rule_stops_the_bad_trial_and_a_rerun_leaves_it_stopped(double, job):
    backend = double()
    lines: list[str] = []
    spec = job(objective="train_loss", parallel=1, early_stopping={"min_trials": 2, "grace_steps": 2},
               grid={"training.learning_rate": [GOOD, FINE, BAD, LATE]})
    sweep = run_sweep(spec, backend="double", run_id="es", log=lines.append)
    by_lr = {t.values["training.learning_rate"]: t for t in sweep.trials}
    assert by_lr[BAD].state == C.TRIAL_PRUNED and by_lr[BAD].step == 2
    assert "worse than the median" in by_lr[BAD].reason
    assert any(line.startswith(f"{by_lr[BAD].name}: pruned") and "stopped early at step 2" in line for line in lines)
    assert backend.cancelled == [by_lr[BAD].name]
    # the stopped trial's slot goes to the next one
    assert by_lr[GOOD].state == by_lr[FINE].state == by_lr[LATE].state == C.STATE_SUCCEEDED
    assert sweep.state == C.STATE_SUCCEEDED and sweep.best().name == by_lr[GOOD].name
    assert [t.name for t in sweep.ranked()][-1] == by_lr[BAD].name

    again = double()
    rerun = run_sweep(spec, backend="double", run_id="es")
    assert again.submitted == []  # succeeded and stopped trials are not run again
    assert rerun.trial(by_lr[BAD].name).state == C.TRIAL_PRUNED


def test_interrupt_cancels_running_trials_and_a_rerun_resumes_only_those(double, job):
    backend = double()
    submitted: list[str] = []

    def log(line: str) -> None:
        if ": submitted" in line:
            submitted.append(line)
            if len(submitted) == 3:  # the first two trials have finished; the third has just started
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(job(parallel=2, grid={"training.learning_rate": [GOOD, FINE, BAD], "method.lora.r": [4]}), backend="double", run_id="int", log=log)
    sweep = load_sweep("tiny-int")
    states = [t.state for t in sweep.trials]
    assert states == [C.STATE_SUCCEEDED, C.STATE_SUCCEEDED, C.TRIAL_INTERRUPTED] and sweep.state == C.TRIAL_INTERRUPTED
    assert backend.cancelled == [sweep.trials[2].name]

    again = double()
    rerun = run_sweep(job(parallel=2, grid={"training.learning_rate": [GOOD, FINE, BAD], "method.lora.r": [4]}), backend="double", run_id="int")
    assert again.submitted == [sweep.trials[2].name]
    assert [t.state for t in rerun.trials] == [C.STATE_SUCCEEDED] * 3
    assert rerun.trials[2].attempts == 2


def _stopped_after_first_submission(backend, job, run_id: str, monkeypatch) -> str:
    """A sweep process that dies right after submitting its first trial, whose job outlives it (as after
    kill -9); returns that trial's name."""
    monkeypatch.setattr(backend, "cancel", lambda ref: None)

    def stop_at_first_submission(line: str) -> None:
        if ": submitted" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(job(parallel=1), backend="double", run_id=run_id, log=stop_at_first_submission)
    return load_sweep(f"tiny-{run_id}").trials[0].name


def test_a_rerun_follows_a_trial_still_running_instead_of_starting_it_again(double, job, monkeypatch):
    backend = double()
    first = _stopped_after_first_submission(backend, job, "adopt", monkeypatch)
    lines: list[str] = []
    sweep = run_sweep(job(parallel=1), backend="double", run_id="adopt", log=lines.append)
    assert f"{first}: still running from an earlier run, following it" in lines
    assert backend.submitted.count(first) == 1
    assert all(t.state == C.STATE_SUCCEEDED for t in sweep.trials)


def test_a_changed_spec_needs_a_new_run_id(double, job, tiny_job, tmp_path):
    double()
    run_sweep(job(), backend="double", run_id="a")
    changed = tiny_job(training={"max_steps": 7})
    changed["sweep"] = job().sweep.model_dump(mode="json")
    with pytest.raises(SpecError, match="training.max_steps") as e:
        run_sweep(load_spec(changed), backend="double", run_id="a")
    assert "--run-id" in str(e.value)
    fresh = double()
    sweep = run_sweep(load_spec(changed), backend="double", run_id="b")
    assert sweep.id == "tiny-b" and len(fresh.submitted) == 3
    assert all(t.state == C.STATE_SUCCEEDED for t in sweep.trials)


def test_one_process_runs_a_sweep_at_a_time(double, job, tmp_path):
    double()
    with sweep_lock(tmp_path / "sweeps" / "tiny-locked") as mine:
        assert mine
        with pytest.raises(BackendError, match="already running") as e:
            run_sweep(job(), backend="double", run_id="locked")
    assert "kubetune sweep cancel tiny-locked" in str(e.value)


def test_reports_are_written_when_a_sweep_ends(double, job, tmp_path):
    double()
    sweep = run_sweep(job(), backend="double", run_id="rep")
    d = tmp_path / "sweeps" / "tiny-rep"
    data = json.loads((d / C.SWEEP_RESULTS_JSON).read_text())
    assert data["best"]["trial"] == sweep.best().name and data["objective"] == "eval_loss"
    assert [r["trial"] for r in data["trials"]] == [t.name for t in sweep.ranked()]
    assert (d / C.SWEEP_RESULTS_CSV).read_text().splitlines()[0].startswith("rank,trial,best,training.learning_rate,state,eval_loss")
    assert (d / C.SWEEP_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sweep.best().name in (d / C.SWEEP_REPORT).read_text()


def test_a_trial_that_cannot_be_submitted_fails_alone(double, job, monkeypatch):
    backend = double()
    submit = backend.submit

    def refuse_bad(trial_job):
        if trial_job.training.learning_rate == BAD:
            raise BackendError("quota exceeded in namespace default")
        return submit(trial_job)

    monkeypatch.setattr(backend, "submit", refuse_bad)
    sweep = run_sweep(job(parallel=1), backend="double", run_id="quota")
    by_lr = {t.values["training.learning_rate"]: t for t in sweep.trials}
    assert by_lr[BAD].state == C.STATE_FAILED and "quota exceeded" in by_lr[BAD].reason
    assert by_lr[GOOD].state == by_lr[FINE].state == C.STATE_SUCCEEDED
    assert sweep.state == C.STATE_FAILED
    again = double()
    run_sweep(job(parallel=1), backend="double", run_id="quota")
    assert again.submitted == [by_lr[BAD].name]  # a rerun tries the failed trial again, and only it


@pytest.mark.parametrize("pending_polls", [0, 3], ids=["known-at-start", "found-while-following"])
def test_a_trial_an_earlier_sweep_never_started_is_submitted_again(double, job, monkeypatch, pending_polls):
    """The earlier sweep process died between recording a trial's job and starting it: the backend reports
    the job never started (at once, or after its start grace while the rerun follows it), and the rerun
    submits the trial instead of following it forever."""
    backend = double()
    first = _stopped_after_first_submission(backend, job, "orphan", monkeypatch)
    status = backend.status
    polls = {first: pending_polls}

    def status_never_started(ref):
        from kubetune.events import JobStatus

        if ref.name in polls:  # what the local backend reports: pending, then never started once its grace has passed
            if polls[ref.name]:
                polls[ref.name] -= 1
                return JobStatus(state=C.STATE_PENDING, job_id=ref.id, name=ref.name)
            del polls[ref.name]
            return JobStatus(state=C.STATE_FAILED, reason=C.REASON_NEVER_STARTED, job_id=ref.id, name=ref.name)
        return status(ref)

    monkeypatch.setattr(backend, "status", status_never_started)
    lines: list[str] = []
    sweep = run_sweep(job(parallel=1), backend="double", run_id="orphan", log=lines.append)
    assert backend.submitted.count(first) == 2
    assert any(line.startswith(f"{first}: submitted") for line in lines)
    if pending_polls:
        assert f"{first}: still running from an earlier run, following it" in lines
        assert f"{first}: {C.REASON_NEVER_STARTED}; submitting it again" in lines
    assert all(t.state == C.STATE_SUCCEEDED for t in sweep.trials)
