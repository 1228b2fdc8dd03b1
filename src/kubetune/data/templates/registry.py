"""The registry of named chat templates (``dataset.chat_template``): each as Jinja with ``{% generation %}``
markers and as a plain-Python renderer that a test keeps identical to it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .base import Message, Rendered, TemplateRowError

__all__ = ["CHAT_TEMPLATES", "ChatTemplate", "template_names"]

# --- the registry ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatTemplate:
    """A named template: its Jinja source and an equivalent fast renderer.

    Attributes:
        name: registry key (``dataset.chat_template``).
        jinja: the template as transformers renders it (saved with the tokenizer).
        eot: the end-of-turn token that closes every trained answer.
        special_tokens: tokens the tokenizer must know as single tokens for this template to make sense.
        roles: roles the template can render.
        description: one line for docs and ``--help``.
    """

    name: str
    jinja: str
    eot: str
    special_tokens: tuple[str, ...]
    roles: frozenset[str]
    description: str
    _pieces: Callable[..., list[tuple[str, bool]]] = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    _generation_prompt: str = ""
    tool_calling: bool = False  # renders ``tools`` and assistant ``tool_calls`` (chatml, in the Hermes/Qwen form)
    # The tokenizer's own template when it rendered like this one on plain conversations (resolve_template):
    # conversations with tools go to it, since tool formats differ between templates that agree otherwise.
    own: Any = field(repr=False, compare=False, default=None)

    def render(
        self,
        messages: Sequence[Message],
        *,
        train_all: bool = False,
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
        extras: Sequence[dict | None] | None = None,
    ) -> Rendered:
        """Render ``messages`` and return the text with the trained spans.

        Args:
            tools: function schemas offered to the model (rendered into the system turn).
            extras: per message, ``tool_calls`` (assistant) or ``name``/``tool_call_id`` (tool results).

        Raises:
            TemplateRowError: a role the template does not know, an order it does not allow, or tool calls
                it has no format for.
        """
        has_tools = bool(tools) or any(e and e.get("tool_calls") for e in extras or ())
        if has_tools and self.own is not None:
            return self.own.render(messages, train_all=train_all, add_generation_prompt=add_generation_prompt, tools=tools, extras=extras)
        if has_tools and not self.tool_calling:
            raise TemplateRowError(
                f"the {self.name} chat template has no format for tools and tool calls; use the model's own chat "
                "template (leave dataset.chat_template unset) if it has one, or dataset.chat_template: chatml"
            )
        for role, _, _ in messages:
            if role not in self.roles:
                raise TemplateRowError(f"the {self.name} chat template has no '{role}' role (it knows {', '.join(sorted(self.roles))})")
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        pieces = self._pieces(messages, tools, extras) if self.tool_calling else self._pieces(messages)
        for text, trained in pieces:
            if trained and text:
                if spans and spans[-1][1] == pos:
                    spans[-1] = (spans[-1][0], pos + len(text))
                else:
                    spans.append((pos, pos + len(text)))
            parts.append(text)
            pos += len(text)
        if add_generation_prompt:
            parts.append(self._generation_prompt)
        text = "".join(parts)
        if train_all:
            spans = [(0, len(text))] if text else []
        return Rendered(text, spans)


# chatml's tool-calling form, as Hermes 2 Pro and Qwen2.5 write it: the function schemas in <tools> inside the
# system turn, each call as {"name", "arguments"} JSON in <tool_call> tags after the answer's text.
_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)


def _tools_block(tools: Sequence[dict]) -> str:
    return _TOOLS_INTRO + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _TOOLS_OUTRO


def _tool_call_text(content: str, calls: Sequence[dict]) -> str:
    text = content
    for call in calls:
        fn = call["function"]
        text += ("\n" if text else "") + "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False) + "\n</tool_call>"
    return text


def _chatml(messages: Sequence[Message], tools: Sequence[dict] | None = None, extras: Sequence[dict | None] | None = None) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    if tools and not (messages and messages[0][0] == "system"):
        out.append(("<|im_start|>system\n" + _tools_block(tools) + "<|im_end|>\n", False))
    for i, (role, content, trained) in enumerate(messages):
        extra = extras[i] if extras else None
        if role == "assistant":
            body = _tool_call_text(content, extra["tool_calls"]) if extra and extra.get("tool_calls") else content
            out += [("<|im_start|>assistant\n", False), (body + "<|im_end|>", trained), ("\n", False)]
        elif i == 0 and role == "system" and tools:
            out.append((f"<|im_start|>system\n{content}\n\n{_tools_block(tools)}<|im_end|>\n", False))
        else:
            out.append((f"<|im_start|>{role}\n{content}<|im_end|>\n", False))
    return out


def _llama3(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = [("<|begin_of_text|>", False)] if messages else []
    for role, content, trained in messages:
        out.append((f"<|start_header_id|>{role}<|end_header_id|>\n\n", False))
        out.append((content.strip() + "<|eot_id|>", trained and role == "assistant"))
    return out


def _merge_system(messages: Sequence[Message], name: str) -> list[Message]:
    """Templates without a system role: the system text opens the first user turn."""
    msgs = list(messages)
    if msgs and msgs[0][0] == "system":
        if len(msgs) < 2 or msgs[1][0] != "user":
            raise TemplateRowError(f"the {name} chat template needs a user message after the system message")
        msgs = [("user", msgs[0][1] + "\n\n" + msgs[1][1], msgs[1][2])] + msgs[2:]
    for i, (role, _, _) in enumerate(msgs):
        if role == "system":
            raise TemplateRowError(f"the {name} chat template allows a system message only at the start")
        if (role == "user") != (i % 2 == 0):
            raise TemplateRowError(f"the {name} chat template needs roles alternating user/assistant/user/...")
    return msgs


def _mistral(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = [("<s>", False)]
    for role, content, trained in _merge_system(messages, "mistral"):
        if role == "user":
            out.append((f"[INST] {content} [/INST]", False))
        else:
            out.append((content + "</s>", trained))
    return out


def _gemma(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = [("<bos>", False)]
    for role, content, trained in _merge_system(messages, "gemma"):
        if role == "user":
            out.append((f"<start_of_turn>user\n{content.strip()}<end_of_turn>\n", False))
        else:
            out += [("<start_of_turn>model\n", False), (content.strip() + "<end_of_turn>", trained), ("\n", False)]
    return out


def _phi3(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for role, content, trained in messages:
        out += [(f"<|{role}|>\n", False), (content + "<|end|>", trained and role == "assistant"), ("\n", False)]
    return out


_ALL_ROLES = frozenset({"system", "user", "assistant", "tool"})

# The Jinja twins of the renderers above. Written on one line each so that no template whitespace leaks.
_CHATML_JINJA = (
    "{% macro tools_block() %}"
    "{{ " + json.dumps(_TOOLS_INTRO) + " }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ " + json.dumps(_TOOLS_OUTRO) + " }}"
    "{% endmacro %}"
    "{% if tools and not (messages and messages[0]['role'] == 'system') %}"
    "{{ '<|im_start|>system\\n' + tools_block() + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson) + '\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% elif loop.first and message['role'] == 'system' and tools %}"
    "{{ '<|im_start|>system\\n' + message['content'] + '\\n\\n' + tools_block() + '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_LLAMA3_JINJA = (
    "{% for message in messages %}"
    "{% if loop.index0 == 0 %}{{ '<|begin_of_text|>' }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Shared by mistral and gemma: a leading system message is merged into the first user turn.
_MERGE_SYSTEM_JINJA = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% if messages | length < 2 or messages[1]['role'] != 'user' %}"
    "{{ raise_exception('a user message must follow the system message') }}{% endif %}"
    "{% set loop_messages = [{'role': 'user', 'content': messages[0]['content'] + '\\n\\n' + messages[1]['content']}] + messages[2:] %}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
)
_MISTRAL_JINJA = (
    _MERGE_SYSTEM_JINJA + "{{ '<s>' }}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant/user/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{% generation %}{{ message['content'] + '</s>' }}{% endgeneration %}{% endif %}"
    "{% endfor %}"
)
_GEMMA_JINJA = (
    _MERGE_SYSTEM_JINJA + "{{ '<bos>' }}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant/user/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '<start_of_turn>user\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% else %}{{ '<start_of_turn>model\\n' }}{% generation %}{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_PHI3_JINJA = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|end|>' }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

CHAT_TEMPLATES: dict[str, ChatTemplate] = {
    t.name: t
    for t in (
        ChatTemplate(
            "chatml", _CHATML_JINJA, "<|im_end|>", ("<|im_start|>", "<|im_end|>"), _ALL_ROLES,
            "ChatML (Qwen, SmolLM, Hermes, the builtin tiny-chat): <|im_start|>role ... <|im_end|>; tools and "
            "tool calls in the Hermes/Qwen2.5 form (<tools> in the system turn, <tool_call> JSON in answers)",
            _chatml, "<|im_start|>assistant\n", True,
        ),
        ChatTemplate(
            "llama3", _LLAMA3_JINJA, "<|eot_id|>", ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
            _ALL_ROLES, "Llama 3 instruct: <|start_header_id|>role<|end_header_id|> ... <|eot_id|> (content trimmed)",
            _llama3, "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        ChatTemplate(
            "mistral", _MISTRAL_JINJA, "</s>", ("<s>", "</s>"), frozenset({"system", "user", "assistant"}),
            "Mistral instruct: <s>[INST] user [/INST]answer</s> (system merged into the first user turn)",
            _mistral, "",
        ),
        ChatTemplate(
            "gemma", _GEMMA_JINJA, "<end_of_turn>", ("<bos>", "<start_of_turn>", "<end_of_turn>"), frozenset({"system", "user", "assistant"}),
            "Gemma: <start_of_turn>user|model ... <end_of_turn> (system merged into the first user turn)",
            _gemma, "<start_of_turn>model\n",
        ),
        ChatTemplate(
            "phi3", _PHI3_JINJA, "<|end|>", ("<|user|>", "<|assistant|>", "<|end|>"), frozenset({"system", "user", "assistant"}),
            "Phi-3: <|role|> ... <|end|>",
            _phi3, "<|assistant|>\n",
        ),
    )
}


def template_names() -> list[str]:
    """Names accepted by ``dataset.chat_template``."""
    return list(CHAT_TEMPLATES)


