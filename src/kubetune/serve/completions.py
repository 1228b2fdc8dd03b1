"""The completions endpoints' work: OpenAI requests in, engine generations out, and back as responses.

:class:`_Server` (one per app, built by :func:`kubetune.serve.app.create_app`) turns a validated
``/v1/chat/completions`` or ``/v1/completions`` body into a :class:`_Job` (the model and adapter, prompts
rendered with the model's chat template and tools, sampling parameters within the context length), admits
it (:mod:`kubetune.serve.admission`), submits its generations to the engine and answers with one JSON body
(:meth:`_Server.collect`) or an SSE stream (:meth:`_Server.stream`), tool calls split out of the replies.
It also answers which models are served (``/v1/models``). The routes themselves, the middleware and error
bodies are the app's (:mod:`kubetune.serve.app`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..data.templates import unrendered_tool_name
from .admission import Admission, Limits, Ticket
from .engine import EngineOutput, EngineRequest, SamplingParams
from .loading import LoadedModels
from .metrics import ServeMetrics
from .options import ServeOptions
from .protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    new_id,
    now,
)
from .sources import ServePlan
from .tools import ToolRequestError, ToolStream, parse_tool_calls, request_messages, request_tools

_DISCONNECT_POLL_SECONDS = 0.25  # how often a waiting non-streaming request checks that its client is still there


class _Job:
    """One API request as engine requests: the prompts, how each is sampled, how choices are labelled."""

    def __init__(self, model: str, endpoint: str, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None, *, n: int, include_usage: bool, echo: list[str] | None = None) -> None:
        self.model = model
        self.endpoint = endpoint
        self.prompts = prompts  # one per choice
        self.params = params  # one per choice
        self.adapter = adapter
        self.n = n
        self.include_usage = include_usage
        self.echo = echo  # completions with echo: the prompt text of each choice
        self.tool_calls = False  # chat with tools offered: replies are read for <tool_call> blocks (serve/tools.py)
        self.max_tokens_given = False  # the request set max_tokens (else the server's default filled it in)
        self.started = time.monotonic()
        self.id = new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        self.created = now()
        self.ticket: Ticket | None = None  # its admission tokens, once admitted
        self.requests: list[EngineRequest] = []  # its generations, once submitted

    @property
    def prompt_tokens(self) -> int:
        # n choices of one prompt count the prompt once, like OpenAI's usage
        return sum(len(p) for p in self.prompts[:: self.n])

    def release(self) -> None:
        """The request is over (answered, failed or abandoned): stop its generations, give back its tokens."""
        for r in self.requests:
            r.cancel()  # no-op for finished ones
        if self.ticket is not None:
            self.ticket.release()


class _Server:
    """Turns validated requests into engine requests and engine outputs into responses."""

    def __init__(self, plan: ServePlan, options: ServeOptions, loaded: LoadedModels, metrics: ServeMetrics) -> None:
        self.plan = plan
        self.options = options
        self.loaded = loaded
        self.metrics = metrics
        self.created = now()
        engine = loaded.engine
        self.admission = Admission(Limits(options, loaded.context_length), throughput=lambda: getattr(engine, "tokens_per_second", 0.0))
        self._token_chars = max(map(len, loaded.tokenizer.get_vocab()), default=1)  # the longest token's characters

    # -- models -----------------------------------------------------------------------------------
    def check_model(self, model: str) -> str:
        """``model`` when it is served, else 404 (``model_not_found``) listing the served ids."""
        if model not in self.plan.model_ids:
            raise APIError(
                404,
                f"The model `{model}` does not exist. Available models: {', '.join(self.plan.model_ids)}",
                param="model",
                code="model_not_found",
            )
        return model

    def model_card(self, model: str) -> dict:
        """The ``/v1/models`` entry of a served model id (``parent``: the base model, for an adapter)."""
        adapter = self.plan.adapter_for(model)
        return {
            "id": model,
            "object": "model",
            "created": self.created,
            "owned_by": "kubetune",
            "root": adapter.uri if adapter else (self.plan.base_uri or str(self.plan.model_dir)),
            "parent": self.plan.model_name if adapter else None,
            "max_model_len": self.loaded.context_length,
        }

    # -- requests -> engine jobs --------------------------------------------------------------------
    def chat_job(self, body: ChatCompletionRequest) -> _Job:
        """A chat request as a job: its messages (and tools) rendered with the model's chat template; 400/404 when it cannot be."""
        model = self.check_model(body.model)
        _refuse_unsupported(body.unsupported())
        self.admission.check_shape(n=body.n, prompts=1, messages=len(body.messages))
        chars = sum(len(m.text()) for m in body.messages) + _json_chars(body.tools) + sum(_json_chars(m.tool_calls) for m in body.messages)
        self.admission.check_text(chars, field="messages", max_token_chars=self._token_chars)
        try:
            messages = request_messages(body.messages)
            tools = request_tools(body.tools)
        except ToolRequestError as e:
            raise APIError(400, str(e), param=e.param) from None
        tok = self.loaded.chat_tokenizers.get(model, self.loaded.tokenizer)
        if not getattr(tok, "chat_template", None):
            raise APIError(400, f"the model `{model}` has no chat template; use /v1/completions with a plain prompt", param="messages")
        extra = {"tools": tools} if tools else {}
        try:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, **extra)["input_ids"]
            if tools or any(m.get("tool_calls") for m in messages):
                _check_tools_rendered(tok, tools, messages, model)
        except APIError:
            raise
        except Exception as e:  # the template itself refuses (e.g. roles must alternate)
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
        params = self._params(body, len(ids), prompt_field="messages")
        job = _Job(model, "chat", [list(ids)] * body.n, params, self._adapter(model), n=body.n, include_usage=body.include_usage())
        job.tool_calls = body.parses_tool_calls()
        job.max_tokens_given = body.limit() is not None
        return job

    def completion_job(self, body: CompletionRequest) -> _Job:
        """A completions request as a job: each prompt (text or token ids) tokenized, n choices each; 400/404 when it cannot be."""
        model = self.check_model(body.model)
        _refuse_unsupported(body.unsupported())
        tok = self.loaded.tokenizer
        prompts: list[list[int]] = []
        texts: list[str] = []
        given = body.prompts()
        self.admission.check_shape(n=body.n, prompts=len(given))
        for i, p in enumerate(given):
            where = "prompt" if isinstance(body.prompt, str) or _is_token_list(body.prompt) else f"prompt[{i}]"
            if isinstance(p, str):
                self.admission.check_text(len(p), field=where, max_token_chars=self._token_chars)
                ids = list(tok(p)["input_ids"])
                texts.append(p)
            else:
                bad = [t for t in p if not 0 <= t < len(tok)]
                if bad:
                    raise APIError(400, f"{where}: token id {bad[0]} is outside the vocabulary (0..{len(tok) - 1})", param=where)
                ids = list(p)
                texts.append(tok.decode(ids))
            if not ids:
                raise APIError(400, f"{where}: the prompt is empty", param=where)
            prompts.append(ids)
        if not prompts:
            raise APIError(400, "prompt: no prompt given", param="prompt")
        params: list[SamplingParams] = []
        for ids in prompts:
            params += self._params(body, len(ids), prompt_field="prompt")
        choices = [ids for ids in prompts for _ in range(body.n)]
        echo = [t for t in texts for _ in range(body.n)] if body.echo else None
        job = _Job(model, "completions", choices, params, self._adapter(model), n=body.n, include_usage=body.include_usage(), echo=echo)
        job.max_tokens_given = body.limit() is not None
        return job

    def admit(self, job: _Job, request: Request) -> None:
        """Admit ``job``: 400 when one request may not occupy that many tokens, 429 when the server is saturated.

        The job is recorded on the request, so that the middleware ends it (cancels its generations, releases
        its tokens) however its response ends.
        """
        lengths = [len(p) for p in job.prompts]
        limits = [p.max_tokens for p in job.params]
        field = "messages" if job.endpoint == "chat" else "prompt"
        cost = self.admission.check_cost(lengths, limits, n=job.n, prompt_field=field, max_tokens_given=job.max_tokens_given)
        job.ticket = self.admission.reserve(cost)
        request.state.job = job

    def _adapter(self, model: str) -> str | None:
        adapter = self.plan.adapter_for(model)
        return adapter.name if adapter else None

    def _params(self, body: Any, prompt_len: int, *, prompt_field: str) -> list[SamplingParams]:
        ctx = self.loaded.context_length
        limit = body.limit()
        if prompt_len >= ctx or (limit is not None and prompt_len + limit > ctx):
            wanted = prompt_len + (limit or 0)
            where = "max_tokens" if limit is not None and limit >= ctx else prompt_field
            raise APIError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, you requested {wanted} tokens "
                f"({prompt_len} in the {prompt_field}, {limit or 0} in the completion). "
                f"Please reduce the length of the {prompt_field} or max_tokens.",
                param=where,
                code="context_length_exceeded",
            )
        max_tokens = limit if limit is not None else min(self.options.default_max_tokens, ctx - prompt_len)
        temperature = self.loaded.default_temperature if body.temperature is None else body.temperature
        top_p = self.loaded.default_top_p if body.top_p is None else body.top_p
        return [
            SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=None if body.seed is None else body.seed + i,
                stop=body.stop_list(),
            )
            for i in range(body.n)
        ]

    # -- engine outputs -> responses ----------------------------------------------------------------
    def _submit(self, job: _Job, *, stream: bool) -> tuple[asyncio.Queue, list[EngineRequest]]:
        """Hand the job's generations to the engine; their outputs arrive on the returned queue as (index, output)."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()

        def sink(index: int):
            def put(out: EngineOutput) -> None:
                try:
                    loop.call_soon_threadsafe(outputs.put_nowait, (index, out))
                except RuntimeError:  # the event loop is gone (shutdown)
                    pass

            return put

        requests = [
            EngineRequest(prompt_ids=ids, params=p, on_output=sink(i), adapter=job.adapter, stream=stream, group=job) for i, (ids, p) in enumerate(zip(job.prompts, job.params))
        ]
        job.requests = requests
        for r in requests:
            self.loaded.engine.submit(r)
        return outputs, requests

    async def collect(self, job: _Job, *, chat: bool, request: Request | None = None) -> dict | Response:
        """Generate ``job`` and answer with one response body (499 when the client left before the end)."""
        outputs, requests = self._submit(job, stream=False)
        texts = [""] * len(requests)
        reasons: list[str | None] = [None] * len(requests)
        tokens = [0] * len(requests)
        try:
            while any(r is None for r in reasons):
                try:
                    i, out = await asyncio.wait_for(outputs.get(), timeout=_DISCONNECT_POLL_SECONDS)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; `finally` frees the batch rows
                    continue
                texts[i] += out.text
                tokens[i] = out.completion_tokens
                if out.finish_reason:
                    reasons[i] = out.finish_reason
                    if out.finish_reason == "error":
                        raise APIError(500, f"generation failed: {out.error}", type="server_error")
        finally:
            job.release()  # stops the rest when this request fails or is abandoned; gives its tokens back
        self._observe(job, None, sum(tokens))  # time to first token: streams only
        if job.echo:
            texts = [e + t for e, t in zip(job.echo, texts)]
        choices: list[tuple[Any, Any]] = list(zip(texts, reasons))
        if job.tool_calls:
            choices = [_tool_message(text, reason) for text, reason in choices]
        build = chat_response if chat else completion_response
        return build(job.id, job.model, job.created, choices, job.prompt_tokens, sum(tokens))  # type: ignore[arg-type]

    async def stream(self, job: _Job, *, chat: bool) -> AsyncIterator[str]:
        """Generate ``job`` as Server-Sent Events: chunks as text arrives, then usage (if asked for) and ``[DONE]``."""
        outputs, requests = self._submit(job, stream=True)
        tokens = [0] * len(requests)
        done = [False] * len(requests)
        calls = [ToolStream() for _ in requests] if job.tool_calls else None
        first = None
        try:
            for i in range(len(requests)):
                if chat:
                    yield _sse(chat_chunk(job.id, job.model, job.created, index=i, delta={"role": "assistant", "content": ""}))
                elif job.echo:
                    yield _sse(completion_chunk(job.id, job.model, job.created, index=i, text=job.echo[i]))
            while not all(done):
                i, out = await outputs.get()
                first = first or time.monotonic()
                tokens[i] = out.completion_tokens
                if out.finish_reason == "error":
                    yield _sse(error_body(f"generation failed: {out.error}", type="server_error"))
                    return
                text = calls[i].feed(out.text) if calls else out.text
                if text:
                    if chat:
                        yield _sse(chat_chunk(job.id, job.model, job.created, index=i, delta={"content": text}))
                    else:
                        yield _sse(completion_chunk(job.id, job.model, job.created, index=i, text=text))
                if out.finish_reason:
                    done[i] = True
                    reason = out.finish_reason
                    if calls:
                        rest, found = calls[i].finish()
                        if rest:
                            yield _sse(chat_chunk(job.id, job.model, job.created, index=i, delta={"content": rest}))
                        if found:
                            delta = {"tool_calls": [{"index": k, **call} for k, call in enumerate(found)]}
                            yield _sse(chat_chunk(job.id, job.model, job.created, index=i, delta=delta))
                            reason = "tool_calls" if reason == "stop" else reason
                    if chat:
                        yield _sse(chat_chunk(job.id, job.model, job.created, index=i, finish_reason=reason))
                    else:
                        yield _sse(completion_chunk(job.id, job.model, job.created, index=i, finish_reason=out.finish_reason))
            self._observe(job, first, sum(tokens))
            if job.include_usage:
                build = chat_chunk if chat else completion_chunk
                yield _sse(build(job.id, job.model, job.created, usage=(job.prompt_tokens, sum(tokens))))
            yield "data: [DONE]\n\n"
        finally:
            job.release()  # the client went away: free its rows at the next step and its tokens now

    def _observe(self, job: _Job, first: float | None, completion_tokens: int) -> None:
        end = time.monotonic()
        self.metrics.latency.labels(endpoint=job.endpoint).observe(end - job.started)
        if first is not None:
            self.metrics.first_token.labels(endpoint=job.endpoint).observe(first - job.started)
        self.metrics.observe_tokens(job.model, job.prompt_tokens, completion_tokens)


# --- helpers ---------------------------------------------------------------------------------------
def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _tool_message(text: str, reason: str | None) -> tuple[dict, str | None]:
    """A reply as a chat message, its tool calls split out (finish reason ``tool_calls`` when it made any)."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, ("tool_calls" if reason == "stop" else reason)


def _check_tools_rendered(tok: Any, tools: list[dict] | None, messages: list[dict], model: str) -> None:
    """A chat template without tool support drops ``tools`` and earlier ``tool_calls`` silently: the model would
    never see them. Every function name must be rendered (:func:`kubetune.data.templates.unrendered_tool_name`)."""

    def render(t: list[dict] | None, m: list[dict]) -> str:
        return tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **({"tools": t} if t else {}))

    missing = unrendered_tool_name(render, tools, messages)
    if missing is None:
        return
    where, i, name = missing
    fix = "serve a model whose template has a tool format, e.g. one trained with dataset.chat_template: chatml"
    if where == "tools":
        raise APIError(400, f"tools: the chat template of `{model}` does not render tools (the function '{name}' is missing from the prompt); {fix}", param="tools")
    raise APIError(
        400,
        f"messages[{i}].tool_calls: the chat template of `{model}` does not render tool calls (the call to '{name}' is missing from the prompt); {fix}",
        param=f"messages[{i}].tool_calls",
    )


def _json_chars(value: Any) -> int:
    """Characters of ``value`` as JSON (tools and tool calls are rendered into the prompt about this long)."""
    return len(json.dumps(value, ensure_ascii=False, default=str)) if value else 0


def _refuse_unsupported(found: tuple[str, str] | None) -> None:
    if found:
        raise APIError(400, found[1], param=found[0], code="unsupported_parameter")


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) for x in value)
