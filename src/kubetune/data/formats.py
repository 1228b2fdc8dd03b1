"""Row formats: detect which one a row is in, and normalize it to one of two shapes.

Every format becomes either a **chat** (a list of ``(role, content, trained)`` messages, rendered with
a chat template) or a **plain** pair ``(prompt, completion)`` that is tokenized as is (``text`` rows
are a plain pair with an empty prompt). ``trained`` marks the assistant answers that get a loss.

The registry :data:`FORMATS` maps each format name to its detector keys and normalizer; a row that
matches no format, or a field of the wrong type, raises :class:`RowError` with the problem (the caller
adds ``file:line``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping  # not typing.Mapping: its isinstance checks are several times slower
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "FORMATS",
    "FORMAT_KEYS",
    "COLUMN_NAMES",
    "RowError",
    "Chat",
    "Plain",
    "detect",
    "normalize",
    "rename_columns",
    "describe_keys",
    "first_matching",
    "describe_mismatch",
    "normalize_tool_calls",
    "normalize_tools",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
_ROLE_ALIASES = {"developer": "system", "human": "user", "gpt": "assistant", "model": "assistant", "function": "tool", "ipython": "tool"}
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}

# Names a user may map their own columns onto with ``dataset.columns`` (kubetune name -> yours).
COLUMN_NAMES = (
    "messages", "conversations", "prompt", "completion", "instruction", "input", "output", "system", "text",
    "tools", "role", "content", "from", "value", "weight", "chosen", "rejected",
)  # fmt: skip


class RowError(ValueError):
    """One row is malformed; the message says what is wrong (without the location)."""


@dataclass(frozen=True)
class Chat:
    """A conversation: messages as (role, content, trained), and what tool calling adds to them.

    Attributes:
        messages: (role, content, trained) per message.
        tools: the function schemas offered to the model (the row's ``tools``), in OpenAI's
            ``{"type": "function", "function": {...}}`` form; None when the row has none.
        extras: per message, the keys a template renders beside role and content: ``tool_calls``
            (assistant; OpenAI form with ``arguments`` as an object), ``name`` and ``tool_call_id`` (tool
            results); None when no message has any.
    """

    messages: list[tuple[str, str, bool]]
    tools: list[dict] | None = None
    extras: tuple[dict | None, ...] | None = None

    @property
    def has_tools(self) -> bool:
        """True when rendering needs a template that knows tool calling."""
        return bool(self.tools) or any(e and e.get("tool_calls") for e in self.extras or ())


@dataclass(frozen=True)
class Plain:
    """Untemplated text: the prompt is context, the completion (plus EOS) is trained."""

    prompt: str
    completion: str


@dataclass(frozen=True)
class _Keys:
    """Inner key names (after ``dataset.columns``)."""

    role: str = "role"
    content: str = "content"
    from_: str = "from"
    value: str = "value"
    weight: str = "weight"


# --- helpers ---------------------------------------------------------------------------------
def _text(value: Any, what: str) -> str:
    """A content value as text: a string, or OpenAI's list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for p in value:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
            else:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise RowError(f"{what}: only text parts are supported, found a '{kind}' part")
        return "".join(parts)
    if value is None:
        raise RowError(f"{what} is missing (null)")
    raise RowError(f"{what} must be a string, got {type(value).__name__}")


def _weight(msg: Mapping, keys: _Keys, role: str, what: str) -> bool:
    if keys.weight not in msg or msg[keys.weight] is None:
        return True
    w = msg[keys.weight]
    if isinstance(w, bool) or w not in (0, 1):
        raise RowError(f"{what}: weight must be 0 or 1, got {w!r}")
    if role != "assistant":
        raise RowError(f"{what}: weight applies to assistant messages only (this one is '{role}')")
    return w == 1


def _maybe_json(value: Any) -> Any:
    """CSV cells hold conversations as JSON strings."""
    if isinstance(value, str) and value[:1] == "[":
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"not valid JSON: {e.msg} (column {e.colno})") from None
    return value


def _require_answer(messages: list[tuple[str, str, bool]], train_on_inputs: bool) -> None:
    if train_on_inputs:
        return
    answers = [m for m in messages if m[0] == "assistant"]
    if not answers:
        roles = ", ".join(dict.fromkeys(m[0] for m in messages)) or "none"
        raise RowError(f"no assistant message, so nothing to train on (roles: {roles})")
    if not any(m[2] for m in answers):
        raise RowError("every assistant message has weight 0, so nothing to train on")


def _json_value(value: Any, what: str) -> Any:
    """A value that datasets store either as JSON or as a JSON string (tools, tool-call arguments)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"{what} is a string but not valid JSON: {e.msg} (column {e.colno})") from None
    return value


def normalize_tool_calls(value: Any, what: str = "tool_calls") -> list[dict]:
    """Tool calls in OpenAI's form, ``[{"type": "function", "function": {"name", "arguments": {...}}}]``.

    Accepts that form (``arguments`` as an object or a JSON string, as OpenAI's API returns it), the flat
    ``{"name", "arguments"}`` form, one call instead of a list, and all of these as a JSON string.
    """
    calls = _json_value(value, what)
    if isinstance(calls, Mapping):
        calls = [calls]
    if not isinstance(calls, list):
        raise RowError(f"{what} must be a list of calls, got {type(calls).__name__}")
    out = []
    for j, call in enumerate(calls):
        where = f"{what}[{j}]"
        if not isinstance(call, Mapping):
            raise RowError(f"{where} must be an object with a function name and arguments, got {type(call).__name__}")
        fn = call.get("function", call)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowError(f"{where} has no function name (expected {{\"function\": {{\"name\": ..., \"arguments\": {{...}}}}}})")
        args = fn.get("arguments", fn.get("parameters"))
        args = {} if args is None else _json_value(args, f"{where}.arguments")
        if not isinstance(args, Mapping):
            raise RowError(f"{where}.arguments must be a JSON object, got {type(args).__name__}")
        norm: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": dict(args)}}
        if isinstance(call.get("id"), str):
            norm["id"] = call["id"]
        out.append(norm)
    return out


def normalize_tools(value: Any) -> list[dict] | None:
    """The row's ``tools``: function schemas, each in OpenAI's ``{"type": "function", "function": {...}}`` form."""
    tools = _json_value(value, "tools")
    if tools is None or tools == []:
        return None
    if isinstance(tools, Mapping):
        tools = [tools]
    if not isinstance(tools, list):
        raise RowError(f"'tools' must be a list of function schemas, got {type(tools).__name__}")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise RowError(f"tools[{j}] must be an object (a function schema), got {type(tool).__name__}")
        if "type" not in tool and isinstance(tool.get("name"), str):  # a bare schema: {"name", "description", "parameters"}
            tool = {"type": "function", "function": dict(tool)}
        fn = tool.get("function")
        if tool.get("type") == "function" and not (isinstance(fn, Mapping) and isinstance(fn.get("name"), str)):
            raise RowError(f"tools[{j}] has no function name")
        out.append(dict(tool))
    return out


def _messages(items: Any, keys: _Keys, what: str, *, trained_ok: bool = True) -> tuple[list[tuple[str, str, bool]], list[dict | None]]:
    """The messages as (role, content, trained), and per message its tool-calling keys (or None)."""
    items = _maybe_json(items)
    if not isinstance(items, list):
        raise RowError(f"'{what}' must be a list of messages, got {type(items).__name__}")
    if not items:
        raise RowError(f"'{what}' is empty")
    out = []
    extras: list[dict | None] = []
    for i, m in enumerate(items):
        where = f"{what}[{i}]"
        if not isinstance(m, (dict, Mapping)):  # dict first: the common case, checked without the ABC machinery
            raise RowError(f"{where} must be an object with {keys.role} and {keys.content}, got {type(m).__name__}")
        if keys.role not in m:
            raise RowError(f"{where} has no '{keys.role}'")
        role = m[keys.role]
        role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise RowError(f"{where}: unknown role {m[keys.role]!r} (expected system, user, assistant or tool)")
        extra = None
        if m.get("tool_calls"):
            if role != "assistant":
                raise RowError(f"{where}: tool_calls belong to assistant messages (this one is '{role}')")
            extra = {"tool_calls": normalize_tool_calls(m["tool_calls"], f"{where}.tool_calls")}
            content = "" if m.get(keys.content) is None else _text(m[keys.content], f"{where}.{keys.content}")
        else:
            if keys.content not in m:
                raise RowError(f"{where} has no '{keys.content}'")
            content = _text(m[keys.content], f"{where}.{keys.content}")
        if role == "tool":
            named = {k: m[k] for k in ("name", "tool_call_id") if isinstance(m.get(k), str)}
            extra = named or None
        trained = _weight(m, keys, role, where) and role == "assistant" and trained_ok
        out.append((role, content, trained))
        extras.append(extra)
    return out, extras


def _chat(msgs: list[tuple[str, str, bool]], extras: list[dict | None], row: Mapping) -> Chat:
    tools = normalize_tools(row["tools"]) if "tools" in row else None
    return Chat(msgs, tools, tuple(extras) if any(extras) else None)


# --- formats ---------------------------------------------------------------------------------
def _norm_messages(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat:
    msgs, extras = _messages(row["messages"], keys, "messages")
    _require_answer(msgs, train_on_inputs)
    return _chat(msgs, extras, row)


def _norm_sharegpt(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat:
    items = _maybe_json(row["conversations"])
    if not isinstance(items, list):
        raise RowError(f"'conversations' must be a list of turns, got {type(items).__name__}")
    if not items:
        raise RowError("'conversations' is empty")
    if all(isinstance(t, Mapping) and keys.role in t and keys.from_ not in t for t in items):  # role/content variant
        msgs, extras = _messages(items, keys, "conversations")
    else:
        msgs, extras = [], []
        for i, t in enumerate(items):
            where = f"conversations[{i}]"
            if not isinstance(t, Mapping) or keys.from_ not in t or keys.value not in t:
                raise RowError(f"{where} must be an object with '{keys.from_}' and '{keys.value}'")
            who = t[keys.from_]
            who = who.lower() if isinstance(who, str) else who
            if who == "function_call":  # LLaMA-Factory's ShareGPT tool use: the assistant's call as JSON
                msgs.append(("assistant", "", _weight(t, keys, "assistant", where)))
                extras.append({"tool_calls": normalize_tool_calls(t[keys.value], f"{where}.{keys.value}")})
                continue
            role = _SHAREGPT_ROLES.get(who)
            if role is None:
                raise RowError(f"{where}: unknown speaker {t[keys.from_]!r} (expected human, gpt, system, function_call or observation)")
            content = _text(t[keys.value], f"{where}.{keys.value}")
            msgs.append((role, content, _weight(t, keys, role, where) and role == "assistant"))
            extras.append(None)
    _require_answer(msgs, train_on_inputs)
    return _chat(msgs, extras, row)


def _norm_prompt_completion(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat | Plain:
    prompt, completion = _maybe_json(row["prompt"]), _maybe_json(row["completion"])
    if isinstance(prompt, list) or isinstance(completion, list):  # TRL's conversational variant
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            raise RowError("'prompt' and 'completion' must both be strings or both be message lists")
        head, head_extras = _messages(prompt, keys, "prompt", trained_ok=False)
        tail, tail_extras = _messages(completion, keys, "completion")
        msgs = head + tail
        _require_answer(msgs, train_on_inputs)
        return _chat(msgs, head_extras + tail_extras, row)
    if not isinstance(prompt, str):
        raise RowError(f"'prompt' must be a string, got {type(prompt).__name__}")
    if not isinstance(completion, str):
        raise RowError(f"'completion' must be a string, got {type(completion).__name__}")
    return Plain(prompt, completion)


def _norm_alpaca(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat:
    instruction = _text(row["instruction"], "instruction")
    extra = row.get("input")
    extra = "" if extra is None else _text(extra, "input")
    output = _text(row["output"], "output")
    user = f"{instruction}\n\n{extra}" if instruction and extra else (instruction or extra)
    msgs = []
    system = row.get("system")
    if system:
        msgs.append(("system", _text(system, "system"), False))
    msgs += [("user", user, False), ("assistant", output, True)]
    return Chat(msgs)


def _norm_text(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Plain:
    return Plain("", _text(row["text"], "text"))


Normalizer = Callable[[Mapping, _Keys, bool], "Chat | Plain"]

# name -> (keys a row must have, normalizer). Order matters for detection: the first match wins.
FORMATS: dict[str, tuple[tuple[str, ...], Normalizer]] = {
    "messages": (("messages",), _norm_messages),
    "sharegpt": (("conversations",), _norm_sharegpt),
    "prompt_completion": (("prompt", "completion"), _norm_prompt_completion),
    "alpaca": (("instruction", "output"), _norm_alpaca),
    "text": (("text",), _norm_text),
}
FORMAT_KEYS = {name: keys for name, (keys, _) in FORMATS.items()}


def rename_columns(row: Mapping, columns: Mapping[str, str]) -> Mapping:
    """Apply ``dataset.columns`` (kubetune name -> the dataset's name) to a row's top-level keys."""
    if not columns:
        return row
    out = dict(row)
    for ours, theirs in columns.items():
        if ours in ("role", "content", "from", "value", "weight"):
            continue
        if theirs in out and ours != theirs:
            out[ours] = out.pop(theirs)
    return out


def inner_keys(columns: Mapping[str, str]) -> _Keys:
    """Inner message key names after ``dataset.columns``."""
    return _Keys(
        role=columns.get("role", "role"),
        content=columns.get("content", "content"),
        from_=columns.get("from", "from"),
        value=columns.get("value", "value"),
        weight=columns.get("weight", "weight"),
    )


def detect(row: Mapping) -> str | None:
    """The format of one (renamed) row, or None when it matches none."""
    return first_matching(row, FORMAT_KEYS)


def describe_keys(row: Any) -> str:
    """What was found in a row that matches no format, and what each format needs."""
    return describe_mismatch(row, FORMAT_KEYS, "row matches no format")


def first_matching(row: Mapping, formats: Mapping[str, tuple[str, ...]]) -> str | None:
    """The first of ``formats`` (name: the keys it needs) whose keys ``row`` all has, or None."""
    return next((name for name, keys in formats.items() if all(k in row for k in keys)), None)


def describe_mismatch(row: Any, formats: Mapping[str, tuple[str, ...]], problem: str) -> str:
    """``problem``, with the keys ``row`` has and the keys each of ``formats`` needs (the message of a row that fits
    none)."""
    if not isinstance(row, Mapping):
        return f"expected a JSON object, got {type(row).__name__}"
    found = ", ".join(sorted(map(str, row))) or "no keys"
    needs = "; ".join(f"{n}: {'+'.join(k)}" for n, k in formats.items())
    return f"{problem} (found {found}; formats need {needs}; map other names with dataset.columns)"


def normalize(row: Mapping, fmt: str, keys: _Keys, *, train_on_inputs: bool) -> Chat | Plain:
    """Normalize a row already known (or declared) to be in ``fmt``.

    Raises:
        RowError: a key the format needs is missing or has the wrong type.
    """
    required, fn = FORMATS[fmt]
    missing = [k for k in required if k not in row]
    if missing:
        raise RowError(f"not a {fmt} row: missing {', '.join(repr(k) for k in missing)} (found {', '.join(sorted(map(str, row))) or 'no keys'})")
    return fn(row, keys, train_on_inputs)
