"""Server settings, validated once at the edge (the CLI builds a :class:`ServeOptions` and passes it down)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import constants as C
from ..errors import SpecError

__all__ = ["ServeOptions", "parse_adapter_args", "check_model_name"]

# A model id clients send: no whitespace, no '=' (it separates NAME=URI), at most 128 characters.
_MODEL_NAME_RE = re.compile(r"^[^\s=]{1,128}$")


class ServeOptions(BaseModel):
    """How ``kubetune serve`` runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(C.SERVE_HOST, description="Address to bind; 0.0.0.0 exposes the server to the network.")
    port: int = Field(C.SERVE_PORT, ge=0, le=65535, description="TCP port (0: any free port).")
    api_key: str | None = Field(None, description="Clients must send 'Authorization: Bearer KEY' to /v1/* when set.")
    engine: Literal["transformers", "vllm"] = Field("transformers", description="transformers (CPU/GPU, batched) or vllm (GPU).")
    served_model_name: str | None = Field(None, description="The id clients use for the main model (default: the run or model name).")
    max_batch_size: int = Field(32, ge=1, le=1024, description="Most requests decoded together in one batch.")
    max_model_len: int | None = Field(None, ge=16, description="Longest prompt + completion in tokens (default: the model's context).")
    default_max_tokens: int = Field(256, ge=1, description="Completion length when a request sets no max_tokens.")
    max_n: int = Field(16, ge=1, le=1024, description="Most choices (n) one request may ask for; more is a 400.")
    max_prompts: int = Field(64, ge=1, le=65536, description="Most prompts in one /v1/completions request; more is a 400.")
    max_request_tokens: int | None = Field(
        None,
        ge=16,
        description=(
            "Most tokens one request may occupy: the sum over its sequences (prompts x n) of prompt + max_tokens; more is a 400 "
            f"(default: {C.SERVE_MAX_REQUEST_TOKENS}, or the context length when larger)."
        ),
    )
    max_queued_tokens: int | None = Field(
        None,
        ge=16,
        description=(
            "Most tokens all admitted requests (running and waiting) may occupy together; a request that does not fit now is "
            f"answered 429 with Retry-After (default: {C.SERVE_MAX_QUEUED_TOKENS}, or {C.SERVE_QUEUED_PER_REQUEST} x "
            "max-request-tokens when larger)."
        ),
    )
    max_request_bytes: int = Field(
        C.SERVE_MAX_REQUEST_BYTES, ge=1024, description="Largest request body in bytes; a larger one is a 413 before it is read whole."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: bf16 on GPUs that support it, fp32 on CPU.")
    device: str | None = Field(None, description="torch device (default: cuda when available, else cpu).")
    log_level: str = Field("info", description="uvicorn log level.")
    extra_vllm_args: tuple[str, ...] = Field((), description="Arguments passed through to vLLM unchanged (--engine vllm).")

    @model_validator(mode="after")
    def _request_fits_the_budget(self) -> "ServeOptions":
        if self.max_request_tokens and self.max_queued_tokens and self.max_request_tokens > self.max_queued_tokens:
            raise ValueError(
                f"--max-request-tokens ({self.max_request_tokens}) is more than --max-queued-tokens ({self.max_queued_tokens}): "
                "such a request could never be admitted"
            )
        return self


def check_model_name(name: str, what: str = "model name") -> str:
    """Return ``name`` if clients can send it as ``model``, else raise SpecError."""
    if not _MODEL_NAME_RE.match(name):
        raise SpecError(f"{what} '{name}': use 1-128 characters without spaces or '='")
    return name


def parse_adapter_args(values: list[str]) -> dict[str, str]:
    """``["NAME=URI", ...]`` (the ``--adapter`` option) as an ordered dict NAME -> URI.

    Raises:
        SpecError: an entry is not NAME=URI, a name is invalid, or a name repeats.
    """
    out: dict[str, str] = {}
    for item in values:
        name, sep, uri = item.partition("=")
        name, uri = name.strip(), uri.strip()
        if not sep or not name or not uri:
            raise SpecError(f"--adapter '{item}': expected NAME=URI, e.g. --adapter support=runs/support-bot")
        check_model_name(name, "--adapter name")
        if name in out:
            raise SpecError(f"--adapter {name}: the name is given twice", hint="each adapter needs its own name")
        out[name] = uri
    return out


def make_options(**values: object) -> ServeOptions:
    """Build :class:`ServeOptions`, turning pydantic's errors into one SpecError naming the option."""
    try:
        return ServeOptions(**values)  # type: ignore[arg-type]
    except ValidationError as e:
        problems = [
            f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}" if err["loc"] else err["msg"].removeprefix("Value error, ")
            for err in e.errors()
        ]
        raise SpecError("invalid serve options:\n  " + "\n  ".join(problems), problems=problems) from None
