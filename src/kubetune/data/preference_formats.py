"""Preference rows: detect their shape and normalize them to one (prompt, chosen, rejected) pair.

The shapes accepted (``method.objective: dpo | orpo``), after ``dataset.columns`` renaming:

* ``preference``: ``prompt`` + ``chosen`` + ``rejected``. Plain strings; or conversational, the prompt a
  message list (or a string: one user message) and each answer an assistant message list or a string.
  UltraFeedback-binarized rows, whose ``chosen``/``rejected`` repeat the prompt as their first messages,
  are this shape too: the messages both answers share become the prompt.
* ``preference_implicit``: ``chosen`` + ``rejected`` only. Full conversations with a shared prefix (the
  prefix is the prompt), or Anthropic HH-style texts (``\\n\\nHuman: ...\\n\\nAssistant: ...``), whose
  shared turns are the prompt.

A pair is chat (:class:`Pair` with message lists, rendered with the chat template) or plain (strings,
tokenized as they are). Rows where chosen equals rejected or a side is empty raise :class:`RowError`
(the caller adds ``file:line``). This module is a plain table: the spec imports it for the format names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from .formats import RowError, _Keys, _maybe_json, _messages, describe_mismatch, first_matching, normalize_tools

__all__ = ["PREFERENCE_FORMATS", "PREFERENCE_KEYS", "Pair", "detect_preference", "normalize_preference", "describe_preference_keys"]

Message = tuple[str, str, bool]


@dataclass(frozen=True)
class Pair:
    """One preference pair. Chat: ``prompt`` and the answers are message lists ``(role, content, trained)``
    (only the answers' assistant messages are trained); plain: three strings."""

    prompt: list[Message] | str
    chosen: list[Message] | str
    rejected: list[Message] | str
    tools: list[dict] | None = None

    @property
    def is_chat(self) -> bool:
        """True when the pair is rendered with a chat template."""
        return isinstance(self.chosen, list)


# --- helpers ---------------------------------------------------------------------------------
_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ ]?")


def _hh_messages(text: str, what: str) -> list[Message] | None:
    """An Anthropic HH-style text as messages, or None when it has no ``Human:``/``Assistant:`` turns."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3:
        return None
    msgs: list[Message] = []
    for who, content in zip(parts[1::2], parts[2::2]):
        msgs.append(("user" if who == "Human" else "assistant", content.strip(), who == "Assistant"))
    if parts[0].strip():
        raise RowError(f"'{what}' has text before its first Human:/Assistant: turn")
    return msgs


def _answer(value: Any, keys: _Keys, what: str) -> list[Message]:
    """An answer given as a message list, one message, or a string (one assistant message)."""
    value = _maybe_json(value)
    if isinstance(value, str):
        return [("assistant", value, True)]
    if isinstance(value, Mapping):
        value = [value]
    msgs, _ = _messages(value, keys, what)
    return msgs


def _shared_prefix(a: list[Message], b: list[Message]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n][:2] == b[n][:2]:
        n += 1
    return n


def _untrained(msgs: list[Message]) -> list[Message]:
    return [(r, c, False) for r, c, _ in msgs]


def _completion(msgs: list[Message], what: str) -> list[Message]:
    if not msgs:
        raise RowError(f"'{what}' is empty: nothing follows the prompt")
    if msgs[-1][0] != "assistant":
        raise RowError(f"'{what}' must end with an assistant message (it ends with a '{msgs[-1][0]}' message)")
    if not any(r == "assistant" and c.strip() for r, c, _ in msgs):
        raise RowError(f"'{what}' is empty")
    return [(r, c, r == "assistant") for r, c, _ in msgs]


def _split_conversations(chosen: list[Message], rejected: list[Message]) -> Pair:
    """Two full conversations: what they share is the prompt, the rest are the answers."""
    n = _shared_prefix(chosen, rejected)
    while n and chosen[n - 1][0] == "assistant" and (n == len(chosen) or n == len(rejected)):
        n -= 1  # a shared final answer belongs to the answers (the equality check names it)
    if n == 0:
        raise RowError("'chosen' and 'rejected' share no prompt (their first messages differ); give a 'prompt' column")
    return Pair(_untrained(chosen[:n]), _completion(chosen[n:], "chosen"), _completion(rejected[n:], "rejected"))


def _check(pair: Pair) -> Pair:
    if pair.is_chat:
        same = [m[:2] for m in pair.chosen] == [m[:2] for m in pair.rejected]  # type: ignore[union-attr]
    else:
        for side in ("chosen", "rejected"):
            if not getattr(pair, side).strip():
                raise RowError(f"'{side}' is empty")
        same = pair.chosen == pair.rejected
    if same:
        raise RowError("'chosen' and 'rejected' are the same answer, so there is nothing to prefer")
    return pair


# --- formats ---------------------------------------------------------------------------------
def _norm_explicit(row: Mapping, keys: _Keys) -> Pair:
    prompt, chosen, rejected = (_maybe_json(row[k]) for k in ("prompt", "chosen", "rejected"))
    tools = normalize_tools(row["tools"]) if "tools" in row else None
    if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
        return _check(Pair(prompt, chosen, rejected))
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise RowError("'chosen' and 'rejected' must both be strings or both be message lists")
    c, r = _answer(chosen, keys, "chosen"), _answer(rejected, keys, "rejected")
    if c[0][0] != "assistant" and r[0][0] != "assistant":  # UltraFeedback: the answers repeat the prompt
        pair = _split_conversations(c, r)
        return _check(Pair(pair.prompt, pair.chosen, pair.rejected, tools))
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RowError("'prompt' is empty")
        head = [("user", prompt, False)]
    else:
        head, _ = _messages(prompt, keys, "prompt", trained_ok=False)
    return _check(Pair(head, _completion(c, "chosen"), _completion(r, "rejected"), tools))


def _norm_implicit(row: Mapping, keys: _Keys) -> Pair:
    chosen, rejected = _maybe_json(row["chosen"]), _maybe_json(row["rejected"])
    if isinstance(chosen, str) and isinstance(rejected, str):
        c, r = _hh_messages(chosen, "chosen"), _hh_messages(rejected, "rejected")
        if c is None or r is None:
            raise RowError(
                "'chosen' and 'rejected' are texts without a prompt: add a 'prompt' column (dataset.columns maps yours), "
                "or give conversations (message lists, or Anthropic HH's '\\n\\nHuman: ... \\n\\nAssistant: ...' turns)"
            )
    elif isinstance(chosen, str) or isinstance(rejected, str):
        raise RowError("'chosen' and 'rejected' must both be texts or both be message lists")
    else:
        c, r = _answer(chosen, keys, "chosen"), _answer(rejected, keys, "rejected")
    pair = _split_conversations(c, r)
    tools = normalize_tools(row["tools"]) if "tools" in row else None
    return _check(Pair(pair.prompt, pair.chosen, pair.rejected, tools))


# name -> (keys a row must have, normalizer). Order matters for detection: the first match wins.
PREFERENCE_FORMATS: dict[str, tuple[tuple[str, ...], Callable[[Mapping, _Keys], Pair]]] = {
    "preference": (("prompt", "chosen", "rejected"), _norm_explicit),
    "preference_implicit": (("chosen", "rejected"), _norm_implicit),
}
PREFERENCE_KEYS = {name: keys for name, (keys, _) in PREFERENCE_FORMATS.items()}


def detect_preference(row: Mapping) -> str | None:
    """The preference format of one (renamed) row, or None when it matches none."""
    return first_matching(row, PREFERENCE_KEYS)


def describe_preference_keys(row: Any) -> str:
    """What was found in a row that holds no preference pair, and what each shape needs."""
    return describe_mismatch(row, PREFERENCE_KEYS, "row holds no preference pair")


def normalize_preference(row: Mapping, fmt: str, keys: _Keys) -> Pair:
    """Normalize a row known (or declared) to be in the preference format ``fmt``.

    Raises:
        RowError: a key is missing or has the wrong type, a side is empty, or chosen equals rejected.
    """
    required, fn = PREFERENCE_FORMATS[fmt]
    missing = [k for k in required if k not in row]
    if missing:
        raise RowError(f"not a {fmt} row: missing {', '.join(repr(k) for k in missing)} (found {', '.join(sorted(map(str, row))) or 'no keys'})")
    for k in required:
        if row[k] is None:
            raise RowError(f"'{k}' is missing (null)")
    return fn(row, keys)
