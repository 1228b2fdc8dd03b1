"""What the dashboard reads from the store: a page of a project's jobs (filtered by state, searched by id, model
or spec text, newest first) summarised for the jobs table, and the changes the live stream sends (jobs created or
with new events since the last look)."""

from __future__ import annotations

from sqlalchemy import String, cast, func, or_, select

from ..native import native_job
from ..models import Job, JobEvent
from ..store import Store

__all__ = ["JOB_STATES", "SPARK_POINTS", "job_summary", "list_jobs", "changes_since", "high_water"]

JOB_STATES = ("validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled")
SPARK_POINTS = 30  # losses drawn in a row's sparkline
_RECENT_METRICS = 200  # newest events looked at for a summary's progress and sparkline
_METRIC_TYPE = "metrics"


def job_summary(store: Store, job: dict) -> dict:
    """A job as the jobs table shows it: the ``kubetune.job`` object, its method and sweep, its latest progress
    (step, total_steps, loss, eta_seconds) and its last losses (``spark``, oldest first)."""
    rows, _ = store.list_events(job["id"], limit=_RECENT_METRICS)
    progress: dict = {}
    spark: list[float] = []
    for e in rows:  # newest first
        d = e.get("data") or {}
        if e["type"] != _METRIC_TYPE or d.get("step") is None:
            continue
        if not progress:
            progress = {k: d[k] for k in ("step", "total_steps", "epoch", "loss", "eta_seconds") if d.get(k) is not None}
        if isinstance(d.get("loss"), (int, float)) and len(spark) < SPARK_POINTS:
            spark.append(float(d["loss"]))
    out = native_job(job, progress)
    out["method"] = (job.get("method") or {}).get("type") or ((job.get("spec") or {}).get("method") or {}).get("type")
    out["sweep_id"] = job.get("sweep_id")
    out["spark"] = spark[::-1]
    return out


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_jobs(store: Store, project_id: str, *, status: str | None, query: str | None, after: str | None,
              limit: int) -> tuple[list[dict], bool]:
    """A page of the project's jobs, newest first, after the job ``after``; and whether more follow."""
    from ..store import _row

    with store.session() as s:
        q = select(Job).where(Job.project_id == project_id)
        if status:
            q = q.where(Job.status == status)
        if query:
            like = f"%{_escape_like(query.lower())}%"
            q = q.where(or_(func.lower(Job.id).like(like, escape="\\"), func.lower(Job.model).like(like, escape="\\"),
                            func.lower(cast(Job.spec, String)).like(like, escape="\\")))
        if after:
            cursor = s.scalar(select(Job.seq).where(Job.id == after, Job.project_id == project_id))
            if cursor is not None:
                q = q.where(Job.seq < cursor)
        rows = [_row(j) for j in s.scalars(q.order_by(Job.seq.desc()).limit(limit + 1))]
    return [job_summary(store, j) for j in rows[:limit]], len(rows) > limit


def high_water(store: Store) -> tuple[int, int]:
    """The newest job's and event's sequence numbers: where a live stream starts watching."""
    with store.session() as s:
        return s.scalar(select(func.max(Job.seq))) or 0, s.scalar(select(func.max(JobEvent.seq))) or 0


def changes_since(store: Store, project_id: str, job_seq: int, event_seq: int) -> tuple[list[dict], int, int]:
    """The project's jobs created after ``job_seq`` or with events after ``event_seq``, as summaries (oldest
    first); and the new high-water marks."""
    from ..store import _row

    with store.session() as s:
        new_jobs = s.execute(select(Job.seq, Job.id).where(Job.project_id == project_id, Job.seq > job_seq)).all()
        touched = s.execute(select(JobEvent.seq, JobEvent.job_id).join(Job, Job.id == JobEvent.job_id)
                            .where(Job.project_id == project_id, JobEvent.seq > event_seq)).all()
        top_job = max([job_seq, *(n for n, _ in new_jobs)])  # the rows seen, not the table's max: a later commit is not skipped
        top_event = max([event_seq, *(n for n, _ in touched)])
        ids = list(dict.fromkeys([i for _, i in new_jobs] + [i for _, i in touched]))
        jobs = [_row(j) for j in s.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.seq))] if ids else []
    return [job_summary(store, j) for j in jobs], top_job, top_event
