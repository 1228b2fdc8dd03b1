"""Tool calling on the chat endpoint: request messages for the chat template, and calls parsed from replies.

Requests: ``tools`` and the conversation's earlier ``tool_calls`` / ``tool`` results are handed to the
model's chat template (``arguments`` strings, as OpenAI clients send them, become objects, which is what
templates render). Replies: calls are read in the Hermes / Qwen2.5 form, one JSON object
``{"name": ..., "arguments": {...}}`` inside ``<tool_call>...</tool_call>`` each. That is how kubetune's
``chatml`` template trains them (docs/datasets.md) and how Qwen2.5, Hermes and most ChatML models write them.
A reply whose blocks do not parse is returned as plain text, never half-parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from ..data.formats import RowError, normalize_tool_calls, normalize_tools

__all__ = ["ToolRequestError", "request_messages", "request_tools", "parse_tool_calls", "ToolStream"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolRequestError(ValueError):
    """A tool field of the request is malformed: ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def request_tools(tools: list[Any] | None) -> list[dict] | None:
    """The request's ``tools`` as function schemas for the chat template.

    Raises:
        ToolRequestError: a tool that is not a function with a name.
    """
    try:
        return normalize_tools(tools)
    except RowError as e:
        raise ToolRequestError("tools", str(e)) from None


def request_messages(messages: list[Any]) -> list[dict]:
    """The conversation as the chat template takes it: role, content, and tool calls / tool-result ids.

    Raises:
        ToolRequestError: a malformed ``tool_calls`` entry (the param names the message).
    """
    out = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            try:
                msg["tool_calls"] = normalize_tool_calls(m.tool_calls, f"messages[{i}].tool_calls")
            except RowError as e:
                raise ToolRequestError(f"messages[{i}].tool_calls", str(e)) from None
        if m.role == "tool":
            msg.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v})
        out.append(msg)
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """Split a reply into its text and its tool calls (OpenAI's form, ``arguments`` as a JSON string).

    Returns:
        (content, calls): the text before the first call (None when empty), and the calls; or
        (text, []) when the reply has no call or a block that is not a ``{"name", "arguments"}`` object.
    """
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls = []
    for block in _BLOCK.findall(text, start):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return text, []
        calls.append(
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}
        )
    rest = _BLOCK.sub("", text[start:]).strip()
    if not calls or rest:  # an unclosed block (cut by max_tokens) or text after the calls: keep the reply as text
        return text, []
    content = text[:start].strip()
    return (content or None), calls


class ToolStream:
    """Streams a reply's text while holding back what may be the start of a tool call.

    :meth:`feed` returns the text that is safe to send now; once ``<tool_call>`` appears, everything after it
    is held. :meth:`finish` returns the text still to send and the parsed calls (empty when the held part
    was not a valid call, which is then sent as text).
    """

    def __init__(self) -> None:
        self._held = ""
        self._sent = ""
        self._in_call = False

    def feed(self, piece: str) -> str:
        """Take the next piece of the reply; return the text that is safe to send now (none once a call has begun)."""
        self._held += piece
        if self._in_call:
            return ""
        at = self._held.find(OPEN)
        if at >= 0:
            self._in_call = True
            out, self._held = self._held[:at], self._held[at:]
        else:
            keep = _partial_open(self._held)
            out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        self._sent += out
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """The end of the reply: ``(text still to send, tool calls)``; a held part that is no valid call comes back as text."""
        held, self._held = self._held, ""
        if not self._in_call:
            return held, []
        _, calls = parse_tool_calls(self._sent + held)
        if not calls:
            return held, []
        return "", calls


def _partial_open(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
