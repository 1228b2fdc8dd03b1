"""The transformers engine: continuous batching of concurrent requests on one model, CPU or GPU.

One background thread owns the model. It takes waiting requests, prefills them together (left-padded),
merges them into the running batch's KV cache, and then decodes one token for every running request per
step. A request leaves the batch as soon as it finishes (EOS/end-of-turn, a stop string, max_tokens, or
the client went away); the next waiting requests join at the following step, so nobody waits for the
longest request of a batch. Requests for different LoRA adapters share a batch (PEFT's mixed-adapter
forward, ``adapter_names``). Sampling is per request: greedy, or temperature/top-p with its own seeded
generator, so a seeded request gives the same text alone or in a crowd.

The batch is shared fairly between API requests (a ``group``: the n choices and prompts of one request),
not handed out in arrival order: :mod:`kubetune.serve.scheduling` decides which waiting rows join the batch
and which rows are preempted for them; a preempted row continues exactly where it stopped. The batch's
tensors and KV cache are :mod:`kubetune.serve.kvcache`'s, and how a token is sampled and how much text may
be sent yet are :mod:`kubetune.serve.sampling`'s.

Outputs go back through each request's ``on_output`` callback, called on the engine thread with text
deltas that never split a UTF-8 character or leak the beginning of a stop string.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import constants as C
from .kvcache import _Batch
from .sampling import _find_stop, _holdback, _sample
from .scheduling import _Group, _take_turns

__all__ = ["SamplingParams", "EngineRequest", "EngineOutput", "TransformersEngine"]

log = logging.getLogger("kubetune.serve")


@dataclass(frozen=True)
class SamplingParams:
    """How one request decodes. temperature 0 is greedy."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineOutput:
    """A piece of one request's output.

    Attributes:
        text: new text since the previous output (may be empty).
        finish_reason: None while running; stop, length, cancelled or error at the end.
        completion_tokens: tokens generated so far.
        error: the reason when finish_reason is error.
    """

    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass(eq=False)
class EngineRequest:
    """One generation: prompt token ids, the adapter (None: the model itself), sampling, where outputs go."""

    prompt_ids: list[int]
    params: SamplingParams
    on_output: Callable[[EngineOutput], None]
    adapter: str | None = None
    stream: bool = True  # False: one output at the end (no per-token text to decode and hand over)
    group: Any = None  # the API request this generation belongs to (the unit the batch is shared by); None: itself
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    _on_cancel: Callable[[], None] | None = field(default=None, repr=False)  # set by the engine at submit

    def cancel(self) -> None:
        """Stop generating (the client went away); takes effect at the next decode step."""
        if self.cancelled:
            return
        self.cancelled = True
        if self._on_cancel is not None:
            self._on_cancel()


class TransformersEngine:
    """Continuous batching over a transformers causal LM (optionally a PEFT model with several adapters).

    Args:
        model: the model, in eval mode, on its device.
        tokenizer: its tokenizer (decodes outputs).
        eos_token_ids: tokens that end a reply (EOS and end-of-turn).
        max_batch_size: most requests decoded together.
        peft: the model is a PeftModel whose adapters are chosen per row with ``adapter_names``.
        on_step: called after every forward pass with the number of rows in it (metrics).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_token_ids: set[int],
        max_batch_size: int = 32,
        peft: bool = False,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_batch_size = max_batch_size
        self.peft = peft
        self.on_step = on_step
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_token_ids, default=0)
        self._queue: queue.Queue[EngineRequest | None] = queue.Queue()  # submitted, not yet seen by the engine thread
        self._groups: dict[Any, _Group] = {}  # engine thread only: groups with rows waiting for a place in the batch
        self._live: weakref.WeakValueDictionary[Any, _Group] = weakref.WeakValueDictionary()  # every group that has rows
        self._cancels: queue.SimpleQueue[EngineRequest] = queue.SimpleQueue()  # cancelled requests: look through their groups
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._torch = torch
        self._step = 0  # decode steps so far (the clock of round-robin order)
        self.running = 0  # requests in the batch now
        self.queued = 0  # requests the engine thread holds outside the batch (never started, or preempted)
        self.max_rows_seen = 0  # the largest batch so far (tests and metrics)
        self.cancelled_count = 0  # requests dropped because their client went away
        self.preempted_count = 0  # rows taken out of the batch to give another request its share
        self.tokens_per_second = 0.0  # the decode pace now (moving average), for Retry-After estimates
        self._last_step = 0.0
        self.on_preempt: Callable[[], None] | None = None  # metrics hook
        self._cache_arg = _cache_argument(model)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the batching thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kubetune-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Finish the current step, fail what is left, stop the thread."""
        self._stopping.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        """The batching thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Requests submitted but not in the batch now (not started yet, or preempted)."""
        return self._queue.qsize() + self.queued

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; its outputs arrive through ``request.on_output``."""
        if self._stopping.is_set():
            request.on_output(EngineOutput("", "error", error="the server is shutting down"))
            return
        request._on_cancel = lambda: self._cancels.put(request)
        self._queue.put(request)

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        batch: _Batch | None = None
        while not self._stopping.is_set():
            try:
                batch = self._step_once(batch)
            except Exception as e:  # a bug: fail everything in flight, but never stop serving
                log.exception("engine step failed")
                for r in [*(batch.rows if batch else []), *(r for g in self._groups.values() for r in g.waiting)]:
                    r.fail(f"{type(e).__name__}: {e}")
                self._groups.clear()
                batch = None
            self.running = len(batch.rows) if batch else 0
            self.queued = sum(len(g.waiting) for g in self._groups.values())
        for r in batch.rows if batch else []:
            r.fail("the server is shutting down")
        for g in self._groups.values():
            for r in g.waiting:
                r.fail("the server is shutting down")
        self._groups.clear()
        self.queued = 0
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None:
                req.on_output(EngineOutput("", "error", error="the server is shutting down"))

    def _step_once(self, batch: "_Batch | None") -> "_Batch | None":
        """One turn of the loop: take what was submitted, drop what was cancelled, schedule, decode one token."""
        self._pull(block=batch is None and not self._groups)
        if not self._cancels.empty():
            self._drop_cancelled()
        if self._groups:
            batch = self._schedule(batch)
        if batch is not None:
            try:
                batch = self._decode(batch)
            except Exception as e:
                log.exception("decode step failed")
                for r in batch.rows:
                    r.fail(f"{type(e).__name__}: {e}")
                batch = None
        return batch

    def _pull(self, *, block: bool) -> None:
        """Move everything submitted so far into the waiting groups (waiting for one when ``block``)."""
        while True:
            try:
                req = self._queue.get() if block else self._queue.get_nowait()
            except queue.Empty:
                return
            block = False
            if req is None:  # shutdown
                return
            if req.cancelled:
                self.cancelled_count += 1
                req.on_output(EngineOutput("", "cancelled"))
                continue
            key = req if req.group is None else req.group
            group = self._live.get(key)
            if group is None:
                group = self._live[key] = _Group(key, served=self._step)
            try:
                row = _Row(req, self, group)
            except Exception as e:  # e.g. a seed torch cannot take: this request fails, nobody else
                req.on_output(EngineOutput("", "error", error=f"{type(e).__name__}: {e}"))
                continue
            group.waiting.append(row)
            self._groups[key] = group

    def _drop_cancelled(self) -> None:
        """Answer and forget waiting rows whose client went away (running ones leave at the next decode step)."""
        keys = set()
        while not self._cancels.empty():
            req = self._cancels.get_nowait()
            keys.add(req if req.group is None else req.group)
        for key in keys:
            g = self._groups.get(key)
            if g is None:
                continue
            for r in [r for r in g.waiting if r.req.cancelled]:
                r.cancel()
            g.waiting = deque(r for r in g.waiting if not r.req.cancelled)
            if not g.waiting:
                del self._groups[key]

    # -- scheduling: who gets a row of the batch ------------------------------------------------------
    def _schedule(self, batch: "_Batch | None") -> "_Batch | None":
        """Give free rows, and rows taken from over-served groups, to waiting groups; prefill the newcomers."""
        rows = batch.rows if batch else []
        evict, admit = _take_turns(self._groups, rows, max_batch_size=self.max_batch_size, step=self._step)
        if evict:
            gone = set(evict)
            assert batch is not None
            batch = batch.select([i for i in range(len(rows)) if i not in gone])
            for i in sorted(evict, reverse=True):
                self._requeue(rows[i])
        if not admit:
            return batch if batch is not None and batch.rows else None
        return self._admit_safely(batch, admit)

    def _admit_safely(self, batch: "_Batch | None", rows: list["_Row"]) -> "_Batch | None":
        """Prefill ``rows`` into the batch. A failing forward pass (a bad input, out of memory) is retried row by
        row, so only the rows that fail alone fail; the running batch is never touched."""
        try:
            return self._admit(batch, rows)
        except _PrefillError as e:
            if len(rows) == 1:
                log.warning("prefill failed: %s", e.__cause__)
                rows[0].fail(f"{type(e.__cause__).__name__}: {e.__cause__}")
                return batch if batch is not None and batch.rows else None
            for r in rows:
                batch = self._admit_safely(batch, [r])
            return batch
        except Exception as e:  # after the forward pass (joining the caches): a bug or out of memory
            log.exception("prefill failed")
            for r in rows:
                r.fail(f"{type(e).__name__}: {e}")
            return batch if batch is not None and batch.rows else None

    def _requeue(self, row: "_Row") -> None:
        """A preempted row waits again, first in its group; it keeps its tokens and its sampler."""
        self.preempted_count += 1
        if self.on_preempt is not None:
            self.on_preempt()
        row.ran = 0
        group = row.group
        group.served = self._step
        group.waiting.appendleft(row)
        self._groups.setdefault(group.key, group)

    # -- prefill: new (or resumed) requests join the batch -----------------------------------------
    def _admit(self, batch: "_Batch | None", rows: list["_Row"]) -> "_Batch | None":
        torch = self._torch
        width = max(r.length for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids = r.req.prompt_ids + r.tokens  # a resumed row: its generated tokens are prefilled again
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[i, width - len(ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        try:
            logits, cache = self._forward(input_ids, mask, positions, None, rows, logits_to_keep=1)
        except Exception as e:  # nothing was delivered yet: the rows can be tried again
            raise _PrefillError() from e
        fresh = _Batch(rows=rows, cache=cache, mask=mask.to(self.device), next_pos=positions[:, -1].to(self.device) + 1)
        tokens = _sample(logits[:, -1], rows)
        keep = [i for i, (r, t) in enumerate(zip(rows, tokens)) if not r.push(t)]
        fresh = fresh.select(keep) if len(keep) < len(rows) else fresh
        if batch is None or not batch.rows:
            return fresh if fresh.rows else None
        return batch.join(fresh) if fresh.rows else batch

    # -- decode: one token for every running request -------------------------------------------------
    def _decode(self, batch: "_Batch") -> "_Batch | None":
        torch = self._torch
        live = [i for i, r in enumerate(batch.rows) if not (r.req.cancelled and r.cancel())]
        if len(live) < len(batch.rows):
            batch = batch.select(live)
            if not batch.rows:
                return None
        input_ids = torch.tensor([[r.last] for r in batch.rows], dtype=torch.long)
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        positions = batch.next_pos[:, None]
        logits, cache = self._forward(input_ids, mask, positions, batch.cache, batch.rows)
        batch = _Batch(rows=batch.rows, cache=cache, mask=mask, next_pos=batch.next_pos + 1)
        self._pace(len(batch.rows))
        self._step += 1
        for r in batch.rows:
            r.ran += 1
        tokens = _sample(logits[:, -1], batch.rows)
        keep = [i for i, (r, t) in enumerate(zip(batch.rows, tokens)) if not r.push(t)]
        if len(keep) < len(batch.rows):
            batch = batch.select(keep)
        return batch if batch.rows else None

    def _pace(self, rows: int) -> None:
        """Update the tokens-per-second average with a decode step of ``rows`` rows (idle time not counted)."""
        t = time.monotonic()
        dt, self._last_step = t - self._last_step, t
        if 0 < dt < 5.0:
            rate = rows / dt
            self.tokens_per_second = rate if not self.tokens_per_second else 0.9 * self.tokens_per_second + 0.1 * rate

    def _forward(self, input_ids, mask, positions, cache, rows: list["_Row"], **kw):
        from transformers import DynamicCache

        torch = self._torch
        with torch.inference_mode(), self._adapters(rows, kw):
            out = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=True,
                **{self._cache_arg: cache if cache is not None else DynamicCache()},
                **kw,
            )
        n = len(rows)
        self.max_rows_seen = max(self.max_rows_seen, n)
        if self.on_step is not None:
            self.on_step(n)
        return out.logits, getattr(out, self._cache_arg)

    def _adapters(self, rows: list["_Row"], kw: dict):
        """Choose the adapters of this forward: one set_adapter when the batch agrees, else per row."""
        import contextlib

        if not self.peft:
            return contextlib.nullcontext()
        names = {r.req.adapter for r in rows}
        if len(names) > 1:  # PEFT's mixed-adapter batch: each row through its own adapter
            kw["adapter_names"] = [r.req.adapter or C.SERVE_BASE_ADAPTER for r in rows]
            return contextlib.nullcontext()
        (name,) = names
        if name is None:
            return self.model.disable_adapter()
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        return contextlib.nullcontext()


# --- per-request state ---------------------------------------------------------------------------
class _PrefillError(Exception):
    """The forward pass of a prefill failed (the cause is chained); nothing was delivered to its rows yet."""


def _cache_argument(model: Any) -> str:
    """The name under which the model's forward takes and returns its KV cache: ``cache`` (transformers 5.x
    renamed it, and warns on every call that uses the old name) or ``past_key_values`` (earlier versions,
    remote-code models)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model passes kwargs on
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


class _Row:
    """One request in the batch: generated tokens, the text already sent, its sampler."""

    def __init__(self, req: EngineRequest, engine: TransformersEngine, group: _Group | None = None) -> None:
        self.req = req
        self.engine = engine
        self.group = group or _Group(req, served=0)
        self.ran = 0  # decode steps since it (last) joined the batch
        self.tokens: list[int] = []
        self.sent = 0  # characters of the decoded text already delivered
        self.checked = 0  # characters of the decoded text already searched for stop strings
        self.last = 0
        self.generator = None
        if req.params.temperature > 0:
            import torch

            self.generator = torch.Generator()
            if req.params.seed is not None:
                self.generator.manual_seed(req.params.seed)
            else:
                self.generator.seed()

    @property
    def length(self) -> int:
        """Tokens to prefill when it joins the batch: the prompt and what it generated before a preemption."""
        return len(self.req.prompt_ids) + len(self.tokens)

    def push(self, token: int) -> bool:
        """Add a generated token and deliver new text (streaming requests); True when the request is finished."""
        p = self.req.params
        self.last = token
        if token in self.engine.eos_token_ids:
            self._finish("stop", count=len(self.tokens) + 1)
            return True
        self.tokens.append(token)
        if not self.req.stream and not p.stop:  # nothing to look at before the end: decode once, then
            if len(self.tokens) >= p.max_tokens:
                self._finish("length", count=len(self.tokens))
                return True
            return False
        text = self.engine.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if p.stop:
            cut = _find_stop(text, p.stop, start=max(0, self.checked - max(map(len, p.stop))))
            self.checked = len(text)
            if cut is not None:
                self._deliver(text[:cut], "stop")
                return True
        if len(self.tokens) >= p.max_tokens:
            self._deliver(text, "length")
            return True
        if self.req.stream:
            safe = len(text) - _holdback(text, p.stop)
            if safe > self.sent:
                self.req.on_output(EngineOutput(text[self.sent : safe], None, len(self.tokens)))
                self.sent = safe
        return False

    def _finish(self, reason: str, *, count: int) -> None:
        text = self.engine.tokenizer.decode(self.tokens, skip_special_tokens=True) if self.tokens else ""
        self.req.on_output(EngineOutput(text[self.sent :], reason, count))

    def _deliver(self, text: str, reason: str) -> None:
        self.req.on_output(EngineOutput(text[self.sent :], reason, len(self.tokens)))

    def cancel(self) -> bool:
        self.engine.cancelled_count += 1
        self.req.on_output(EngineOutput("", "cancelled", len(self.tokens)))
        return True

    def fail(self, message: str) -> None:
        self.req.on_output(EngineOutput("", "error", len(self.tokens), error=message))
