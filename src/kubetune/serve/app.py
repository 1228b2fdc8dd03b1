"""The OpenAI-compatible HTTP server: FastAPI routes in front of the transformers engine.

This module imports FastAPI at the top (its route annotations need the real types); nothing imports it
until a server is built, so the CLI stays light.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON or SSE
streaming), ``GET /health``, ``GET /metrics``. Every error is OpenAI's body
``{"error": {"message", "type", "param", "code"}}``.

This module owns the app and its wiring: the routes, the error handlers, the middleware (API key, body
size, request metrics, the end of every admitted request) and the listening socket. What the completions
routes do with a request (prompts, sampling, admission, JSON or streamed answers) is
:mod:`kubetune.serve.completions`'s.
"""

from __future__ import annotations

import errno
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .completions import _Server
from .loading import LoadedModels, load_engine, set_inference_threads
from .metrics import ServeMetrics
from .options import ServeOptions
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body, param_path
from .sources import ServePlan

__all__ = ["create_app", "run_server"]

log = logging.getLogger("kubetune.serve")

# Metric label of each endpoint (anything else is "other": unknown paths must not grow the label set).
_ENDPOINTS = {"/v1/models": "models", "/v1/chat/completions": "chat", "/v1/completions": "completions", "/health": "health", "/metrics": "metrics"}


def create_app(plan: ServePlan, options: ServeOptions, *, loaded: LoadedModels | None = None) -> Any:
    """The FastAPI app serving ``plan`` (loads the model unless ``loaded`` is given).

    The engine thread starts with the app (its lifespan) and stops with it.
    """
    metrics = ServeMetrics()
    loaded = loaded or load_engine(plan, options)
    loaded.engine.on_step = metrics.on_step
    loaded.engine.on_preempt = metrics.preemptions.inc
    server = _Server(plan, options, loaded, metrics)
    metrics.bind(running=lambda: loaded.engine.running, waiting=lambda: loaded.engine.waiting, admitted=lambda: server.admission.used)

    @asynccontextmanager
    async def lifespan(_app):
        loaded.engine.start()
        try:
            yield
        finally:
            loaded.engine.shutdown()

    app = FastAPI(title="kubetune", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server

    add_error_handlers(app, internals=True)

    app.add_middleware(_Gate, api_key=options.api_key, metrics=metrics, max_body=options.max_request_bytes)

    # -- routes -----------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not loaded.engine.alive:
            return JSONResponse({"status": "error", "message": "the engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [server.model_card(m) for m in plan.model_ids]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        return server.model_card(server.check_model(model_id))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        job = server.chat_job(body)
        request.state.model = job.model
        server.admit(job, request)
        if body.stream:
            return StreamingResponse(server.stream(job, chat=True), media_type="text/event-stream", headers=_SSE_HEADERS)
        return await server.collect(job, chat=True, request=request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        job = server.completion_job(body)
        request.state.model = job.model
        server.admit(job, request)
        if body.stream:
            return StreamingResponse(server.stream(job, chat=False), media_type="text/event-stream", headers=_SSE_HEADERS)
        return await server.collect(job, chat=False, request=request)

    return app


def run_server(plan: ServePlan, options: ServeOptions) -> None:
    """Load the model and serve until interrupted (uvicorn)."""
    import uvicorn

    sock = _listen(options.host, options.port)  # before loading the model: a busy port is the first thing to know
    threads = set_inference_threads(options.device)
    if threads:
        print(threads, flush=True)
    app = create_app(plan, options)
    port = sock.getsockname()[1]
    where = f"http://{_url_host(options.host)}:{port}/v1"
    print(f"serving {', '.join(plan.model_ids)} at {where}" + (" (API key required)" if options.api_key else ""), flush=True)
    uvicorn.Server(uvicorn.Config(app, host=options.host, port=port, log_level=options.log_level)).run(sockets=[sock])


def _listen(host: str, port: int) -> Any:
    """The server's socket, bound now.

    Raises:
        BackendError: the address cannot be bound (port in use, address not on this machine).
    """
    import socket

    from ..errors import BackendError

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise BackendError(f"--host {host}: {e}", hint="use an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like uvicorn: a restart need not wait for TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise BackendError(
            f"cannot listen on {_url_host(host)}:{port}: {e.strerror or e}",
            hint="choose another --port, or stop the server that uses it" if e.errno == errno.EADDRINUSE else "use an address of this machine (--host)",
        ) from None
    sock.set_inheritable(True)
    return sock


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Gate:
    """ASGI middleware: the API key check on /v1/*, the body size limit, the request counter (endpoint, model,
    status), and the end of every admitted request: whatever way its response ends (finished, failed, client
    gone, even before a stream started), its engine requests are cancelled and its admission tokens released."""

    def __init__(self, app: Any, *, api_key: str | None, metrics: ServeMetrics, max_body: int) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = _ENDPOINTS.get(path, "other")
        if self.api_key and path.startswith("/v1"):
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization")
            problem = _check_key(auth.decode("latin-1") if auth else None, self.api_key)
            if problem:
                self.metrics.observe_request(endpoint, "", 401)
                response = JSONResponse(error_body(problem, code="invalid_api_key"), status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.max_body:
            await self._too_large(scope, receive, send, endpoint)
            return
        status = 500
        received = 0
        too_large = False

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if too_large:  # the app's answer to a body it could not read whole is replaced by the 413 below
                return
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def receive_counted() -> dict:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:  # a body sent without a length (chunked): stop reading it
                    too_large = True
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, receive_counted, send_and_note)
        except _BodyTooLarge:
            pass
        finally:
            state = scope.get("state") or {}
            job = state.get("job")
            if job is not None:
                job.release()
            if not too_large:
                self.metrics.observe_request(endpoint, state.get("model", ""), status)
        if too_large:
            await self._too_large(scope, receive, send, endpoint)

    async def _too_large(self, scope: dict, receive: Any, send: Any, endpoint: str) -> None:
        self.metrics.observe_request(endpoint, "", 413)
        message = f"the request body is larger than this server accepts ({self.max_body} bytes, kubetune serve --max-request-bytes)"
        response = JSONResponse(error_body(message, code="request_too_large"), status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)


class _BodyTooLarge(Exception):
    """Raised into the app when a request body passes the size limit while it is being read."""


# --- helpers ---------------------------------------------------------------------------------------
def _check_key(header: str | None, key: str) -> str | None:
    """None when ``header`` carries the key, else the reason."""
    if not header:
        return "Missing API key: send the header 'Authorization: Bearer YOUR_KEY'"
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        return "Incorrect API key provided"
    return None


def add_error_handlers(app, *, internals: bool) -> None:
    """Every error as OpenAI's error body: APIError as raised, request validation as a 400 naming the fields,
    routing errors with the method and path, and anything else as a 500 (``internals``: with the exception's
    message, for a single user's ``kubetune serve``; a shared server names only its type)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        return JSONResponse(_validation_body(e.errors()), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {e.detail}", code=str(e.status_code)), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):
        log.exception("unhandled error")
        what = f"{type(e).__name__}: {e}" if internals else type(e).__name__
        return JSONResponse(error_body(f"internal server error: {what}", type="server_error"), status_code=500)


def _validation_body(errors: list) -> dict:
    """The first validation problem as OpenAI's 400 body; the message lists every problem with its field."""
    problems = []
    first_param = None
    for e in errors:
        loc = tuple(e.get("loc") or ())
        if e.get("type") == "json_invalid":
            problems.append(f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            continue
        param = param_path(loc)
        if param is None:
            problems.append("the request body must be a JSON object" if e.get("type") != "missing" else "the request body is missing")
            continue
        first_param = first_param or param
        msg = "field required" if e.get("type") == "missing" else e.get("msg", "invalid value")
        problems.append(f"{param}: {msg.removeprefix('Value error, ')}")
    unique = list(dict.fromkeys(problems))
    return error_body("; ".join(unique) or "invalid request body", param=first_param)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _version() -> str:
    from .._version import __version__

    return __version__
