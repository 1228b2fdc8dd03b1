"""Chat completions with the server's models: a finished job's ``fine_tuned_model`` or a base model of the
configuration, through ``kubetune serve``'s engine. LoRA fine-tunes of one base share that base's engine, their
adapters batched together as ``kubetune serve BASE --adapter ...`` does. Engines load on the first request for a
model and stay loaded (the least recently used one is unloaded beyond ``MAX_LOADED``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from sqlalchemy import select

from ..errors import KubetuneError
from ..serve.protocol import APIError, ChatCompletionRequest
from .config import ServerConfig
from .models import Job
from .store import Store

__all__ = ["ChatModels", "MAX_LOADED"]

MAX_LOADED = 4
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChatModels:
    """The models one project may chat with, loaded on demand through ``kubetune serve``'s stack."""

    def __init__(self, store: Store, config: ServerConfig) -> None:
        self.store = store
        self.config = config
        self._groups: OrderedDict[str, dict] = OrderedDict()  # engine key (a base model's URI) -> {server, adapters}
        self._servers: dict[str, str] = {}  # model id -> its engine's key
        self._lock = threading.Lock()

    def model_cards(self, project: dict) -> list[dict]:
        """``/v1/models``: the configured base models and the project's fine-tuned ones."""
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "kubetune", "root": src} for name, src in self.config.models.items()]
        with self.store.session() as s:
            rows = s.execute(select(Job.fine_tuned_model, Job.finished_at, Job.model).where(
                Job.project_id == project["id"], Job.status == "succeeded", Job.fine_tuned_model.is_not(None)).order_by(Job.seq)).all()
        cards += [{"id": ft, "object": "model", "created": int(at or 0), "owned_by": project["name"], "parent": base} for ft, at, base in rows]
        return cards

    async def complete(self, request: Request, project: dict) -> Any:
        """Answer a chat completion request (JSON or SSE) with the model it names."""
        import anyio

        from ..serve.app import _validation_body

        try:
            raw = await request.json()
        except ValueError as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        try:
            body = ChatCompletionRequest.model_validate(raw)
        except ValidationError as e:
            return JSONResponse(_validation_body(e.errors()), status_code=400)
        source = self._source(body.model, project)
        server = await anyio.to_thread.run_sync(self._server, body.model, source)
        job = server.chat_job(body)
        server.admit(job, request)
        if body.stream:
            async def stream():
                try:
                    async for chunk in server.stream(job, chat=True):
                        yield chunk
                finally:
                    job.release()

            return StreamingResponse(stream(), media_type="text/event-stream", headers=_SSE_HEADERS)
        try:
            return await server.collect(job, chat=True, request=request)
        finally:
            job.release()

    def shutdown(self) -> None:
        """Stop every loaded engine."""
        with self._lock:
            for group in self._groups.values():
                group["server"].loaded.engine.shutdown()
            self._groups.clear()
            self._servers.clear()

    def _source(self, model: str, project: dict) -> str:
        if model in self.config.models:
            return self.config.models[model]
        with self.store.session() as s:
            row = s.execute(select(Job.run_dir, Job.spec).where(Job.project_id == project["id"], Job.fine_tuned_model == model,
                                                                Job.status == "succeeded")).first()
        if row is None:  # another project's model is as absent as one that never existed
            raise APIError(404, f"The model `{model}` does not exist or you do not have access to it", param="model", code="model_not_found")
        if row.run_dir:
            return row.run_dir
        uri = ((row.spec or {}).get("output") or {}).get("uri")  # a cluster's job: its outputs were published there
        if not uri:
            raise APIError(400, f"the model `{model}` was trained on a cluster without output.uri: its outputs stayed there",
                           param="model", code="model_not_loadable")
        return uri

    def _server(self, model: str, source: str) -> Any:
        """The engine serving ``model``: LoRA fine-tunes share one engine per base model (their adapters batched
        together, as ``kubetune serve BASE --adapter ...`` does); adding one reloads that engine with every adapter
        it served so far, and the old engine ends once its requests are answered."""
        from ..serve.sources import resolve_sources

        with self._lock:
            if model in self._servers:
                key = self._servers[model]
                self._groups.move_to_end(key)
                return self._groups[key]["server"]
            try:
                alone = resolve_sources(source, served_model_name=model)
                if alone.adapters and alone.base_uri:  # a LoRA run: its base's engine, with this adapter added
                    key = alone.base_uri
                    adapters = {**self._groups.get(key, {}).get("adapters", {}), model: source}
                    plan = resolve_sources(key, adapters, served_model_name=self._base_name(key))
                elif model in self.config.models:  # a base model: its engine, with the adapters it already serves
                    key = source
                    adapters = dict(self._groups.get(key, {}).get("adapters", {}))
                    plan = resolve_sources(source, adapters, served_model_name=model) if adapters else alone
                else:  # a full fine-tune or merged model: an engine of its own
                    key, adapters, plan = source, {}, alone
                server = _load(plan)
            except KubetuneError as e:
                raise APIError(400, f"the model `{model}` cannot be loaded: {e.message}", param="model", code="model_not_loadable") from None
            old = self._groups.pop(key, None)
            self._groups[key] = {"server": server, "adapters": adapters}
            for name in plan.model_ids:
                self._servers[name] = key
            if old is not None:
                _retire(old["server"])
            while len(self._groups) > MAX_LOADED:
                gone, group = self._groups.popitem(last=False)
                for name in [n for n, k in self._servers.items() if k == gone]:
                    del self._servers[name]
                _retire(group["server"])
            return server

    def _base_name(self, uri: str) -> str:
        from ..serve.sources import model_name_from_uri

        return next((name for name, src in self.config.models.items() if src == uri), model_name_from_uri(uri))


def _load(plan: Any) -> Any:
    from ..serve.completions import _Server
    from ..serve.loading import load_engine
    from ..serve.metrics import ServeMetrics
    from ..serve.options import make_options

    options = make_options(served_model_name=plan.default_model)
    loaded = load_engine(plan, options)
    server = _Server(plan, options, loaded, ServeMetrics())
    loaded.engine.start()
    return server


def _retire(server: Any, grace_s: float = 120.0) -> None:
    """End an engine once the requests it admitted are answered (at most ``grace_s`` seconds from now)."""
    import time

    def wait_and_stop() -> None:
        deadline = time.monotonic() + grace_s
        while server.admission.used and time.monotonic() < deadline:
            time.sleep(0.2)
        server.loaded.engine.shutdown()

    threading.Thread(target=wait_and_stop, name="kubetune-retire-engine", daemon=True).start()
