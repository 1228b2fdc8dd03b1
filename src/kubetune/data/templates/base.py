"""What both kinds of chat template share: the message form, the rendered result and the protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

__all__ = ["Message", "Rendered", "Template", "TemplateRowError"]

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




class Template(Protocol):
    """A chat template of either kind: :class:`registry.ChatTemplate` (named, rendered in Python) or
    :class:`tokenizer.JinjaTemplate` (the tokenizer's own, rendered by the tokenizer)."""

    name: str
    eot: str | None  # the end-of-turn token that closes trained answers (None: the template has none)

    def render(self, messages: Sequence[Message], *, train_all: bool = False, add_generation_prompt: bool = False,
               tools: list[dict] | None = None, extras: Sequence[dict | None] | None = None) -> Rendered:
        """The conversation as text and the character spans that are trained."""
        ...
