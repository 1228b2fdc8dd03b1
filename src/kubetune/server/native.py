"""kubetune's own API, for what OpenAI's shape cannot say: a full kubetune spec submitted to ``/v1/jobs``,
jobs listed, read, cancelled and deleted, events as Server-Sent Events, the worker's log streamed, and the run
directory's files downloadable. :class:`kubetune.backends.remote.RemoteBackend` (``kubetune.Client(URL)``, the
CLI's ``--server``) is its client."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, StreamingResponse

from ..errors import KubetuneError, SpecError
from ..serve.protocol import APIError
from .config import ServerConfig
from .runner import TERMINAL, Runner
from .objects import fine_tuned_name
from .store import Store, new_id

__all__ = ["register", "native_job"]

MAX_SPEC_BYTES = 1024 * 1024


def native_job(j: dict, progress: dict | None = None) -> dict:
    """The ``kubetune.job`` object: what the server knows of a job (any kind: native or OpenAI)."""
    ref = j.get("backend_ref") or {}
    return {
        "object": "kubetune.job", "id": j["id"], "name": (j.get("spec") or {}).get("name"), "kind": j["kind"], "status": j["status"],
        "model": j["model"], "backend": j["backend"], "backend_job_id": ref.get("id"), "run_dir": j.get("run_dir"),
        "created_at": j["created_at"], "started_at": j.get("started_at"), "finished_at": j.get("finished_at"),
        "error": j.get("error"), "fine_tuned_model": j["fine_tuned_model"] if j["status"] == "succeeded" else None,
        "progress": progress or {},
    }


def register(app: FastAPI, store: Store, runner: Runner, config: ServerConfig, project: Any) -> None:
    """Add the native routes to ``app`` (``project``: the auth dependency)."""

    def job_of(p: dict, job_id: str) -> dict:
        job = store.get_job(p["id"], job_id)
        if job is None:
            raise APIError(404, f"No such job: '{job_id}'", code="job_not_found")
        return job

    @app.post("/v1/jobs")
    async def submit(request: Request, p: dict = project):
        body = await request.body()
        if len(body) > MAX_SPEC_BYTES:
            raise APIError(413, f"the spec is larger than {MAX_SPEC_BYTES} bytes", code="request_too_large")
        spec = _parse_spec(body, request.headers.get("content-type", ""))
        job_id = new_id("job")
        if config.backend == "local":  # the server's data directory holds every local run, one per job
            spec.setdefault("output", {})["dir"] = str(config.data_path() / "runs" / job_id)
        from ..spec import load_spec, spec_to_dict

        try:
            job = load_spec(spec)
        except SpecError as e:
            raise APIError(400, f"invalid spec: {e.message}", param="spec", code="invalid_spec") from None
        if job.entrypoint is not None:  # an API client's code would run with the server's privileges, on its machines
            raise APIError(400, "invalid spec: entrypoint: the jobs server runs the built-in fine-tune only, never a client's "
                           "own training function; run it with kubetune run (docs/custom-training.md)", param="spec", code="invalid_spec")
        if job.dataset is not None and job.dataset.preprocess is not None:  # the same: a client's code in the server's workers
            raise APIError(400, "invalid spec: dataset.preprocess: the jobs server runs no client code; preprocess the rows first and "
                           "upload the result (or run the job with kubetune run)", param="spec", code="invalid_spec")
        resolved = spec_to_dict(job)
        rec = store.add_job(id=job_id, project_id=p["id"], kind="native", model=job.model.source, hyperparameters={}, method={"type": job.method.type},
                            spec=resolved, status="queued", backend=config.backend,
                            fine_tuned_model=fine_tuned_name(job.model.source, job.name, job_id))  # chat with it once it succeeded
        store.add_events(job_id, [{"created_at": time.time(), "level": "info", "type": "message", "message": f"Created job: {job_id} ({job.name})", "data": None}])
        runner.wake()
        return native_job(rec)

    @app.get("/v1/jobs")
    def list_jobs(after: str | None = None, limit: int = 20, p: dict = project):
        if not 1 <= limit <= 100:
            raise APIError(400, f"limit: {limit} is outside [1, 100]", param="limit")
        jobs, more = store.list_jobs(p["id"], after=after, limit=limit)
        return {"object": "list", "data": [native_job(j) for j in jobs], "has_more": more}

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, p: dict = project):
        job = job_of(p, job_id)
        return native_job(job, _progress(store, job_id))

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, p: dict = project):
        job = job_of(p, job_id)
        if job["status"] not in TERMINAL:
            job = runner.cancel(job)
        return native_job(job)

    @app.delete("/v1/jobs/{job_id}")
    def delete(job_id: str, p: dict = project):
        job = job_of(p, job_id)
        if job["status"] not in TERMINAL:
            runner.cancel(job)
        store.delete_job(job_id)
        run_dir = job.get("run_dir")
        if run_dir and config.backend == "local" and Path(run_dir).resolve().is_relative_to(config.data_path().resolve()):
            shutil.rmtree(run_dir, ignore_errors=True)
        return {"id": job_id, "object": "kubetune.job", "deleted": True}

    @app.get("/v1/jobs/{job_id}/events")
    async def events(job_id: str, request: Request, stream: bool = False, after: int = 0, p: dict = project):
        job_of(p, job_id)
        if not stream and "text/event-stream" not in request.headers.get("accept", ""):
            rows, _ = store.list_events(job_id, after=f"ev-{after}" if after else None, limit=10_000, oldest_first=True)
            return {"object": "list", "data": [_event(e) for e in rows]}
        return StreamingResponse(_sse(store, job_id, after, config.poll_seconds), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(job_id: str, follow: bool = False, p: dict = project):
        job = job_of(p, job_id)
        return StreamingResponse(_log_lines(store, runner, job, follow), media_type="text/plain; charset=utf-8")

    @app.get("/v1/jobs/{job_id}/artifacts")
    def artifacts(job_id: str, p: dict = project):
        root = _run_dir(job_of(p, job_id))
        files = sorted(x for x in root.rglob("*") if x.is_file() and not x.is_symlink()) if root else []
        return {"object": "list", "data": [{"path": str(x.relative_to(root)), "bytes": x.stat().st_size} for x in files]}

    @app.get("/v1/jobs/{job_id}/artifacts/{path:path}")
    def artifact(job_id: str, path: str, p: dict = project):
        root = _run_dir(job_of(p, job_id))
        target = (root / path).resolve() if root else None
        if target is None or not target.is_relative_to(root.resolve()) or not target.is_file():
            raise APIError(404, f"job {job_id} has no file '{path}'", code="artifact_not_found")
        return FileResponse(target, filename=target.name)


def _parse_spec(body: bytes, content_type: str) -> dict:
    try:
        if "json" in content_type:
            data = json.loads(body)
            data = data.get("spec", data) if isinstance(data, dict) and isinstance(data.get("spec"), dict) else data
        else:  # the spec's bounded YAML reader: an alias bomb or a duplicate key is refused, not expanded
            from ..spec.reader import parse_spec_text

            data = parse_spec_text(body.decode("utf-8"), "spec")[0]
    except SpecError as e:
        raise APIError(400, f"the spec is not valid YAML: {e.message}", param="spec", code="invalid_spec") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSON's errors, and a YAML body that is not UTF-8
        raise APIError(400, f"the spec is not valid {'JSON' if 'json' in content_type else 'YAML'}: {e}", param="spec", code="invalid_spec") from None
    if not isinstance(data, dict):
        raise APIError(400, "the spec must be a mapping of sections (name, model, dataset, ...)", param="spec", code="invalid_spec")
    return data


def _event(e: dict) -> dict:
    data = dict(e.get("data") or {})
    kind = data.pop("kubetune_type", None) or ("metrics" if e["type"] == "metrics" else "server")
    data.pop("train_loss", None)
    return {"id": e["seq"], "time": e["created_at"], "type": kind, "level": e["level"], "message": e["message"], "data": data}


def _progress(store: Store, job_id: str) -> dict:
    rows, _ = store.list_events(job_id, limit=50)
    for e in rows:
        d = e.get("data") or {}
        if e["type"] == "metrics" and d.get("step") is not None:
            return {k: d.get(k) for k in ("step", "total_steps", "epoch", "loss", "learning_rate", "eta_seconds") if d.get(k) is not None}
    return {}


async def _sse(store: Store, job_id: str, after: int, poll: float):
    import anyio

    last = after
    while True:
        rows, _ = await anyio.to_thread.run_sync(lambda: store.list_events(job_id, after=f"ev-{last}" if last else None, limit=500, oldest_first=True))
        for e in rows:
            last = e["seq"]
            yield f"id: {last}\ndata: {json.dumps(_event(e), separators=(',', ':'))}\n\n"
        if not rows:
            job = await anyio.to_thread.run_sync(store.get_job, None, job_id)
            if job is None or job["status"] in (*TERMINAL, "paused"):
                yield f"event: end\ndata: {json.dumps({'status': job['status'] if job else 'deleted'})}\n\n"
                return
            await asyncio.sleep(poll)


def _log_lines(store: Store, runner: Runner, job: dict, follow: bool):
    from ..backends import JobRef

    while follow and not job.get("backend_ref") and job["status"] not in TERMINAL:  # queued: its log begins once it starts
        time.sleep(0.5)
        job = store.get_job(None, job["id"]) or job
    if not job.get("backend_ref"):
        return
    try:
        for line in runner.client.logs(JobRef(**job["backend_ref"]), follow=follow):
            yield line + "\n"
    except KubetuneError as e:
        yield f"(log unavailable: {e.message})\n"


def _run_dir(job: dict) -> Path | None:
    run_dir = job.get("run_dir")
    return Path(run_dir) if run_dir and Path(run_dir).is_dir() else None
