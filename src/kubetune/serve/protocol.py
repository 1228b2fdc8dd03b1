"""The OpenAI API shapes the server speaks: request bodies (validated), error bodies, response objects.

Unknown request fields are ignored (clients send many optional ones); fields the server cannot honour
(``logprobs``, a forced ``tool_choice``, non-text ``response_format``) are refused with a 400 that names them, never
silently dropped. How much one request may ask for (``n``, prompts, tokens) is the server's admission control
(serve/admission.py), set by ``kubetune serve`` options.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "APIError",
    "error_body",
    "param_path",
    "chat_response",
    "chat_chunk",
    "completion_response",
    "completion_chunk",
    "new_id",
]

MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 512  # characters of one stop string (each is looked for at every generated token)
SEED_RANGE = (-(2**63), 2**63 - 1)  # a 64-bit seed, like OpenAI's (the choices of a request use seed, seed + 1, ...)


class APIError(Exception):
    """An error answered with OpenAI's error body.

    Args:
        status: HTTP status (400, 401, 404, ...).
        message: what is wrong and what to do.
        type: OpenAI's error type (invalid_request_error, authentication_error, server_error).
        param: the request field at fault, e.g. ``messages[0].role``.
        code: a machine-readable code (model_not_found, invalid_api_key, context_length_exceeded).
        headers: response headers, e.g. Retry-After of a 429.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        """The OpenAI error body of this error, ``{"error": {...}}``."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def param_path(loc: tuple | list) -> str | None:
    """A pydantic error location as a request field path: ('body', 'messages', 0, 'role') -> messages[0].role."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).startswith(("function-", "union[", "list[", "str", "int", "float", "bool", "literal[", "tagged-union")):
            continue  # pydantic's union branch labels are not fields
        else:
            out += f".{p}" if out else str(p)
    return out or None


# --- requests ----------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Body):
    """A chat message; content is a string or a list of text parts (joined)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None  # an assistant's earlier calls (serve/tools.py)
    tool_call_id: str | None = None  # a tool result: the call it answers

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, list):
            texts = []
            for part in v:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ValueError("content parts must be {'type': 'text', 'text': '...'}; this server understands text only")
                texts.append(part["text"])
            return "".join(texts)
        raise ValueError("content must be a string or a list of text parts")

    def text(self) -> str:
        """The message's text (empty for a message with no content, like an assistant turn of tool calls)."""
        return self.content or ""


class StreamOptions(_Body):
    """``stream_options`` of a streaming request: ``include_usage`` adds a last chunk with the token counts."""

    include_usage: bool = False


class _Sampling(_Body):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    n: int = Field(1, ge=1)  # the most per request is the server's --max-n (serve/admission.py)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Union[str, list[str], None]) -> Union[str, list[str], None]:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(s == "" for s in items):
            raise ValueError("stop strings must not be empty")
        if any(len(s) > MAX_STOP_CHARS for s in items):
            raise ValueError(f"stop strings may have at most {MAX_STOP_CHARS} characters")
        return v

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) of the first requested feature the server cannot honour."""
        if self.logprobs:
            return "logprobs", "logprobs are not supported by this server"
        if self.tool_choice not in (None, "auto", "none"):
            return "tool_choice", "only tool_choice 'auto' and 'none' are supported by this server (it cannot force a call)"
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            return "response_format", "only response_format {'type': 'text'} is supported by this server"
        return None

    def limit(self) -> int | None:
        """The most tokens to generate per choice: max_completion_tokens, else max_tokens (None: up to the context)."""
        return self.max_completion_tokens or self.max_tokens

    def parses_tool_calls(self) -> bool:
        """Replies are read for tool calls: tools are offered and tool_choice is not 'none'."""
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        ok = isinstance(v, str) or ids(v) or (isinstance(v, list) and bool(v) and (all(isinstance(x, str) for x in v) or all(ids(x) for x in v)))
        if not ok:
            raise ValueError("must be a string, a list of strings, a list of token ids, or a list of token-id lists")
        return v

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) of the first requested feature the server cannot honour."""
        if self.logprobs is not None:
            return "logprobs", "logprobs are not supported by this server"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported by this server"
        return None

    def limit(self) -> int | None:
        """The most tokens to generate per choice: max_tokens (None: up to the context)."""
        return self.max_tokens

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompt(s) as a list of strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


# --- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    """A fresh response id in OpenAI's style, e.g. ``chatcmpl-<24 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_response(rid: str, model: str, created: int, choices: list[tuple[str | dict, str]], prompt_tokens: int, completion_tokens: int) -> dict:
    """A ``chat.completion`` object; ``choices`` are (text or whole message, finish_reason)."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "message": text if isinstance(text, dict) else {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
            for i, (text, reason) in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def chat_chunk(rid: str, model: str, created: int, *, index: int = 0, delta: dict | None = None, finish_reason: str | None = None, usage: tuple[int, int] | None = None) -> dict:
    """A ``chat.completion.chunk``; with ``usage`` it is the final usage chunk (no choices)."""
    chunk: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        chunk["choices"] = []
        chunk["usage"] = _usage(*usage)
    else:
        chunk["choices"] = [{"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]
    return chunk


def completion_response(rid: str, model: str, created: int, choices: list[tuple[str, str]], prompt_tokens: int, completion_tokens: int) -> dict:
    """A ``text_completion`` object; ``choices`` are (text, finish_reason)."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": reason} for i, (text, reason) in enumerate(choices)],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def completion_chunk(rid: str, model: str, created: int, *, index: int = 0, text: str = "", finish_reason: str | None = None, usage: tuple[int, int] | None = None) -> dict:
    """A streamed ``text_completion`` piece; with ``usage`` it is the final usage chunk."""
    chunk: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model}
    if usage is not None:
        chunk["choices"] = []
        chunk["usage"] = _usage(*usage)
    else:
        chunk["choices"] = [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    return chunk


def now() -> int:
    """The current time in whole seconds (the ``created`` field of responses)."""
    return int(time.time())
