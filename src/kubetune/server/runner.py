"""Runs the server's jobs on the configured backend and copies their progress into the database.

One thread (:meth:`Runner.start`) wakes every ``poll_seconds``: it follows every ``running`` job (state,
events, metrics and checkpoints from the backend, exactly as ``kubetune status`` reads them, written to the
database in one transaction per job together with how many events were copied, so a restart copies each
event once), then starts ``queued`` jobs oldest first while their project has fewer than
``max_running_jobs`` running. Nothing is kept only in memory: after a restart (or a ``kill -9``) the same
loop re-attaches to the jobs that were running (the local backend's workers live in their own sessions and
outlive the server) and starts the queued ones.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from .. import constants as C
from ..backends import JobRef
from ..client import Client
from ..errors import JobNotFound, KubetuneError
from ..events import EventType
from .config import ServerConfig
from .store import Store

__all__ = ["Runner", "ACTIVE", "TERMINAL"]

log = logging.getLogger("kubetune.server")

ACTIVE = ("validating_files", "queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
# kubetune's job states -> OpenAI's status names (preempted: paused when the user asked for it, else failed)
_STATUS = {C.STATE_PENDING: "running", C.STATE_RUNNING: "running", C.STATE_SUCCEEDED: "succeeded",
           C.STATE_FAILED: "failed", C.STATE_CANCELLED: "cancelled"}


class Runner:
    """Submits, follows, cancels and pauses the server's jobs (one per server process)."""

    def __init__(self, store: Store, config: ServerConfig) -> None:
        self.store = store
        self.config = config
        self.client = Client(config.backend, **config.backend_options)
        self._lock = threading.RLock()  # one follower at a time: events are copied exactly once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    # -- the loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the follower thread (re-attaching to running jobs, then starting queued ones)."""
        self._thread = threading.Thread(target=self._loop, name="kubetune-runner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the follower thread (jobs keep running; the next start re-attaches to them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """Run the loop now (a job was created or resumed)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a database hiccup must not end the follower; the next tick retries
                log.exception("runner tick failed")
            self._wake.wait(self.config.poll_seconds)
            self._wake.clear()

    def tick(self) -> None:
        """Follow every running job once, then start what the per-project limits allow (only in the one server
        process that leads: replicas on one database answer the API, and take over when the leader dies)."""
        if not self.store.try_lead():
            return
        with self._lock:
            for job in self.store.jobs_in(("running",)):
                self.follow(job)
            running: dict[str, int] = {}
            for job in self.store.jobs_in(("running",)):
                running[job["project_id"]] = running.get(job["project_id"], 0) + 1
            for job in self.store.jobs_in(("queued",)):
                if running.get(job["project_id"], 0) < self.config.max_running_jobs:
                    if self._submit(job):
                        running[job["project_id"]] = running.get(job["project_id"], 0) + 1

    # -- one job ----------------------------------------------------------------------------------
    def _submit(self, job: dict) -> bool:
        try:
            ref = self._running_ref(job) or self.client.submit(job["spec"])
        except KubetuneError as e:
            self._end(job, "failed", error={"code": "invalid_job", "message": str(e), "param": None})
            return False
        ref_data = dataclasses.asdict(ref)
        # events_seen: where this submission's events begin (a resumed job appends to its run directory)
        self.store.add_events(job["id"], [_server_event("Fine-tuning job started", data={"backend": ref.backend, "backend_job_id": ref.id})],
                              status="running", backend_ref=ref_data, run_dir=ref.run_dir,
                              started_at=job["started_at"] or time.time(), requested=None)
        return True

    def _running_ref(self, job: dict) -> JobRef | None:
        """The submission already running in the job's run directory: the server died between submitting it and
        recording that (a local run directory's status names it), so it is re-attached instead of started twice."""
        out = (job.get("spec") or {}).get("output", {}).get("dir")
        if self.config.backend != "local" or not out:
            return None
        from ..events import RunDir

        st = RunDir(out).read_status()
        if st is None or st.terminal or not st.job_id:
            return None
        return JobRef(id=st.job_id, backend=self.config.backend, name=st.name or "", run_dir=str(RunDir(out).path))

    def follow(self, job: dict) -> dict:
        """Copy the job's new events, checkpoints and state from the backend into the database; the job as now."""
        with self._lock:
            job = self.store.get_job(None, job["id"]) or job
            if not job.get("backend_ref"):
                return job
            ref = JobRef(**job["backend_ref"])
            try:
                st = self.client.status(ref)
                events = self.client.events(ref)
            except JobNotFound as e:
                self._end(job, "failed", error={"code": "run_lost", "message": f"the job's run is gone: {e}", "param": None})
                return self.store.get_job(None, job["id"]) or job
            new = events[job["events_seen"]:]
            for i, ev in enumerate(new, start=job["events_seen"]):
                if ev.get("type") == EventType.CHECKPOINT:
                    self._checkpoint(job, ev, events[:i])
            fields: dict[str, Any] = {}
            status = _STATUS.get(st.state)
            if st.state == C.STATE_PREEMPTED:
                status = "paused" if job.get("requested") == "pause" else "failed"
            if status and status != job["status"] and job["status"] == "running":
                fields["status"] = status
                if status in TERMINAL:
                    fields["finished_at"] = time.time()
                if status == "succeeded":
                    result = _result(job)
                    fields["result"] = result  # kept: the run directory may go, the record stays complete
                    tokens = result.get("tokens") if result else None
                    fields["trained_tokens"] = int(tokens) if isinstance(tokens, (int, float)) else None
                if status == "failed":
                    fields["error"] = {"code": "job_failed", "message": st.reason or "the job failed", "param": None}
                if status == "paused":
                    fields["requested"] = None
            self.store.add_events(job["id"], [_to_record(ev) for ev in new], seen=len(events), **fields)
            return self.store.get_job(None, job["id"]) or job

    def cancel(self, job: dict) -> dict:
        """Stop the job (queued or paused: at once; running: its worker is stopped) and record ``cancelled``."""
        with self._lock:
            # as the database has it now: the runner may have submitted it while this request waited for the lock
            job = self.store.get_job(None, job["id"]) or job
            if job["status"] in ("queued", "validating_files", "paused"):
                self._end(job, "cancelled", message="Fine-tuning job cancelled")
            elif job["status"] == "running":
                if job.get("backend_ref"):
                    try:
                        self.client.cancel(JobRef(**job["backend_ref"]))
                    except KubetuneError as e:
                        log.warning("cancel %s: %s", job["id"], e)
                    self.follow(job)
                self._end(self.store.get_job(None, job["id"]) or job, "cancelled", message="Fine-tuning job cancelled")
            return self.store.get_job(None, job["id"]) or job

    def pause(self, job: dict) -> dict:
        """Stop a running job as a preemption does (it saves a checkpoint) and record ``paused``.

        Raises:
            BackendError: the backend cannot stop a job that way (only local can).
        """
        with self._lock:
            job = self.store.get_job(None, job["id"]) or job  # as the database has it now (see cancel)
            if job["status"] == "queued":
                self.store.update_job(job["id"], expect=("queued",), status="paused")
            elif job["status"] == "running" and job.get("backend_ref"):
                self.store.update_job(job["id"], requested="pause")
                self.client.preempt(JobRef(**job["backend_ref"]))
                job = self.follow(job)
                if job["status"] == "running":  # ended without a preempted state: record the pause anyway
                    self.store.update_job(job["id"], expect=("running",), status="paused", requested=None)
            self.store.add_events(job["id"], [_server_event("Fine-tuning job paused")])
            return self.store.get_job(None, job["id"]) or job

    def resume(self, job: dict) -> dict:
        """Queue a paused job again: it resumes from its newest checkpoint (``training.resume: auto``)."""
        with self._lock:
            if self.store.update_job(job["id"], expect=("paused",), status="queued", backend_ref=None):
                self.store.add_events(job["id"], [_server_event("Fine-tuning job resumed")])
        self.wake()
        return self.store.get_job(None, job["id"]) or job

    def _checkpoint(self, job: dict, ev: dict, before: list[dict]) -> None:
        data = ev.get("data") or {}
        if data.get("removed") or data.get("resume") or data.get("step") is None:
            return
        metrics: dict[str, Any] = {"step": data["step"]}
        for prev in reversed(before):
            d = prev.get("data") or {}
            if prev.get("type") == EventType.METRICS and d.get("loss") is not None:
                metrics["train_loss"] = d["loss"]
                break
        if data.get("eval_loss") is not None:
            metrics["valid_loss"] = data["eval_loss"]
        self.store.add_checkpoint(job["id"], step=int(data["step"]), path=str(data.get("path", "")), metrics=metrics,
                                  created_at=float(ev.get("time") or time.time()))

    def _end(self, job: dict, status: str, *, error: dict | None = None, message: str | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "finished_at": time.time(), "requested": None}
        if error:
            fields["error"] = error
        text = message or (error or {}).get("message") or f"Fine-tuning job {status}"
        self.store.add_events(job["id"], [_server_event(text, level="error" if status == "failed" else "info")], **fields)


def _server_event(message: str, *, level: str = "info", data: dict | None = None) -> dict:
    return {"created_at": time.time(), "level": level, "type": "message", "message": message, "data": data}


def _to_record(ev: dict) -> dict:
    """A kubetune event as a row of job_events (OpenAI's levels and types: metrics events carry train_loss)."""
    kind = ev.get("type", "")
    data = dict(ev.get("data") or {})
    level = {EventType.ERROR.value: "error", EventType.WARNING.value: "warn"}.get(kind, "info")
    is_metrics = kind == EventType.METRICS and data.get("loss") is not None
    if is_metrics:
        data["train_loss"] = data["loss"]
    return {
        "created_at": float(ev.get("time") or time.time()),
        "level": level,
        "type": "metrics" if is_metrics else "message",
        "message": str(ev.get("message") or kind),
        "data": {"kubetune_type": kind, **data},
    }


def _result(job: dict) -> dict | None:
    """The run's result.json (losses, tokens, runtime, ...) as plain JSON, or None."""
    import json

    from ..events import RunDir

    if not job.get("run_dir"):
        return None
    result = RunDir(job["run_dir"]).read_result()
    return json.loads(json.dumps(result, default=str)) if isinstance(result, dict) else None
