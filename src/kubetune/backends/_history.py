"""One job's record in a run directory that several submissions share.

Every submission of a spec writes its ``output.dir``: status.json holds the newest job only, while
events.jsonl keeps every job's events (each job's begin with the ``pending`` state event that carries its
job id) and logs/worker.log every job's output (each job's begins with the header line :func:`log_header`,
written by the backend before it starts the worker). These helpers cut one job's part out of them, so that
``kubetune status``/``logs`` of an earlier job id show that job, not the newest.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator

from .. import constants as C
from ..errors import JobNotFound
from ..events import EventType, JobStatus, RunDir, status_from_events

__all__ = ["log_header", "header_job_id", "job_events", "is_earlier", "earlier_status", "log_has_header", "job_log", "local_time"]


def local_time(seconds: float) -> str:
    """``2026-11-24 21:30:15+01:00``: an epoch time as local ISO 8601, to the second."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(sep=" ", timespec="seconds")


def log_header(job_id: str, when: float | None = None) -> str:
    """The line that opens a job's part of logs/worker.log (no newline)."""
    return f"{C.LOG_JOB_HEADER_PREFIX}{job_id} started {local_time(time.time() if when is None else when)} ====="


def header_job_id(line: str) -> str | None:
    """The job id a :func:`log_header` line names; None for any other line."""
    if not line.startswith(C.LOG_JOB_HEADER_PREFIX):
        return None
    return line[len(C.LOG_JOB_HEADER_PREFIX):].split(" ", 1)[0] or None


def _submission_id(ev: dict) -> str | None:
    """The job id of a submission's first event (the ``pending`` state event), else None."""
    data = ev.get("data") or {}
    if ev.get("type") == EventType.STATE and data.get("state") == C.STATE_PENDING and data.get("job_id"):
        return str(data["job_id"])
    return None


def job_events(events: Iterable[dict], job_id: str) -> tuple[list[dict], dict | None] | None:
    """Job ``job_id``'s events, from its ``pending`` event up to the next job's, and that next job's first event
    (None when ``job_id`` is the last job there). None when the events hold no such job."""
    mine: list[dict] | None = None
    for ev in events:
        sid = _submission_id(ev)
        if mine is None:
            if sid == job_id:
                mine = [ev]
            continue
        if sid is not None and sid != job_id:
            return mine, ev
        mine.append(ev)
    return (mine, None) if mine is not None else None


def is_earlier(job_id: str, current: JobStatus) -> bool:
    """Whether ``job_id`` names a job other than the one status.json records (an earlier submission)."""
    return bool(current.job_id) and job_id != current.job_id


def earlier_status(run: RunDir, job_id: str, current: JobStatus, *, name: str | None = None, backend: str | None = None) -> JobStatus:
    """The final status of an earlier job in ``run``, folded from its own events.

    A job whose events end without a final state (its worker was killed before anything recorded that) is
    reported ``failed``: a later job could take the run directory only once no process of it held the lock.

    Raises:
        JobNotFound: events.jsonl holds no events of ``job_id`` (removed or damaged).
    """
    found = job_events(run.iter_events(), job_id)
    if found is None:
        raise JobNotFound(
            f"job {job_id}: {run.events_file} no longer holds its events; {run.path} now holds job {current.job_id}",
            hint=f"kubetune status {run.path} shows job {current.job_id}",
        )
    events, following = found
    base = JobStatus(job_id=job_id, name=name, backend=backend, run_dir=str(run.path), created_at=events[0].get("time"))
    st = status_from_events(events, base)
    st.pid = None  # its processes are gone; a pid recorded then may belong to anything now
    if not st.terminal:
        nxt = (following or {}).get("data", {}).get("job_id", "a later job")
        st.state = C.STATE_FAILED
        st.reason = f"the job ended without recording a result before job {nxt} took {run.path}"
        st.finished_at = (following or {}).get("time", st.updated_at)
    return st


def log_has_header(path: Path, job_id: str) -> bool:
    """Whether the log at ``path`` holds job ``job_id``'s header line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(header_job_id(line) == job_id for line in f)
    except OSError:
        return False


def job_log(lines: Iterable[str], job_id: str, *, own_header: bool, all_runs: bool = False) -> Iterator[str]:
    """The lines of logs/worker.log that belong to job ``job_id``, its header line first.

    Args:
        lines: the log's lines (read on as the file grows, when following).
        own_header: whether the log holds ``job_id``'s header (:func:`log_has_header`). Without one (a job
            recorded before kubetune marked each job's start, or a run directory whose status lost its job
            id) there is no telling which lines are the job's: every line is kept, the headers showing where
            later jobs begin.
        all_runs: every line, every job's part introduced by its header.
    """
    section: str | None = None  # the job whose part is being read; None before the first header
    for line in lines:
        hid = header_job_id(line)
        if hid is not None:
            section = hid
        if all_runs or not own_header or section == job_id:
            yield line
