"""Serving fine-tuned models: an OpenAI-compatible server, its engines, and vLLM deployments for clusters.

- :func:`resolve_sources` turns ``kubetune serve SOURCE --adapter NAME=URI`` into a :class:`ServePlan`
  (local model and adapter directories, and the model names clients send).
- :func:`create_app` builds the FastAPI app around an engine (``transformers``: batched, in-process;
  ``vllm``: :func:`vllm_command` runs vLLM's own OpenAI server instead).
- :func:`render_serve` renders a vLLM Deployment and Service, or a KServe InferenceService, for a job spec (pure,
  like ``render``).

Importing this package is cheap: FastAPI, torch and transformers load inside the functions that use them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ServeOptions",
    "ServePlan",
    "ServedAdapter",
    "parse_adapter_args",
    "resolve_sources",
    "create_app",
    "load_engine",
    "run_server",
    "vllm_command",
    "render_serve",
    "RemoteChat",
]

_LAZY = {
    "ServeOptions": "options",
    "parse_adapter_args": "options",
    "ServePlan": "sources",
    "ServedAdapter": "sources",
    "resolve_sources": "sources",
    "create_app": "app",
    "run_server": "app",
    "load_engine": "loading",
    "vllm_command": "vllm",
    "render_serve": "deploy",
    "RemoteChat": "chat",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
