"""How a row's next token is chosen and how much of its text may be sent yet.

- :func:`_sample`: greedy for temperature 0, else temperature/top-p with the row's own seeded generator, so a
  seeded request gives the same text alone or in a crowd;
- :func:`_find_stop`: where the first stop string begins;
- :func:`_holdback`: the end of the text to hold back while streaming (a partial UTF-8 character, or what
  may be the beginning of a stop string), so a delta never splits a character or leaks part of a stop.

The rows themselves (tokens, text sent, their generator) are the engine's (:mod:`kubetune.serve.engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import _Row


def _sample(logits: Any, rows: list[_Row]) -> list[int]:
    """The next token of every row from its last logits (one row of ``logits`` per row), as each row samples."""
    import torch

    logits = logits.float()
    tokens = logits.argmax(dim=-1).tolist()
    for i, r in enumerate(rows):
        p = r.req.params
        if p.temperature <= 0:
            continue
        scores = (logits[i] - logits[i].max()) / p.temperature  # the best token at 0: a tiny temperature cannot overflow
        if p.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            probs = torch.softmax(sorted_scores, dim=-1)
            drop = probs.cumsum(-1) - probs > p.top_p  # keep the smallest set reaching top_p (at least one)
            scores = scores.clone()
            scores[order[drop]] = float("-inf")
        probs = torch.softmax(scores, dim=-1).cpu()
        try:
            tokens[i] = int(torch.multinomial(probs, 1, generator=r.generator).item())
        except RuntimeError:  # no valid distribution (non-finite logits): this row decodes greedily, the batch goes on
            pass
    return tokens


def _find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Where the first of ``stops`` begins in ``text`` (searching from ``start``); None when none is there."""
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _holdback(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` not to send yet: a partial UTF-8 character or a stop string's start."""
    n = 0
    while n < min(3, len(text)) and text[len(text) - 1 - n] == "\ufffd":
        n += 1
    if n:
        return n
    best = 0
    for s in stops:
        if len(s) < 2:
            continue
        tail = text[-(len(s) - 1) :]  # the longest end of the text that can still be a stop's beginning
        i = tail.find(s[0])
        while i >= 0 and len(tail) - i > best:  # the first match is the longest
            if s.startswith(tail[i:]):
                best = len(tail) - i
                break
            i = tail.find(s[0], i + 1)
    return best
