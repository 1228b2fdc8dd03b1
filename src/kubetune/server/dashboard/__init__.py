"""The web dashboard (docs/dashboard.md): a single page served at ``/`` with its assets under ``/dashboard/``
(plain HTML, CSS and JavaScript in ``static/``, uPlot vendored: nothing from a CDN), and the few API routes it
needs beyond the native ones, all behind the same API keys:

* ``GET /v1/dashboard/jobs``: a page of jobs (``status``, ``q``, ``after``, ``limit``) with progress and sparklines;
* ``GET /v1/dashboard/jobs/{id}``: one job's summary with its resolved spec;
* ``GET /v1/dashboard/stream``: Server-Sent Events, one ``job`` event (the job's summary) whenever a job of the
  key's project is created or records an event, so the jobs table updates without fetching the list again;
* ``POST /v1/jobs/validate``: a YAML spec checked as ``POST /v1/jobs`` would, each problem with its field and line.

The page itself needs no key: it asks for one (kept in the browser's sessionStorage) and sends it as
``Authorization: Bearer`` with every request, reading event streams with fetch rather than EventSource (which
cannot send the header), so keys never appear in URLs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, StreamingResponse

from ...serve.protocol import APIError
from ..config import ServerConfig
from ..native import MAX_SPEC_BYTES
from ..store import Store
from .queries import JOB_STATES, changes_since, high_water, job_summary, list_jobs
from .validate import validate_spec_text

__all__ = ["register", "STATIC_DIR", "ASSETS_PATH"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
ASSETS_PATH = "/dashboard"  # where static/ is served
INDEX_HTML = "index.html"
DEFAULT_PAGE = 50
MAX_PAGE = 200
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies from closing an idle stream
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def register(app: FastAPI, store: Store, config: ServerConfig, project: Any) -> None:
    """Serve the dashboard at ``/`` and add its API routes (``project``: the auth dependency)."""
    from starlette.staticfiles import StaticFiles

    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC_DIR), name="dashboard")

    @app.get("/", include_in_schema=False)
    def index():
        return FileResponse(STATIC_DIR / INDEX_HTML, media_type="text/html", headers={"Cache-Control": "no-cache"})

    @app.get("/v1/dashboard/jobs")
    def dashboard_jobs(status: str | None = None, q: str | None = None, after: str | None = None, limit: int = DEFAULT_PAGE,
                       p: dict = project):
        if status and status not in JOB_STATES:
            raise APIError(400, f"status: '{status}' is not one of {', '.join(JOB_STATES)}", param="status")
        if not 1 <= limit <= MAX_PAGE:
            raise APIError(400, f"limit: {limit} is outside [1, {MAX_PAGE}]", param="limit")
        jobs, more = list_jobs(store, p["id"], status=status or None, query=(q or "").strip() or None, after=after, limit=limit)
        return {"object": "list", "data": jobs, "has_more": more}

    @app.get("/v1/dashboard/jobs/{job_id}")
    def dashboard_job(job_id: str, p: dict = project):
        job = store.get_job(p["id"], job_id)
        if job is None:
            raise APIError(404, f"No such job: '{job_id}'", code="job_not_found")
        return {**job_summary(store, job), "spec": job.get("spec") or {}, "sweep_values": job.get("sweep_values")}

    @app.get("/v1/dashboard/stream")
    async def dashboard_stream(request: Request, p: dict = project):
        return StreamingResponse(_changes(request, store, p["id"], config.poll_seconds), media_type="text/event-stream", headers=_SSE_HEADERS)

    @app.post("/v1/jobs/validate")
    async def validate(request: Request, p: dict = project):
        import anyio

        body = await request.body()
        if len(body) > MAX_SPEC_BYTES:
            raise APIError(413, f"the spec is larger than {MAX_SPEC_BYTES} bytes", code="request_too_large")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise APIError(400, "the spec is not UTF-8 text", param="spec", code="invalid_spec") from None
        return {"object": "kubetune.spec_check", **await anyio.to_thread.run_sync(validate_spec_text, text)}


async def _changes(request: Request, store: Store, project_id: str, poll: float):
    """``event: job`` with each changed job's summary, polling the database every ``poll`` seconds."""
    import anyio

    job_seq, event_seq = await anyio.to_thread.run_sync(high_water, store)
    yield "event: ready\ndata: {}\n\n"
    idle = 0.0
    while not await request.is_disconnected():
        jobs, job_seq, event_seq = await anyio.to_thread.run_sync(changes_since, store, project_id, job_seq, event_seq)
        for job in jobs:
            yield f"event: job\ndata: {json.dumps(job, separators=(',', ':'))}\n\n"
        idle = 0.0 if jobs else idle + poll
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield ": keepalive\n\n"
        await asyncio.sleep(poll)
