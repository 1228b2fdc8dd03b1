"""vLLM's tool-calling flags (``--enable-auto-tool-choice --tool-call-parser PARSER``), for ``kubetune serve
--engine vllm`` and for ``render-serve``: whether a chat template renders tools in the Hermes form, which vLLM's
``hermes`` parser reads back. Pure: reads at most a local model directory's template files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import SpecError
from ..spec import TuneJob

__all__ = ["TOOL_FLAGS", "tool_call_args", "default_tool_parser", "chat_template_text", "renders_hermes_tools", "hermes_tools_in"]

TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")
_PARSER_RE = re.compile(r"^[A-Za-z0-9][-_.A-Za-z0-9]*$")


def tool_call_args(job: TuneJob, parser: str | None, extra_args: list[str]) -> list[str]:
    """vLLM's tool-calling flags for the served model: ``--enable-auto-tool-choice --tool-call-parser PARSER``.

    ``parser`` names vLLM's parser (``none``: no flags); None means ``hermes`` when the chat template the model is
    served with is known at render time to render tools in the Hermes form (:func:`default_tool_parser`). A
    tool-call flag among ``extra_args`` (the user's ``--vllm-arg``) replaces kubetune's flags.

    Raises:
        SpecError: ``parser`` is not a parser name.
    """
    if parser is not None and not _PARSER_RE.match(parser):
        raise SpecError(f"--tool-call-parser '{parser}': expected a vLLM tool-call parser name (hermes, llama3_json, mistral, ...) or none")
    if any(a.split("=")[0] in TOOL_FLAGS for a in extra_args):
        return []
    chosen = default_tool_parser(job) if parser is None else parser
    return [] if chosen is None or chosen == "none" else ["--enable-auto-tool-choice", "--tool-call-parser", chosen]


def default_tool_parser(job: TuneJob) -> str | None:
    """``hermes`` when the served chat template renders tools in the Hermes form, as far as can be known without
    fetching anything: ``dataset.chat_template: chatml`` (kubetune's chatml renders tools that way), or no named
    template and a base model that is a local directory or a builtin:// model whose template does. None otherwise
    (a hub or bucket model's template is unknown until it is fetched: pass ``--tool-call-parser``)."""
    named = job.dataset.chat_template
    if named is not None:
        from ..data.templates import CHAT_TEMPLATES

        return "hermes" if named == "chatml" and CHAT_TEMPLATES[named].tool_calling else None
    source = job.model.source
    if source.startswith("builtin://"):
        from ..training.builtin import CHATML_TEMPLATE

        return "hermes" if hermes_tools_in(CHATML_TEMPLATE) else None
    local = Path(source.removeprefix("file://")) if "://" not in source or source.startswith("file://") else None
    return "hermes" if local is not None and local.is_dir() and renders_hermes_tools(local) else None


def chat_template_text(model_dir) -> str:
    """The chat template(s) a model directory ships (``chat_template.jinja``, or ``tokenizer_config.json``'s
    ``chat_template``, a string or a list of named templates), joined; "" when it has none."""
    d = Path(model_dir)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in sorted(d.glob("chat_template*.jinja"))]
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    tpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
    if isinstance(tpl, str):
        texts.append(tpl)
    elif isinstance(tpl, list):
        texts += [t.get("template", "") for t in tpl if isinstance(t, dict) and isinstance(t.get("template"), str)]
    return "\n".join(texts)


def renders_hermes_tools(model_dir) -> bool:
    """The model's chat template renders tools in the Hermes form (Qwen2.5, Hermes 2 Pro, kubetune's chatml):
    it reads ``tools`` and writes ``<tool_call>`` blocks, which vLLM's ``hermes`` tool-call parser reads back."""
    return hermes_tools_in(chat_template_text(model_dir))


def hermes_tools_in(template: str) -> bool:
    """A chat template's text reads ``tools`` and writes ``<tool_call>`` blocks (the Hermes form)."""
    return "tools" in template and "<tool_call>" in template
