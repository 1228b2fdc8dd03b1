"""Chat templates: a small registry of named templates, and the tokenizer's own template.

A template turns a conversation into text *and* tells which characters are trained: every trained
assistant answer is its content plus the template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``,
``</s>``, ...), so the model learns to stop.

Registry templates (``chatml``, ``llama3``, ``mistral``, ``gemma``, ``phi3``) exist twice, and a test
keeps the two identical: as Jinja (with ``{% generation %}`` markers; this is what is saved with the
tokenizer and what inference renders) and as a plain-Python renderer that returns the text and the
trained character spans in one pass, which is what makes preparation fast.

When the tokenizer brings its own template, :func:`resolve_template` first checks whether it renders
exactly like a registry template on a set of probe conversations; if so the fast renderer is used.
Otherwise :class:`JinjaTemplate` renders with the tokenizer itself and finds each answer's span by
rendering the conversation prefix before it (or from ``{% generation %}`` markers when the template has
them), counting conversations whose prefix does not render consistently with the whole.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..errors import DataError

__all__ = [
    "CHAT_TEMPLATES",
    "ChatTemplate",
    "JinjaTemplate",
    "Rendered",
    "TemplateRowError",
    "resolve_template",
    "template_names",
    "unrendered_tool_name",
]

# A normalized message: (role, content, trained). ``trained`` is already decided by the format
# (assistant answers, minus weight-0 turns and minus the prompt part of prompt/completion rows).
Message = tuple[str, str, bool]


class TemplateRowError(ValueError):
    """This conversation cannot be rendered by the template (e.g. roles that do not alternate)."""


@dataclass
class Rendered:
    """A rendered conversation: the text and the half-open character spans that are trained."""

    text: str
    spans: list[tuple[int, int]]
    prefix_inconsistent: bool = False  # the prefix before an answer rendered differently than the whole
    eos_inserted: bool = False  # the template emits no end-of-turn token; EOS was inserted after answers


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


# --- the tokenizer's own template --------------------------------------------------------------
class JinjaTemplate:
    """A template only the tokenizer can render: spans come from prefixes or generation markers.

    Slower than a registry template (it renders each conversation once per answer), but exact for any
    template whose prefix renders consistently; conversations where it does not are counted and their
    answers located by content instead.
    """

    def __init__(self, tokenizer: Any, eot: str | None, *, name: str = "tokenizer") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.eot = eot  # None: the template never closes an answer with a special token
        self.insert_eos = eot is None
        self._source = _template_source(tokenizer)
        self._markers = bool(re.search(r"\{%-?\s*generation\s*-?%\}", self._source or ""))

    def _apply(self, msgs: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **({"tools": tools} if tools else {})
            )
        except Exception as e:  # jinja raise_exception, missing keys: the row cannot be rendered
            raise TemplateRowError(f"the tokenizer's chat template cannot render this conversation: {e}") from None

    def render(
        self,
        messages: Sequence[Message],
        *,
        train_all: bool = False,
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
        extras: Sequence[dict | None] | None = None,
    ) -> Rendered:
        """The conversation as text, with the spans to train marked."""
        msgs = [{"role": r, "content": c, **((extras[i] or {}) if extras else {})} for i, (r, c, _) in enumerate(messages)]
        text = self._apply(msgs, add_generation_prompt, tools)
        if tools or any(m.get("tool_calls") for m in msgs):
            _check_tools_rendered(lambda t, m: self._apply(m, add_generation_prompt, t), tools, msgs)
        if train_all:
            return Rendered(text, [(0, len(text))] if text else [])
        inconsistent = False
        spans: list[tuple[int, int]] = []
        marked = self._marked_spans(msgs, tools) if self._markers else None
        for i, (role, content, trained) in enumerate(messages):
            if role != "assistant":
                continue
            if marked is not None:
                start = marked.pop(0)[0] if marked else len(text)
            else:
                prefix = self._apply(msgs[:i], True, tools) if i else ""
                if text.startswith(prefix):
                    start = len(prefix)
                else:  # e.g. templates that drop earlier reasoning: locate the answer by its content
                    inconsistent = True
                    common = _common_prefix(prefix, text)
                    found = text.find(content.strip(), common) if content.strip() else -1
                    start = found if found >= 0 else common
            if msgs[i].get("tool_calls"):
                cend = self._turn_end(text, msgs, i, start, tools)
            else:
                body = content.strip()
                cend = text.find(body, start) if body else start
                cend = cend + len(body) if cend >= 0 else start
            if trained:
                spans.append((start, cend))
        return self._close_answers(text, spans, inconsistent)

    def _turn_end(self, text: str, msgs: list[dict], i: int, start: int, tools: list[dict] | None) -> int:
        """Where an assistant turn with tool calls ends (before its end-of-turn token): the calls follow or
        replace the text in a form only the template knows, so the turn is rendered on its own."""
        through = self._apply(msgs[: i + 1], False, tools)
        if text.startswith(through) and len(through) > start:
            end = len(through.rstrip())
            if self.eot is not None and through[:end].endswith(self.eot):
                end -= len(self.eot)
            return max(start, end)
        if self.eot is not None:  # rendered differently as the last message: up to the turn's end-of-turn token
            j = text.find(self.eot, start)
            if j >= 0:
                return j
        return len(text.rstrip())

    def _marked_spans(self, msgs: list[dict], tools: list[dict] | None = None) -> list[tuple[int, int]]:
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            _, indices = render_jinja_template(
                [msgs], tools=tools, chat_template=self._source, return_assistant_tokens_mask=True, **_special_kwargs(self.tokenizer)
            )
        except Exception as e:
            raise TemplateRowError(f"the tokenizer's chat template cannot render this conversation: {e}") from None
        return list(indices[0])

    def _close_answers(self, text: str, spans: list[tuple[int, int]], inconsistent: bool) -> Rendered:
        """Extend each answer span over the end-of-turn token, or insert EOS where the template has none."""
        if self.eot is not None:
            closed = []
            for s, e in spans:
                j = text.find(self.eot, e)
                if j >= 0 and not text[e:j].strip():
                    closed.append((s, j + len(self.eot)))
                else:
                    closed.append((s, e))
            return Rendered(text, closed, prefix_inconsistent=inconsistent)
        eos = self.tokenizer.eos_token
        out, shifted, shift, last = [], [], 0, 0
        for s, e in spans:
            out.append(text[last:e] + eos)
            shifted.append((s + shift, e + shift + len(eos)))
            shift += len(eos)
            last = e
        out.append(text[last:])
        return Rendered("".join(out), shifted, prefix_inconsistent=inconsistent, eos_inserted=bool(spans))


def _check_tools_rendered(render: Callable[[list[dict] | None, list[dict]], str], tools: list[dict] | None, msgs: list[dict]) -> None:
    """A template without tool support drops ``tools`` and ``tool_calls`` silently: training would then teach
    answers without their calls. Every function name must be rendered (see :func:`unrendered_tool_name`)."""
    missing = unrendered_tool_name(render, tools, msgs)
    if missing is None:
        return
    where, _, name = missing
    if where == "tools":
        raise TemplateRowError(
            f"the tokenizer's chat template does not render 'tools' (the function '{name}' is missing from the "
            "text); set dataset.chat_template: chatml for the Hermes/Qwen2.5 tool format"
        )
    raise TemplateRowError(
        f"the tokenizer's chat template does not render tool_calls (the call to '{name}' is missing from "
        "the text); set dataset.chat_template: chatml for the Hermes/Qwen2.5 tool format"
    )


def unrendered_tool_name(
    render: Callable[[list[dict] | None, list[dict]], str], tools: list[dict] | None, messages: list[dict]
) -> tuple[str, int, str] | None:
    """The first function name a chat template leaves out of its text, or None when it renders them all.

    Templates without tool support drop ``tools`` and the messages' ``tool_calls`` without a word. Looking for
    the names in the rendered text cannot tell: a name also found in the template's own text or in the
    conversation passes (a tool named ``f`` is "in" every "of", one named ``user`` in every ChatML turn). So
    every name is replaced by a sentinel of its own, which nothing else contains, and the conversation is
    rendered again: a name is rendered exactly when its sentinel is in that text.

    Args:
        render: ``render(tools, messages) -> text``, the template applied as the caller applies it.
        tools: function schemas (OpenAI's ``{"type": "function", "function": {"name", ...}}`` or a bare schema).
        messages: the conversation; assistant messages may carry ``tool_calls``.

    Returns:
        ``("tools", j, name)`` for ``tools[j]``, ``("tool_calls", i, name)`` for a call of ``messages[i]``, or None.
        When the template refuses the sentinels (it raises), names are looked for as whole words instead.
    """
    tag = f"kubetune_fn_{uuid.uuid4().hex[:12]}"
    found: list[tuple[str, str, int, str]] = []  # (sentinel, where, index, name)
    new_tools = []
    for j, tool in enumerate(tools or ()):
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else None
        name = (fn or tool).get("name")
        if not isinstance(name, str) or not name:
            new_tools.append(tool)
            continue
        sentinel = f"{tag}_{len(found)}"
        found.append((sentinel, "tools", j, name))
        new_tools.append({**tool, "function": {**fn, "name": sentinel}} if fn is not None else {**tool, "name": sentinel})
    new_msgs = []
    for i, m in enumerate(messages):
        calls = []
        for call in m.get("tool_calls") or ():
            sentinel = f"{tag}_{len(found)}"
            found.append((sentinel, "tool_calls", i, call["function"]["name"]))
            calls.append({**call, "function": {**call["function"], "name": sentinel}})
        new_msgs.append({**m, "tool_calls": calls} if calls else m)
    if not found:
        return None
    try:
        text = render(new_tools if tools else None, new_msgs).lower()
    except Exception:  # e.g. a template that looks calls up in tools by name: judge the real text, by whole names
        plain = render(tools, messages)
        for _, where, index, name in found:
            if not re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", plain):
                return where, index, name
        return None
    for sentinel, where, index, name in found:
        if sentinel not in text:
            return where, index, name
    return None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _template_source(tokenizer: Any) -> str | None:
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("default")
    return tpl or None


def _special_kwargs(tokenizer: Any) -> dict:
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        val = getattr(tokenizer, key, None)
        if val is not None:
            out[key] = str(val)
    return out


# --- choosing the template ---------------------------------------------------------------------
# Conversations that tell registry templates apart (system or not, several turns, whitespace that
# trimming templates remove, a generation prompt).
_PROBES: list[list[Message]] = [
    [("user", "Hi there", False)],
    [("system", "Be brief.", False), ("user", "What is 2+2?", False), ("assistant", "4.", True)],
    [("user", "a", False), ("assistant", " b ", True), ("user", "c\n", False), ("assistant", "d", True)],
    [("system", "S", False), ("user", "u1", False), ("assistant", "a1", True), ("user", "u2", False), ("assistant", "a2", True)],
]


def _renders_like(tokenizer: Any, template: ChatTemplate) -> bool:
    for probe in _PROBES:
        msgs = [{"role": r, "content": c} for r, c, _ in probe]
        for gp in (False, True):
            if gp and probe[-1][0] == "assistant":
                continue
            try:
                mine = template.render(probe, add_generation_prompt=gp).text
                theirs = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gp)
            except Exception:
                return False
            if mine != theirs:
                return False
    return True


def _find_eot(tokenizer: Any) -> str | None:
    """The special token a template puts right after an answer, or None when it puts none."""
    sentinel = "kubetune-answer-7f3a"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}], tokenize=False
        )
    except Exception:
        return None
    after = text[text.find(sentinel) + len(sentinel):] if sentinel in text else ""
    specials = sorted(_special_tokens(tokenizer), key=len, reverse=True)
    stripped = after.lstrip()
    for tok in specials:
        if tok and stripped.startswith(tok):
            return tok
    return None


def _special_tokens(tokenizer: Any) -> set[str]:
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for tok in decoder.values():
        if getattr(tok, "special", False):
            found.add(str(tok))
    return found


def _single_token(tokenizer: Any, text: str) -> bool:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(ids) == 1


def resolve_template(tokenizer: Any, name: str | None, *, log: Callable[[str], None] = lambda m: None) -> ChatTemplate | JinjaTemplate:
    """The template that renders chat rows for ``tokenizer``.

    Args:
        tokenizer: the model's tokenizer.
        name: ``dataset.chat_template``; None means the tokenizer's own template.
        log: receives one line about the choice (and warnings).

    Returns:
        A registry template (fast) or the tokenizer's own template wrapped in :class:`JinjaTemplate`.
        A named template is also installed as ``tokenizer.chat_template``, so that it is saved with the
        tokenizer and inference renders exactly what training saw.

    Raises:
        DataError: unknown name, no template at all, or a named template whose special tokens the
            tokenizer does not have.
    """
    if name is not None:
        template = CHAT_TEMPLATES.get(name)
        if template is None:
            raise DataError(f"dataset.chat_template: unknown template '{name}'; choose one of {', '.join(CHAT_TEMPLATES)}")
        missing = [t for t in template.special_tokens if not _single_token(tokenizer, t)]
        if missing:
            raise DataError(
                f"dataset.chat_template: '{name}' needs the special token(s) {', '.join(missing)}, which this tokenizer "
                "does not have as single tokens",
                hint="choose a template this model was trained with, or leave dataset.chat_template unset to use the tokenizer's own",
            )
        tokenizer.chat_template = template.jinja
        log(f"chat template: {name} (set on the tokenizer)")
        return template
    if not _template_source(tokenizer):
        raise DataError(
            "the dataset has conversations but the tokenizer has no chat template",
            hint=f"set dataset.chat_template to one of {', '.join(CHAT_TEMPLATES)} (chatml suits most base models)",
        )
    for template in CHAT_TEMPLATES.values():
        if _renders_like(tokenizer, template):
            log(f"chat template: the tokenizer's own (renders exactly like {template.name})")
            # Conversations with tools are rendered by the tokenizer itself: tool formats differ between
            # templates that agree on plain conversations.
            return replace(template, own=JinjaTemplate(tokenizer, _find_eot(tokenizer) or template.eot))
    eot = _find_eot(tokenizer)
    jt = JinjaTemplate(tokenizer, eot)
    if eot is None:
        log(
            "warning: the tokenizer's chat template ends answers without an end-of-turn token; "
            f"kubetune appends EOS ({tokenizer.eos_token!r}) to every trained answer so the model learns to stop"
        )
    else:
        log(f"chat template: the tokenizer's own (answers end with {eot})")
    if not _prefix_consistent(jt):
        log(
            "warning: the tokenizer's chat template renders a conversation prefix differently from the whole "
            "conversation; answer spans are located by content for such rows (check `kubetune data inspect`)"
        )
    return jt


def _prefix_consistent(jt: JinjaTemplate) -> bool:
    for probe in _PROBES:
        try:
            if jt.render(probe).prefix_inconsistent:
                return False
        except TemplateRowError:
            continue
    return True
