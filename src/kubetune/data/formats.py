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
    "role", "content", "from", "value", "weight",
)  # fmt: skip


class RowError(ValueError):
    """One row is malformed; the message says what is wrong (without the location)."""


@dataclass(frozen=True)
class Chat:
    """A conversation: messages as (role, content, trained)."""

    messages: list[tuple[str, str, bool]]


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


def _messages(items: Any, keys: _Keys, what: str, *, trained_ok: bool = True) -> list[tuple[str, str, bool]]:
    items = _maybe_json(items)
    if not isinstance(items, list):
        raise RowError(f"'{what}' must be a list of messages, got {type(items).__name__}")
    if not items:
        raise RowError(f"'{what}' is empty")
    out = []
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
        if m.get("tool_calls"):
            raise RowError(f"{where}: tool_calls are not supported yet; put the call into the content as text")
        if keys.content not in m:
            raise RowError(f"{where} has no '{keys.content}'")
        content = _text(m[keys.content], f"{where}.{keys.content}")
        trained = _weight(m, keys, role, where) and role == "assistant" and trained_ok
        out.append((role, content, trained))
    return out


# --- formats ---------------------------------------------------------------------------------
def _norm_messages(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat:
    msgs = _messages(row["messages"], keys, "messages")
    _require_answer(msgs, train_on_inputs)
    return Chat(msgs)


def _norm_sharegpt(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat:
    items = _maybe_json(row["conversations"])
    if not isinstance(items, list):
        raise RowError(f"'conversations' must be a list of turns, got {type(items).__name__}")
    if not items:
        raise RowError("'conversations' is empty")
    if all(isinstance(t, Mapping) and keys.role in t and keys.from_ not in t for t in items):  # role/content variant
        msgs = _messages(items, keys, "conversations")
    else:
        msgs = []
        for i, t in enumerate(items):
            where = f"conversations[{i}]"
            if not isinstance(t, Mapping) or keys.from_ not in t or keys.value not in t:
                raise RowError(f"{where} must be an object with '{keys.from_}' and '{keys.value}'")
            who = t[keys.from_]
            role = _SHAREGPT_ROLES.get(who.lower() if isinstance(who, str) else who)
            if role is None:
                raise RowError(f"{where}: unknown speaker {who!r} (expected human, gpt or system)")
            content = _text(t[keys.value], f"{where}.{keys.value}")
            msgs.append((role, content, _weight(t, keys, role, where) and role == "assistant"))
    _require_answer(msgs, train_on_inputs)
    return Chat(msgs)


def _norm_prompt_completion(row: Mapping, keys: _Keys, train_on_inputs: bool) -> Chat | Plain:
    prompt, completion = _maybe_json(row["prompt"]), _maybe_json(row["completion"])
    if isinstance(prompt, list) or isinstance(completion, list):  # TRL's conversational variant
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            raise RowError("'prompt' and 'completion' must both be strings or both be message lists")
        head = _messages(prompt, keys, "prompt", trained_ok=False)
        tail = _messages(completion, keys, "completion")
        msgs = head + tail
        _require_answer(msgs, train_on_inputs)
        return Chat(msgs)
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
    for name, (keys, _) in FORMATS.items():
        if all(k in row for k in keys):
            return name
    return None


def describe_keys(row: Any) -> str:
    """What was found in a row that matches no format, and what each format needs."""
    if not isinstance(row, Mapping):
        return f"expected a JSON object, got {type(row).__name__}"
    found = ", ".join(sorted(map(str, row))) or "no keys"
    needs = "; ".join(f"{n}: {'+'.join(k)}" for n, k in FORMAT_KEYS.items())
    return f"row matches no format (found {found}; formats need {needs}; map other names with dataset.columns)"


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
