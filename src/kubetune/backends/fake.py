"""An in-memory backend: jobs that run through their states without training anything.

For tests of code above the backends (the Client, sweeps, servers) and for trying a spec's plumbing
without a machine to train on: ``Client("fake")``. Every :meth:`FakeBackend.status` call moves a running job
one step on; after ``steps`` steps it ends in ``outcome``. Nothing touches the disk or the network.

Args:
    steps: how many status calls a job takes from running to its end.
    outcome: the state every job ends in (``succeeded`` or ``failed``).
    loss: the loss reported at step 0; it halves every step.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Iterator

from .. import constants as C
from ..errors import BackendError, JobNotFound
from ..events import EventType, JobStatus, make_event
from ..spec import TuneJob
from .base import JobRef

__all__ = ["FakeBackend"]


@dataclass
class _Job:
    ref: JobRef
    job: TuneJob
    status: JobStatus
    events: list[dict] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


class FakeBackend:
    """Jobs held in memory that advance one step per status call (see the module's docstring)."""

    name = "fake"

    def __init__(self, *, steps: int = 3, outcome: str = C.STATE_SUCCEEDED, loss: float = 2.0) -> None:
        if outcome not in (C.STATE_SUCCEEDED, C.STATE_FAILED):
            raise BackendError(f"fake backend: outcome '{outcome}' must be succeeded or failed")
        self.steps, self.outcome, self.loss = max(1, steps), outcome, loss
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)

    def submit(self, job: TuneJob) -> JobRef:
        """Record the job as pending and return its reference."""
        job_id = f"{job.name}-fake-{next(self._ids)}"
        ref = JobRef(id=job_id, backend=self.name, name=job.name, run_dir=None, extra={})
        st = JobStatus(state=C.STATE_PENDING, job_id=job_id, name=job.name, backend=self.name, created_at=time.time(), total_steps=self.steps)
        entry = _Job(ref=ref, job=job, status=st)
        self._record(entry, make_event(EventType.STATE, C.STATE_PENDING, state=C.STATE_PENDING, job_id=job_id))
        self._jobs[job_id] = entry
        return ref

    def status(self, ref: JobRef) -> JobStatus:
        """The job's status after moving it one step on (pending -> running -> ... -> outcome)."""
        entry = self._get(ref)
        st = entry.status
        if st.terminal:
            return st
        if st.state == C.STATE_PENDING:
            self._record(entry, make_event(EventType.STATE, C.STATE_RUNNING, state=C.STATE_RUNNING))
            self._record(entry, make_event(EventType.STAGE, "training", stage=C.STAGE_TRAIN))
        elif st.step < self.steps:
            step = st.step + 1
            loss = round(self.loss / 2**step, 6)
            self._record(entry, make_event(EventType.METRICS, f"step {step}/{self.steps} loss={loss}", step=step, total_steps=self.steps, loss=loss))
        else:
            reason = None if self.outcome == C.STATE_SUCCEEDED else "the fake backend was told to fail"
            if reason:
                self._record(entry, make_event(EventType.ERROR, reason))
            self._record(entry, make_event(EventType.STATE, self.outcome, state=self.outcome, **({"reason": reason} if reason else {})))
            if self.outcome == C.STATE_SUCCEEDED:
                self._record(entry, make_event(EventType.DONE, "job succeeded"))
        return entry.status

    def events(self, ref: JobRef) -> list[dict]:
        """Every event so far."""
        return list(self._get(ref).events)

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """One line per event; with ``follow``, the job is driven to its end first."""
        entry = self._get(ref)
        if follow:
            while not self.status(ref).terminal:
                pass
        return iter(list(entry.logs))

    def cancel(self, ref: JobRef) -> None:
        """End an unfinished job as cancelled."""
        entry = self._get(ref)
        if not entry.status.terminal:
            self._record(entry, make_event(EventType.STATE, C.STATE_CANCELLED, state=C.STATE_CANCELLED, reason="cancelled by user"))

    def list(self) -> list[JobRef]:
        """The jobs submitted to this instance, newest first."""
        return [j.ref for j in reversed(self._jobs.values())]

    def resolve(self, key: str) -> JobRef:
        """A job by id, or by name (its newest submission)."""
        if key in self._jobs:
            return self._jobs[key].ref
        for ref in self.list():
            if ref.name == key:
                return ref
        raise JobNotFound(f"no fake job '{key}'", hint="the fake backend keeps jobs in memory: use the same Client")

    def _get(self, ref: JobRef) -> _Job:
        try:
            return self._jobs[ref.id]
        except KeyError:
            raise JobNotFound(f"no fake job '{ref.id}'") from None

    def _record(self, entry: _Job, event: dict) -> None:
        entry.events.append(event)
        entry.status.apply(event)
        entry.logs.append(f"[fake] {event['type']}: {event.get('message', '')}")
