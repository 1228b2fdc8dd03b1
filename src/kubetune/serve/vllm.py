"""``kubetune serve --engine vllm``: run vLLM's own OpenAI server on the same plan (GPU).

vLLM serves the same endpoints (``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/health``,
``/metrics``) with paged attention and its own continuous batching; kubetune only builds its command
line from the :class:`~kubetune.serve.sources.ServePlan` (LoRA adapters through ``--enable-lora
--lora-modules``) and hands over the process.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from .. import constants as C
from ..errors import BackendError, SpecError
from .podspec import lora_rank_option
from .options import ServeOptions
from .sources import ServePlan
from .tool_flags import TOOL_FLAGS, renders_hermes_tools

__all__ = ["vllm_command", "vllm_env", "run_vllm", "vllm_installed", "require_vllm"]


def vllm_installed() -> bool:
    """vLLM can be imported by this interpreter."""
    return importlib.util.find_spec("vllm") is not None


def vllm_command(plan: ServePlan, options: ServeOptions, *, python: str | None = None) -> list[str]:
    """The argv that starts vLLM's OpenAI server for ``plan``.

    The API key is not on the command line (other users see argv): :func:`vllm_env` passes it as
    ``VLLM_API_KEY``, which vLLM reads.

    Raises:
        SpecError: an adapter vLLM cannot serve (not LoRA, DoRA, or a rank above vLLM's largest).
    """
    cmd = [python or sys.executable, "-m", C.SERVE_VLLM_MODULE]
    cmd += ["--model", str(plan.model_dir), "--served-model-name", plan.model_name]
    cmd += ["--host", options.host, "--port", str(options.port)]
    if plan.trust_remote_code:
        cmd.append("--trust-remote-code")
    if options.dtype != "auto":
        cmd += ["--dtype", options.dtype]
    if options.max_model_len:
        cmd += ["--max-model-len", str(options.max_model_len)]
    cmd += ["--max-num-seqs", str(options.max_batch_size)]
    if plan.adapters:
        for a in plan.adapters:
            if (a.peft_type or "LORA").upper() != "LORA" or a.use_dora:
                kind = "DoRA" if a.use_dora else a.peft_type
                raise SpecError(
                    f"--adapter {a.name}: vLLM serves LoRA adapters, not {kind}",
                    hint="merge it (kubetune merge RUN) and serve the merged model, or use --engine transformers",
                )
            if a.modules_to_save:  # vLLM accepts the adapter at start and fails at its first request
                merged = _merged_beside(a.path)
                raise SpecError(
                    f"--adapter {a.name}: the adapter stores fully trained modules ({', '.join(a.modules_to_save)}, "
                    "method.lora.modules_to_save), which vLLM's LoRA support cannot load",
                    hint=(f"serve its merged model: kubetune serve {merged} --engine vllm" if merged else
                          "merge it (kubetune merge RUN) and serve the merged model, or use --engine transformers"),
                )
        rank = max((a.rank or 16) for a in plan.adapters)
        cmd += ["--enable-lora", "--max-loras", str(len(plan.adapters)), "--max-lora-rank", str(lora_rank_option(rank))]
        cmd += ["--lora-modules", *[f"{a.name}={a.path}" for a in plan.adapters]]
    extra = list(options.extra_vllm_args)
    if renders_hermes_tools(plan.model_dir) and not any(a.split("=")[0] in TOOL_FLAGS for a in extra):
        # What kubetune serve's transformers engine parses too: tools in the prompt, <tool_call> JSON in answers.
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    cmd += extra
    return cmd


def _merged_beside(adapter_path: str) -> str | None:
    """The run's complete merged model when the adapter sits in a run directory that has one (``output.merge``)."""
    from pathlib import Path

    merged = Path(adapter_path).parent / C.MERGED_DIR
    return str(merged) if (merged / "config.json").is_file() else None


def vllm_env(options: ServeOptions, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the vLLM process: this one, plus VLLM_API_KEY when a key is set."""
    env = dict(os.environ if base is None else base)
    if options.api_key:
        env["VLLM_API_KEY"] = options.api_key
    return env


def require_vllm() -> None:
    """Raise BackendError (with what to do) unless vLLM can be imported."""
    if not vllm_installed():
        raise BackendError(
            "--engine vllm: vLLM is not installed in this Python environment",
            hint="install it on a Linux machine with an NVIDIA GPU (pip install vllm), "
            "or leave out --engine to serve with transformers (CPU or GPU); see docs/serving.md",
        )


def run_vllm(plan: ServePlan, options: ServeOptions) -> None:
    """Replace this process with vLLM's server (it never returns when vLLM starts).

    Raises:
        BackendError: vLLM is not installed.
    """
    require_vllm()
    cmd = vllm_command(plan, options)
    print("starting vLLM: " + " ".join(cmd), flush=True)
    os.execve(cmd[0], cmd, vllm_env(options))
