"""CLI commands of serving: ``kubetune serve`` (an OpenAI-compatible server) and ``kubetune render-serve``
(a vLLM Deployment and Service for a cluster).

Kept light at import: FastAPI, torch and transformers load inside ``serve``; ``render-serve`` is pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .. import constants as C

__all__ = ["register"]

_ADAPTER_HELP = "Serve a LoRA adapter as model NAME on the same base: NAME=URI (a run, an adapter directory or a URI). Repeatable."


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main ``kubetune`` app."""
    app.command("serve")(serve)
    app.command("render-serve")(render_serve)


def serve(
    source: str = typer.Argument(..., help="A run directory, a model directory or a model URI (hf://, s3://, builtin://, ...)."),
    adapter: List[str] = typer.Option([], "--adapter", "-a", help=_ADAPTER_HELP),
    host: str = typer.Option(C.SERVE_HOST, "--host", help="Address to bind (0.0.0.0 exposes the server to your network)."),
    port: int = typer.Option(C.SERVE_PORT, "--port", "-p", help="TCP port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=C.ENV_SERVE_API_KEY, help=f"Require 'Authorization: Bearer KEY' on /v1 (or set {C.ENV_SERVE_API_KEY})."),
    engine: str = typer.Option("transformers", "--engine", help="transformers (CPU/GPU, batched) or vllm (GPU, needs vLLM installed)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="The id clients send for the main model (default: the run or model name)."),
    max_batch_size: int = typer.Option(32, "--max-batch-size", help="Most requests generated together."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Longest prompt + completion in tokens (default: the model's context)."),
    default_max_tokens: int = typer.Option(256, "--default-max-tokens", help="Completion length for requests that set no max_tokens."),
    max_n: int = typer.Option(16, "--max-n", help="Most choices (n) one request may ask for (more: 400)."),
    max_prompts: int = typer.Option(64, "--max-prompts", help="Most prompts in one /v1/completions request (more: 400)."),
    max_request_tokens: Optional[int] = typer.Option(
        None, "--max-request-tokens", help=f"Most tokens one request may occupy: prompts x n x (prompt + max_tokens) (more: 400; default {C.SERVE_MAX_REQUEST_TOKENS} or the context)."
    ),
    max_queued_tokens: Optional[int] = typer.Option(
        None, "--max-queued-tokens", help=f"Most tokens all admitted requests may occupy together (more: 429 with Retry-After; default {C.SERVE_MAX_QUEUED_TOKENS} or 4 x --max-request-tokens)."
    ),
    max_request_bytes: int = typer.Option(C.SERVE_MAX_REQUEST_BYTES, "--max-request-bytes", help="Largest request body in bytes (more: 413)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, bfloat16 or float16."),
    vllm_arg: List[str] = typer.Option([], "--vllm-arg", help="Pass an argument to vLLM unchanged (--engine vllm), e.g. --vllm-arg=--gpu-memory-utilization=0.8."),
) -> None:
    """Serve a fine-tuned model with an OpenAI-compatible API (chat, completions, models, health, metrics)."""
    from ..serve.options import make_options, parse_adapter_args
    from ..serve.sources import resolve_sources

    options = make_options(
        host=host,
        port=port,
        api_key=api_key or None,
        engine=engine,
        served_model_name=served_model_name,
        max_batch_size=max_batch_size,
        max_model_len=max_model_len,
        default_max_tokens=default_max_tokens,
        max_n=max_n,
        max_prompts=max_prompts,
        max_request_tokens=max_request_tokens,
        max_queued_tokens=max_queued_tokens,
        max_request_bytes=max_request_bytes,
        dtype=dtype,
        extra_vllm_args=tuple(vllm_arg),
    )
    adapters = parse_adapter_args(adapter)
    if options.engine != "vllm":  # vLLM brings its own server
        from ..extras import require

        require("serve", "kubetune serve")
    if options.engine == "vllm":
        from ..serve.vllm import require_vllm

        require_vllm()  # before fetching anything: a missing vLLM is the first thing to fix
        limits = [f"--{k.replace('_', '-')}" for k in _ADMISSION if getattr(options, k) != type(options).model_fields[k].default]
        if limits:
            typer.echo(f"warning: {', '.join(limits)} apply to the transformers engine; vLLM's server does not enforce them", err=True)
    if not _loopback(options.host) and not options.api_key:
        typer.echo(f"warning: serving on {options.host} without --api-key: anyone who can reach this port can use the model", err=True)
    plan = resolve_sources(source, adapters, served_model_name=options.served_model_name)
    if options.engine == "vllm":
        from ..serve.vllm import run_vllm

        run_vllm(plan, options)
        return
    from ..serve.app import run_server

    run_server(plan, options)


def render_serve(
    spec: Path = typer.Argument(..., help="Job spec YAML of the job whose result is served."),
    adapter: List[str] = typer.Option([], "--adapter", "-a", help="Also serve this LoRA adapter: NAME=URI the cluster can fetch (s3://, oci://, hf://). Repeatable."),
    merged: bool = typer.Option(False, "--merged", help="Serve the job's merged model (output.merge) instead of base + adapter."),
    replicas: int = typer.Option(1, "--replicas", help="Pods behind the Service."),
    accelerators: Optional[int] = typer.Option(None, "--accelerators", help="Accelerators per pod (default: resources.accelerators, at least 1)."),
    image: Optional[str] = typer.Option(None, "--image", help=f"vLLM image (default {C.SERVE_VLLM_IMAGE})."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="The id of the job's model (default: the job name)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="vLLM's --max-model-len."),
    api_key_secret: Optional[str] = typer.Option(None, "--api-key-secret", help="SECRET[:KEY] holding the API key clients must send (default key: api-key)."),
    vllm_arg: List[str] = typer.Option([], "--vllm-arg", help="Pass an argument to vLLM unchanged (a tool-call flag replaces kubetune's)."),
    tool_call_parser: Optional[str] = typer.Option(
        None, "--tool-call-parser", metavar="PARSER",
        help="vLLM's tool-call parser (adds --enable-auto-tool-choice); none: no tool flags. Default: hermes when the chat template is known to render tools (dataset.chat_template chatml, or a local/builtin base model's).",
    ),
    flavor: str = typer.Option("deployment", "--flavor", help="deployment (a Deployment and a Service) or kserve (a KServe InferenceService)."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Namespace of the objects (default: kubernetes.namespace)."),
    set_: List[str] = typer.Option([], "--set", help="Override a spec field, e.g. --set resources.accelerators=2 (repeatable)."),
    output: str = typer.Option("yaml", "-o", "--output", help="yaml or json"),
) -> None:
    """Print a vLLM Deployment and Service (or a KServe InferenceService) that serve a job's result on a cluster (pure: talks to no cluster)."""
    from ..backends.kubernetes import render_text
    from ..serve.deploy import render_serve as render_objects
    from ..serve.options import parse_adapter_args
    from ..spec import load_spec, spec_warnings

    job = load_spec(spec, set_)
    for message in spec_warnings(job):
        typer.echo(f"warning: {message}", err=True)
    objects = render_objects(
        job,
        adapters=parse_adapter_args(adapter),
        merged=merged,
        replicas=replicas,
        accelerators=accelerators,
        image=image,
        namespace=namespace,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        api_key_secret=api_key_secret,
        extra_args=list(vllm_arg),
        flavor=flavor,
        tool_call_parser=tool_call_parser,
    )
    typer.echo(render_text(objects, output), nl=False)


# Admission limits of the transformers engine (serve/admission.py); vLLM's own server knows nothing of them.
_ADMISSION = ("max_n", "max_prompts", "max_request_tokens", "max_queued_tokens", "max_request_bytes")


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
