"""The server's FastAPI app: OpenAI's files and fine-tuning API over the store and the runner, chat
completions with fine-tuned models (:mod:`kubetune.server.chat`), and the listening loop.

Every error is OpenAI's body ``{"error": {"message", "type", "param", "code"}}``, the same handlers as
``kubetune serve`` (:mod:`kubetune.serve.app`). Another project's file or job is answered 404, exactly as one
that does not exist.
"""

from __future__ import annotations

import logging
import shutil
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse

from ..serve.app import _listen, _url_host, add_error_handlers
from ..serve.protocol import APIError
from .auth import Auth
from .config import ServerConfig
from .files import check_training_file
from .objects import FineTuneRequest, build_spec, checkpoint_object, event_object, file_object, fine_tuned_name, job_object, resolve_hyperparameters
from .runner import Runner
from .store import Store, new_id

__all__ = ["create_app", "run_server"]

log = logging.getLogger("kubetune.server")
# On shutdown, how long open responses may take to end: an event stream (a dashboard left open, a client
# following a job) never ends by itself, and would otherwise hold the server up until it is killed.
GRACEFUL_SHUTDOWN_S = 3


def create_app(config: ServerConfig, store: Store, *, runner: Runner | None = None) -> Any:
    """The server's app; its runner thread starts and stops with it."""
    runner = runner or Runner(store, config)
    auth = Auth(store, config)
    data = config.data_path()
    (data / "files").mkdir(parents=True, exist_ok=True)

    from .chat import ChatModels

    chat = ChatModels(store, config)

    @asynccontextmanager
    async def lifespan(_app):
        runner.start()
        try:
            yield
        finally:
            runner.stop()
            chat.shutdown()

    app = FastAPI(title="kubetune server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.runner, app.state.store, app.state.config, app.state.chat = runner, store, config, chat

    add_error_handlers(app, internals=False)

    project = Depends(auth)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    # -- files ------------------------------------------------------------------------------------
    @app.post("/v1/files")
    async def create_file(request: Request, p: dict = project):
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > config.max_upload_bytes + 64 * 1024:
            raise _too_large(config)
        form = await request.form(max_part_size=config.max_upload_bytes + 1)
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "fine-tune":
            raise APIError(400, f"purpose: '{purpose}' is not supported here; use 'fine-tune'", param="purpose")
        if upload is None or isinstance(upload, str):
            raise APIError(400, "file: missing (send it as multipart/form-data)", param="file")
        file_id = new_id("file")
        filename = upload.filename or "upload.jsonl"
        path = data / "files" / f"{file_id}.jsonl"
        with open(path, "wb") as out:
            shutil.copyfileobj(upload.file, out)
        size = path.stat().st_size
        if size > config.max_upload_bytes:
            path.unlink()
            raise _too_large(config)
        import anyio

        rows, problem = await anyio.to_thread.run_sync(check_training_file, path, filename)
        if problem:
            path.unlink()
            raise APIError(400, f"invalid fine-tuning file: {problem}", param="file", code="invalid_file_format")
        return file_object(store.add_file(p["id"], file_id=file_id, filename=filename, purpose="fine-tune", size=size, path=str(path)))

    @app.get("/v1/files")
    def list_files(purpose: str | None = None, p: dict = project):
        return {"object": "list", "data": [file_object(f) for f in store.list_files(p["id"], purpose)], "has_more": False}

    @app.get("/v1/files/{file_id}")
    def get_file(file_id: str, p: dict = project):
        return file_object(_file(store, p, file_id))

    @app.get("/v1/files/{file_id}/content")
    def file_content(file_id: str, p: dict = project):
        f = _file(store, p, file_id)
        return FileResponse(f["path"], media_type="application/jsonl", filename=f["filename"])

    @app.delete("/v1/files/{file_id}")
    def delete_file(file_id: str, p: dict = project):
        f = store.delete_file(p["id"], file_id)
        if f is None:
            raise _not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # -- fine-tuning jobs -------------------------------------------------------------------------
    @app.post("/v1/fine_tuning/jobs")
    def create_job(body: FineTuneRequest, p: dict = project):
        source = config.models.get(body.model)
        if source is None:
            raise APIError(404, f"model '{body.model}' does not exist or cannot be fine-tuned here; available: {', '.join(config.models) or 'none'}",
                           param="model", code="model_not_found")
        train = _file(store, p, body.training_file, param="training_file")
        valid = _file(store, p, body.validation_file, param="validation_file") if body.validation_file else None
        hp = resolve_hyperparameters(body)
        job_id = new_id("ftjob")
        spec = build_spec(config, job_id, source, hp, train_path=train["path"], valid_path=valid["path"] if valid else None, seed=body.seed)
        job = store.add_job(
            id=job_id, project_id=p["id"], kind="openai", model=body.model, training_file=train["id"],
            validation_file=valid["id"] if valid else None, suffix=body.suffix, seed=spec["training"].get("seed", 42),
            hyperparameters=hp, method={"type": "supervised"}, extra_metadata=body.metadata, spec=spec, status="queued",
            backend=config.backend, fine_tuned_model=fine_tuned_name(body.model, body.suffix, job_id),
        )
        store.add_events(job_id, [{"created_at": time.time(), "level": "info", "type": "message", "message": f"Created fine-tuning job: {job_id}", "data": None},
                                  {"created_at": time.time(), "level": "info", "type": "message", "message": "Files validated, job queued", "data": None}])
        runner.wake()
        return job_object(job)

    @app.get("/v1/fine_tuning/jobs")
    def list_jobs(after: str | None = None, limit: int = 20, p: dict = project):
        jobs, more = store.list_jobs(p["id"], after=after, limit=_limit(limit), kind="openai")
        return {"object": "list", "data": [job_object(j) for j in jobs], "has_more": more}

    @app.get("/v1/fine_tuning/jobs/{job_id}")
    def get_job(job_id: str, p: dict = project):
        return job_object(_job(store, p, job_id))

    @app.post("/v1/fine_tuning/jobs/{job_id}/cancel")
    def cancel_job(job_id: str, p: dict = project):
        job = _job(store, p, job_id)
        if job["status"] in ("succeeded", "failed", "cancelled"):
            raise APIError(400, f"job {job_id} has already ended ({job['status']}); nothing to cancel", code="job_ended")
        return job_object(runner.cancel(job))

    @app.post("/v1/fine_tuning/jobs/{job_id}/pause")
    def pause_job(job_id: str, p: dict = project):
        job = _job(store, p, job_id)
        if job["status"] not in ("queued", "running"):
            raise APIError(400, f"job {job_id} is {job['status']}; only a queued or running job can be paused", code="invalid_state")
        return job_object(runner.pause(job))

    @app.post("/v1/fine_tuning/jobs/{job_id}/resume")
    def resume_job(job_id: str, p: dict = project):
        job = _job(store, p, job_id)
        if job["status"] != "paused":
            raise APIError(400, f"job {job_id} is {job['status']}; only a paused job can be resumed", code="invalid_state")
        return job_object(runner.resume(job))

    @app.get("/v1/fine_tuning/jobs/{job_id}/events")
    def job_events(job_id: str, after: str | None = None, limit: int = 20, p: dict = project):
        _job(store, p, job_id)
        events, more = store.list_events(job_id, after=after, limit=_limit(limit))
        return {"object": "list", "data": [event_object(e) for e in events], "has_more": more}

    @app.get("/v1/fine_tuning/jobs/{job_id}/checkpoints")
    def job_checkpoints(job_id: str, after: str | None = None, limit: int = 10, p: dict = project):
        job = _job(store, p, job_id)
        cks, more = store.list_checkpoints(job_id, after=after, limit=_limit(limit))
        data = [checkpoint_object(c, job) for c in cks]
        return {"object": "list", "data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    from .native import register as register_native

    register_native(app, store, runner, config, project)
    from .sweeps import register as register_sweeps

    register_sweeps(app, store, runner, config, project)
    from .post_training import register as register_post_training

    register_post_training(app, store, runner, config, project)
    from .dashboard import register as register_dashboard

    register_dashboard(app, store, config, project)  # the web dashboard at / (docs/dashboard.md)

    # -- models and chat --------------------------------------------------------------------------
    @app.get("/v1/models")
    def list_models(p: dict = project):
        return {"object": "list", "data": chat.model_cards(p)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, p: dict = project):
        return await chat.complete(request, p)

    return app


def run_server(config: ServerConfig, store: Store) -> None:
    """Serve until interrupted (uvicorn), on a socket bound first (a busy port is the first thing to know)."""
    import uvicorn

    sock = _listen(config.host, config.port)
    app = create_app(config, store)
    port = sock.getsockname()[1]
    keys = "API keys required" if store.has_keys() else "no API keys: open to this machine only"
    print(f"kubetune server at http://{_url_host(config.host)}:{port}/v1 (backend {config.backend}, {keys})", flush=True)
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=port, log_level="warning",
                                  timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)).run(sockets=[sock])


# --- helpers ---------------------------------------------------------------------------------------
def _not_found(kind: str, ident: str, param: str | None = None) -> APIError:
    return APIError(404, f"No such {kind}: '{ident}'", param=param, code=f"{kind}_not_found".replace(" ", "_"))


def _file(store: Store, p: dict, file_id: str, *, param: str | None = None) -> dict:
    f = store.get_file(p["id"], file_id)
    if f is None:
        raise _not_found("file", file_id, param)
    return f


def _job(store: Store, p: dict, job_id: str) -> dict:
    job = store.get_job(p["id"], job_id)
    if job is None:
        raise _not_found("fine-tuning job", job_id)
    return job


def _limit(limit: int) -> int:
    if not 1 <= limit <= 100:
        raise APIError(400, f"limit: {limit} is outside [1, 100]", param="limit")
    return limit


def _too_large(config: ServerConfig) -> APIError:
    return APIError(413, f"the file is larger than this server accepts ({config.max_upload_bytes} bytes, max_upload_bytes)", code="file_too_large")
