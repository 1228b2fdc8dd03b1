"""Turning chunks of raw rows into token ids and loss labels (the hot path of preparation).

A chunk is a list of ``(file_index, line, payload)`` items from :mod:`.readers`. :meth:`Encoder.encode`
parses, validates and normalizes each row, renders chats with the template (text plus trained
character spans), tokenizes the whole chunk in one batched call of the fast tokenizer, and turns spans
into labels through the tokenizer's character-to-token map. The result is a columnar Arrow batch plus
counters, so chunks can be encoded in worker processes and written out in order by the parent.

Labels are ``-100`` outside trained spans. Length handling happens here too, so a row's original
length is kept (``_full_len``) for reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from .formats import FORMATS, Chat, Plain, RowError, detect, describe_keys, inner_keys, normalize, rename_columns
from .readers import _BadRow
from .templates import ChatTemplate, JinjaTemplate, TemplateRowError

__all__ = ["IGNORE", "Encoder", "EncodeSettings", "ChunkResult", "STATUS", "FORMAT_IDS"]

IGNORE = -100
# Per-row status codes (column ``_status``).
STATUS = {"ok": 0, "truncated": 1, "too_long": 2, "nothing_trained": 3}
FORMAT_IDS = {name: i for i, name in enumerate(FORMATS)}


@dataclass(frozen=True)
class EncodeSettings:
    """What encoding needs from the spec (picklable, part of the cache key)."""

    format: str  # "auto" or a format name
    columns: tuple[tuple[str, str], ...]
    train_on_inputs: bool
    max_seq_length: int
    length_handling: str  # truncate | drop


@dataclass
class ChunkResult:
    """One encoded chunk: an Arrow record batch (or None when empty) and what happened to its rows."""

    batch: Any
    bad: list[tuple[int, int, str]] = field(default_factory=list)  # (file_index, line, problem)
    fatal: str | None = None  # a problem with the setup rather than a row (e.g. no chat template)
    empty_answers: int = 0
    prefix_inconsistent: int = 0
    eos_inserted: int = 0
    chat_rows: int = 0


class Encoder:
    """Encodes chunks for one source; shared with worker processes by fork (no pickling of the tokenizer).

    Args:
        tokenizer: a (fast) transformers tokenizer.
        template: the chat template, or None when the tokenizer has none (chat rows are then an error).
        settings: the encode settings of this source.
        source_index: written into the ``_src`` column (which mixed source a row came from).
        template_error: the message to give when a chat row meets ``template=None``.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: ChatTemplate | JinjaTemplate | None,
        settings: EncodeSettings,
        *,
        source_index: int = 0,
        template_error: str = "the tokenizer has no chat template",
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.settings = settings
        self.source_index = source_index
        self.template_error = template_error
        self.columns = dict(settings.columns)
        self.keys = inner_keys(self.columns)
        self.eos_id = tokenizer.eos_token_id
        # What the tokenizer adds around a plain text by default (e.g. BOS): plain rows get it too.
        specials = tokenizer("", add_special_tokens=True)["input_ids"]
        self.plain_prefix = [t for t in specials if t != self.eos_id]
        self.fast = bool(getattr(tokenizer, "is_fast", False))
        # The Rust tokenizer itself: calling it directly skips transformers' conversion of every encoding into
        # Python dicts, about half of the tokenization time. The call above made transformers set it up (no
        # truncation or padding, its special-token splitting); _tokenize checks that still holds per chunk.
        backend = getattr(tokenizer, "backend_tokenizer", None) if self.fast else None
        self._backend = backend if backend is not None and hasattr(backend, "encode_batch") else None
        self._split_special = bool(getattr(tokenizer, "split_special_tokens", False))

    # -- the chunk --------------------------------------------------------------------------
    def encode(self, items: Sequence[tuple[int, int, Any]]) -> ChunkResult:
        """Tokenize a chunk of raw rows ``(file index, line, payload)``: input ids and labels with untrained tokens masked, and the rows that failed."""
        res = ChunkResult(batch=None)
        s = self.settings
        fixed = None if s.format == "auto" else s.format
        chats: list[tuple[int, Any]] = []  # (row slot, Rendered)
        plains: list[tuple[int, Plain]] = []
        meta: list[tuple[int, int, int]] = []  # (file, line, format id)
        for fi, line, payload in items:
            try:
                row = self._parse(payload)
                fmt = fixed or detect(row)
                if fmt is None:
                    raise RowError(describe_keys(row))
                norm = normalize(row, fmt, self.keys, train_on_inputs=s.train_on_inputs)
                slot = len(meta)
                if isinstance(norm, Chat):
                    if self.template is None:
                        res.fatal = self.template_error
                        return res
                    rendered = self.template.render(norm.messages, train_all=s.train_on_inputs, tools=norm.tools, extras=norm.extras)
                    calls = norm.extras or ()
                    if any(m[2] and not m[1].strip() and not (calls and calls[i] and calls[i].get("tool_calls")) for i, m in enumerate(norm.messages)):
                        res.empty_answers += 1
                    res.prefix_inconsistent += rendered.prefix_inconsistent
                    res.eos_inserted += rendered.eos_inserted
                    chats.append((slot, rendered))
                else:
                    if not norm.completion.strip():
                        res.empty_answers += 1
                    plains.append((slot, norm))
                meta.append((fi, line, FORMAT_IDS[fmt]))
            except (RowError, TemplateRowError) as e:
                res.bad.append((fi, line, str(e)))
        ids: list[list[int] | None] = [None] * len(meta)
        labels: list[list[int] | None] = [None] * len(meta)
        if chats:
            self._encode_chats(chats, ids, labels)
        if plains:
            self._encode_plains(plains, ids, labels)
        res.chat_rows = len(chats)
        res.batch = self._to_arrow(meta, ids, labels)  # type: ignore[arg-type]
        return res

    def _parse(self, payload: Any) -> Any:
        return parse_row(payload, self.columns)

    # -- tokenization -------------------------------------------------------------------------
    def _tokenize(self, texts: list[str], *, offsets: bool) -> tuple[list[list[int]], list | None]:
        """Token ids of ``texts`` (no special tokens added) and, for fast tokenizers, their encodings."""
        bt = self._backend
        if (
            bt is not None
            and bt.truncation is None
            and bt.padding is None
            and getattr(bt, "encode_special_tokens", self._split_special) == self._split_special
        ):
            if not offsets and hasattr(bt, "encode_batch_fast"):  # no character offsets needed
                return [e.ids for e in bt.encode_batch_fast(texts, add_special_tokens=False)], None
            encs = bt.encode_batch(texts, add_special_tokens=False)
            return [e.ids for e in encs], encs
        enc = self.tokenizer(texts, add_special_tokens=False)
        return enc["input_ids"], (enc.encodings if self.fast else None)

    def _encode_chats(self, chats: list[tuple[int, Any]], ids: list, labels: list) -> None:
        texts = [r.text for _, r in chats]
        all_ids, encodings = self._tokenize(texts, offsets=True)
        for k, (slot, rendered) in enumerate(chats):
            row_ids = all_ids[k]
            n = len(row_ids)
            lab = [IGNORE] * n
            if encodings is not None:
                e = encodings[k]
                for s, t in rendered.spans:
                    a, b = _token_range(e, s, t, n)
                    lab[a:b] = row_ids[a:b]
            else:  # slow tokenizers have no offsets: count tokens of the text before each boundary
                for s, t in rendered.spans:
                    a = len(self.tokenizer(rendered.text[:s], add_special_tokens=False)["input_ids"])
                    b = len(self.tokenizer(rendered.text[:t], add_special_tokens=False)["input_ids"])
                    lab[a:b] = row_ids[a:b]
            ids[slot], labels[slot] = row_ids, lab

    def _encode_plains(self, plains: list[tuple[int, Plain]], ids: list, labels: list) -> None:
        prompts = [p.prompt for _, p in plains]
        completions = [p.completion for _, p in plains]
        p_ids = self._tokenize(prompts, offsets=False)[0]
        c_ids = self._tokenize(completions, offsets=False)[0]
        pre, eos, all_inputs = self.plain_prefix, [self.eos_id], self.settings.train_on_inputs
        for k, (slot, _) in enumerate(plains):
            head = pre + p_ids[k]
            tail = c_ids[k] + eos
            ids[slot] = head + tail
            labels[slot] = (head if all_inputs else [IGNORE] * len(head)) + tail

    # -- lengths and output -------------------------------------------------------------------------
    def _to_arrow(self, meta: list[tuple[int, int, int]], ids: list[list[int]], labels: list[list[int]]):
        import numpy as np
        import pyarrow as pa

        limit, drop = self.settings.max_seq_length, self.settings.length_handling == "drop"
        full_len = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
        status = np.zeros(len(ids), dtype=np.int8)
        for i in np.nonzero(full_len > limit)[0].tolist():
            if drop:
                ids[i], labels[i], status[i] = [], [], STATUS["too_long"]
            else:
                ids[i], labels[i], status[i] = ids[i][:limit], labels[i][:limit], STATUS["truncated"]
        trained = np.fromiter((len(x) - x.count(IGNORE) for x in labels), dtype=np.int32, count=len(labels))
        status[(trained == 0) & (status != STATUS["too_long"])] = STATUS["nothing_trained"]
        files, lines, fmts = (np.array(c, dtype=t) for c, t in zip(zip(*meta), (np.int32, np.int64, np.int8))) if meta else (
            np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int8)
        )
        return pa.RecordBatch.from_arrays(
            [
                _list_array(ids),
                _list_array(labels),
                pa.array(np.full(len(ids), self.source_index, dtype=np.int16)),
                pa.array(files),
                pa.array(lines),
                pa.array(fmts),
                pa.array(full_len),
                pa.array(trained),
                pa.array(status),
            ],
            schema=SCHEMA(),
        )


def SCHEMA():  # noqa: N802 - a constant that needs pyarrow (imported lazily)
    """The columns an encoded chunk has."""
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("labels", pa.list_(pa.int32())),
            ("_src", pa.int16()),
            ("_file", pa.int32()),
            ("_line", pa.int64()),
            ("_fmt", pa.int8()),
            ("_full_len", pa.int32()),
            ("_trained", pa.int32()),
            ("_status", pa.int8()),
        ]
    )


def _list_array(rows: list[list[int]]):
    """Python lists of ints -> an Arrow list<int32> array, through one flat numpy buffer."""
    import itertools

    import numpy as np
    import pyarrow as pa

    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _token_range(enc: Any, start: int, end: int, n: int) -> tuple[int, int]:
    """Tokens overlapping the characters [start, end) of the encoded text."""
    if end <= start:
        return 0, 0
    a = enc.char_to_token(start)
    c = start
    while a is None and c < end - 1:  # a character no token covers (should not happen with byte-level BPE)
        c += 1
        a = enc.char_to_token(c)
    if a is None:
        return 0, 0
    b = enc.char_to_token(end - 1)
    c = end - 1
    while b is None and c > start:
        c -= 1
        b = enc.char_to_token(c)
    b = a if b is None else b
    b += 1
    while b < n:  # several tokens can share the last character (multi-byte characters)
        span = enc.token_to_chars(b)
        if span is None or span[0] >= end:
            break
        b += 1
    return a, b


def parse_row(payload: Any, columns: dict) -> Any:
    """One item a reader yielded (a JSON line, or an already decoded row) as a row with ``dataset.columns``
    applied; :class:`RowError` for text that is not a JSON object (the caller adds ``file:line``)."""
    if isinstance(payload, (bytes, str)):
        try:
            row = json.loads(payload)
        except json.JSONDecodeError as e:
            raise RowError(f"invalid JSON: {e.msg} (column {e.colno})") from None
        except UnicodeDecodeError as e:
            raise RowError(f"not UTF-8 text ({e.reason})") from None
    elif isinstance(payload, _BadRow):
        raise RowError(payload.problem)
    else:
        row = payload
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    return rename_columns(row, columns)
