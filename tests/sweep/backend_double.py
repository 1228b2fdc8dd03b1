"""A test double of the Backend protocol for the sweep's scheduling logic (early stopping, interrupts).

Jobs do not train: every ``status()`` call advances a job by one step and writes a metrics event into its
real run directory, with a loss curve chosen by ``curve(job)``. Trials that train for real are covered by
test_sweep_e2e.py; this double only makes the scheduler's decisions fast and deterministic to test.
"""

from __future__ import annotations

from typing import Callable, Iterator

from kubetune import constants as C
from kubetune.backends.base import JobRef
from kubetune.events import JobStatus, RunDir, make_event
from kubetune.spec import TuneJob


class InstantBackend:
    name = "double"

    def __init__(self, curve: Callable[[TuneJob], list[float]]) -> None:
        self.curve = curve
        self.jobs: dict[str, tuple[TuneJob, list[float]]] = {}
        self.submitted: list[str] = []  # job names, in submission order
        self.cancelled: list[str] = []
        self.steps: dict[str, int] = {}

    def submit(self, job: TuneJob) -> JobRef:
        job_id = f"{job.name}-{len(self.submitted)}"
        run = RunDir(job.output_dir)
        run.init()
        run.write_status(JobStatus(state=C.STATE_PENDING, job_id=job_id, name=job.name, backend=self.name, run_dir=str(run.path)))
        run.set_state(C.STATE_RUNNING, job_id=job_id)
        self.jobs[job_id] = (job, self.curve(job))
        self.steps[job_id] = 0
        self.submitted.append(job.name)
        return JobRef(id=job_id, backend=self.name, name=job.name, run_dir=str(run.path))

    def status(self, ref: JobRef) -> JobStatus:
        run = RunDir(ref.run_dir or "")
        st = run.read_status() or JobStatus()
        if st.terminal or ref.id not in self.jobs:
            return st
        job, losses = self.jobs[ref.id]
        step = self.steps[ref.id] = self.steps[ref.id] + 1
        loss = losses[step - 1]
        run.emit(make_event("metrics", f"step {step}", step=step, total_steps=len(losses), loss=loss))
        if step == len(losses):
            run.emit(make_event("metrics", "eval", step=step, eval_loss=loss + 0.5))
            run.write_result({"train_loss": sum(losses) / len(losses), "eval_loss": loss + 0.5, "global_step": step})
            run.set_state(C.STATE_SUCCEEDED)
            run.mark_done()
        return run.read_status() or st

    def events(self, ref: JobRef) -> list[dict]:
        return RunDir(ref.run_dir or "").read_events()

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        return iter(())

    def cancel(self, ref: JobRef) -> None:
        self.cancelled.append(ref.name)
        run = RunDir(ref.run_dir or "")
        st = run.read_status()
        if st is not None and not st.terminal:
            run.set_state(C.STATE_CANCELLED, reason="cancelled by the sweep")

    def list(self) -> list[JobRef]:
        return []


def installer(monkeypatch, curve: Callable[[TuneJob], list[float]]) -> Callable[[], InstantBackend]:
    """What a test's ``double`` fixture returns: a function that installs a fresh InstantBackend with ``curve`` as
    backend "double" (each call replaces the previous one), with the sweep polling every 10 ms."""
    monkeypatch.setattr(C, "SWEEP_POLL_SECONDS", 0.01)

    def install() -> InstantBackend:
        from kubetune.backends import BACKENDS

        backend = InstantBackend(curve)
        monkeypatch.setitem(BACKENDS, "double", lambda **kw: backend)
        return backend

    return install


def sweep_jobs(tiny_job, tmp_path, **defaults) -> Callable[..., TuneJob]:
    """What a test's ``job`` fixture returns: ``make(**sweep)`` loads the tiny 6-step job with a ``sweep`` section
    of ``defaults`` updated by ``sweep``, its trials under ``tmp_path/sweeps``."""
    from kubetune.spec import load_spec

    def make(**sweep) -> TuneJob:
        spec = tiny_job(training={"max_steps": 6})
        spec["sweep"] = {"dir": str(tmp_path / "sweeps" / "{id}"), **defaults, **sweep}
        return load_spec(spec)

    return make
