"""Admission control of the server: what one request may ask for, and how much work may wait at once.

Every request is measured before it reaches the engine, in tokens it may occupy: the sum over its sequences
(prompts x ``n``) of prompt tokens + ``max_tokens``. Two kinds of refusal follow, both with OpenAI's error
body:

- **400**: a request that could never be admitted, whatever the load: more prompts or choices than allowed,
  a prompt (+ ``max_tokens``) longer than the context, more tokens than one request may occupy. The message
  names the field, the limit and the ``kubetune serve`` option that sets it.
- **429** with ``Retry-After``: the server is saturated. All admitted requests (running and waiting) together
  may occupy ``max_queued_tokens``; a request that does not fit now is refused, to be retried. The last
  ``1/SERVE_BUDGET_RESERVE_FRACTION`` of that budget is kept for small requests (each at most
  ``1/SERVE_BUDGET_SMALL_FRACTION`` of it), so big requests filling the server never lock short ones out.

A :class:`Ticket` holds a request's tokens until it is released, which the server does when the request
ends, fails, or its client goes away (serve/app.py releases it in the request's outermost middleware, so
no path can keep it).
"""

from __future__ import annotations

import math
from typing import Callable

from .. import constants as C
from .options import ServeOptions
from .protocol import APIError

__all__ = ["Admission", "Limits", "Ticket"]


class Limits:
    """The limits of one server: the options, with defaults derived from the model's context length."""

    def __init__(self, options: ServeOptions, context_length: int) -> None:
        self.context = context_length
        self.max_n = options.max_n
        self.max_prompts = options.max_prompts
        request = options.max_request_tokens or max(C.SERVE_MAX_REQUEST_TOKENS, context_length)
        queued = options.max_queued_tokens or max(C.SERVE_MAX_QUEUED_TOKENS, C.SERVE_QUEUED_PER_REQUEST * request)
        self.max_queued_tokens = queued
        self.max_request_tokens = min(request, queued)  # more could never be admitted
        self.reserve = queued // C.SERVE_BUDGET_RESERVE_FRACTION  # kept for small requests
        self.small = max(1, queued // C.SERVE_BUDGET_SMALL_FRACTION)  # what a small request is


class Ticket:
    """Tokens held by one admitted request; :meth:`release` gives them back (once, whoever calls it first)."""

    def __init__(self, admission: "Admission", tokens: int) -> None:
        self._admission = admission
        self.tokens = tokens

    def release(self) -> None:
        """Give the held tokens back to the admission budget; later calls do nothing."""
        if self.tokens:
            self._admission.used -= self.tokens
            self.tokens = 0


class Admission:
    """Checks requests against the limits and keeps the token budget of admitted requests.

    Used from the server's event loop only (no locking).

    Args:
        limits: the server's limits.
        throughput: tokens the engine generates per second now (for Retry-After; 0 when unknown).
    """

    def __init__(self, limits: Limits, *, throughput: Callable[[], float] | None = None) -> None:
        self.limits = limits
        self.used = 0  # tokens held by admitted requests
        self._throughput = throughput or (lambda: 0.0)

    # -- requests that can never be admitted: 400 ------------------------------------------------------
    def check_shape(self, *, n: int, prompts: int, messages: int = 0) -> None:
        """Refuse more choices or prompts than one request may have, or more chat messages than the context has
        tokens (each takes at least one), before any tokenizing."""
        lim = self.limits
        if messages > lim.context:
            raise APIError(
                400,
                f"messages: {messages} messages cannot fit this model's maximum context length of {lim.context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if n > lim.max_n:
            raise APIError(400, f"n: {n} choices is more than this server allows per request ({lim.max_n}, kubetune serve --max-n)", param="n")
        if prompts > lim.max_prompts:
            raise APIError(
                400,
                f"prompt: {prompts} prompts in one request is more than this server allows ({lim.max_prompts}, kubetune serve --max-prompts); "
                "send them in several requests",
                param="prompt",
            )

    def check_text(self, chars: int, *, field: str, max_token_chars: int) -> None:
        """Refuse text that cannot fit the context however it tokenizes, before tokenizing it (which takes time)."""
        ctx = self.limits.context
        if chars > ctx * max(1, max_token_chars) * C.SERVE_CHARS_PER_TOKEN_MARGIN:
            raise APIError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, the {field} has {chars} characters, "
                f"which is far more than {ctx} tokens. Please reduce the length of the {field}.",
                param=field,
                code="context_length_exceeded",
            )

    def check_cost(self, lengths: list[int], max_tokens: list[int], *, n: int, prompt_field: str, max_tokens_given: bool) -> int:
        """The tokens a request may occupy (its sequences' prompt + max_tokens); 400 when one request may not
        hold that many. The message shows how the total is made and names the field to reduce."""
        cost = sum(p + m for p, m in zip(lengths, max_tokens))
        limit = self.limits.max_request_tokens
        if cost <= limit:
            return cost
        prompts = len(lengths) // max(n, 1)
        per_prompt = [lengths[i] + max_tokens[i] for i in range(0, len(lengths), max(n, 1))]
        if prompts > 1 and max(per_prompt) * n <= limit:
            param = "prompt"  # fewer prompts per request would fit
        elif n > 1 and sum(per_prompt) <= limit:
            param = "n"
        elif max_tokens_given and sum(lengths[:: max(n, 1)]) + prompts <= limit:
            param = "max_tokens"
        else:
            param = prompt_field
        shape = f"{prompts} prompts x " if prompts > 1 else ""
        raise APIError(
            400,
            f"{param}: this request may occupy {cost} tokens ({shape}n={n} sequences, each prompt + max_tokens "
            f"{'/'.join(map(str, sorted(set(per_prompt))))}), more than this server allows one request "
            f"({limit} tokens, kubetune serve --max-request-tokens); reduce n, max_tokens or the prompts",
            param=param,
            code="request_too_large",
        )

    # -- a saturated server: 429 -----------------------------------------------------------------------------
    def reserve(self, tokens: int) -> Ticket:
        """Hold ``tokens`` of the budget, or raise a 429 APIError with a Retry-After header."""
        lim = self.limits
        room = lim.max_queued_tokens if tokens <= lim.small else lim.max_queued_tokens - lim.reserve
        if self.used and self.used + tokens > room:
            raise APIError(
                429,
                f"The server is busy: admitted requests hold {self.used} of its {lim.max_queued_tokens} tokens and this one "
                f"needs {tokens}. Please retry after the time in the Retry-After header, or ask for fewer tokens (n, max_tokens).",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after(self.used + tokens - room))},
            )
        self.used += tokens
        return Ticket(self, tokens)

    def retry_after(self, excess: int) -> int:
        """Seconds until about ``excess`` tokens are freed, at the engine's current pace (1 to 60)."""
        rate = self._throughput()
        seconds = excess / rate if rate > 0 else C.SERVE_RETRY_AFTER_MIN_S
        return int(min(C.SERVE_RETRY_AFTER_MAX_S, max(C.SERVE_RETRY_AFTER_MIN_S, math.ceil(seconds))))
