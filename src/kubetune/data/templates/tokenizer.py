"""The tokenizer's own chat template (:class:`JinjaTemplate`), the check that tools are rendered, and
:func:`resolve_template`, which picks the template a dataset is rendered with."""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from typing import Any, Callable, Sequence

from ...errors import DataError
from .base import Message, Rendered, TemplateRowError
from .registry import CHAT_TEMPLATES, ChatTemplate

__all__ = ["JinjaTemplate", "resolve_template", "unrendered_tool_name"]

# --- the tokenizer's own template --------------------------------------------------------------
class JinjaTemplate:
    """A template only the tokenizer can render: spans come from prefixes or generation markers.

    Slower than a registry template (it renders each conversation once per answer), but exact for any
    template whose prefix renders consistently; conversations where it does not are counted and their
    answers located by content instead.
    """

    def __init__(self, tokenizer: Any, eot: str | None, *, name: str = "tokenizer", source: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.eot = eot  # None: the template never closes an answer with a special token
        self.insert_eos = eot is None
        # source: a training version of the tokenizer's template (TRL's, with generation markers) to render with
        self._override = source
        self._source = source or _template_source(tokenizer)
        self._markers = bool(re.search(r"\{%-?\s*generation\s*-?%\}", self._source or ""))

    def _apply(self, msgs: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **({"tools": tools} if tools else {}),
                **({"chat_template": self._override} if self._override else {}),
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
                body = content.strip()
                found = text.find(body, start) if body else -1
                if found > start and not text[start:found].strip():  # a marker before the line break that opens the answer
                    start = found
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
    training = _trl_training_template(tokenizer)
    jt = JinjaTemplate(tokenizer, eot, source=training)
    if eot is None:
        log(
            "warning: the tokenizer's chat template ends answers without an end-of-turn token; "
            f"kubetune appends EOS ({tokenizer.eos_token!r}) to every trained answer so the model learns to stop"
        )
    else:
        log(f"chat template: the tokenizer's own (answers end with {eot})" + ("; answers located with TRL's training version of it" if training else ""))
    if not _prefix_consistent(jt):
        log(
            "warning: the tokenizer's chat template renders a conversation prefix differently from the whole "
            "conversation; answer spans are located by content for such rows (check `kubetune data inspect`)"
        )
    return jt


def _trl_training_template(tokenizer: Any) -> str | None:
    """TRL's training version of the tokenizer's own template, for the model families TRL knows (Qwen, Llama 3,
    Gemma, Phi, DeepSeek, ...): the same text with ``{% generation %}`` markers around each answer, and earlier
    turns rendered as they were (prefix-preserving), so answers are located exactly. None when the template
    already has what training needs, or TRL does not know it (kubetune then locates answers by prefixes)."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        return None
    try:
        return get_training_chat_template(tokenizer) or None
    except Exception:  # ValueError: a template TRL cannot patch; anything else: a template its checks cannot render
        return None


def _prefix_consistent(jt: JinjaTemplate) -> bool:
    for probe in _PROBES:
        try:
            if jt.render(probe).prefix_inconsistent:
                return False
        except TemplateRowError:
            continue
    return True
