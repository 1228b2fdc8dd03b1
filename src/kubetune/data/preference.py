"""Preference data for DPO and ORPO: read pairs, check them, tokenize prompt / chosen / rejected.

:func:`prepare_preference` is the story: every row of the source is parsed, renamed with
``dataset.columns``, detected (:mod:`.preference_formats`) and normalized to a :class:`~.preference_formats.Pair`;
a malformed row stops the job with ``file:line`` (or is skipped and counted with ``on_bad_rows: skip``).
:class:`PairEncoder` renders chat pairs with the same chat template and trained spans as SFT and splits
each sequence into ``prompt_ids`` (never trained), ``chosen_ids`` and ``rejected_ids`` (trained): the
columns TRL's DPO collator takes, and that the ORPO trainer is given (``training/preference.py``). So
``kubetune data inspect`` shows exactly the tokens training scores.

Lengths: a prompt that alone reaches ``training.max_seq_length`` cannot be trained (the row is dropped and
counted); longer answers are cut to fit (``length_handling: truncate``) or the row is dropped (``drop``).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import DataError
from ..redact import redact_uri
from ..spec import TuneJob
from .encode import IGNORE, EncodeSettings, Encoder, parse_row
from .formats import Chat, RowError, inner_keys
from .preference_formats import Pair, describe_preference_keys, detect_preference, normalize_preference
from .readers import iter_items, list_files, where

__all__ = ["PairEncoder", "prepare_preference", "read_pairs", "looks_like_preference", "fit_length", "COLUMNS"]

COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
BAD_EXAMPLES = 5


class PairEncoder:
    """Tokenizes pairs: ``encode(pair) -> (prompt_ids, chosen_ids, rejected_ids)`` before any length limit.

    Chat pairs are rendered with ``template`` (prompt + chosen, prompt + rejected) and tokenized with the SFT
    encoder, whose labels mark the answers' tokens; the prompt is everything before the first trained token
    that both sequences share (it ends with the assistant header, the generation prompt). Plain pairs are the
    prompt (after the tokenizer's BOS) and each answer plus EOS, as SFT tokenizes ``prompt_completion`` rows.
    """

    def __init__(self, tokenizer: Any, template: Any, *, template_error: str = "the tokenizer has no chat template") -> None:
        settings = EncodeSettings(format="auto", columns=(), train_on_inputs=False, max_seq_length=1 << 30, length_handling="truncate")
        self.encoder = Encoder(tokenizer, template, settings, template_error=template_error)
        self.template, self.template_error = template, template_error
        self.eos = [tokenizer.eos_token_id]
        self.chat_rows = 0

    def encode(self, pair: Pair) -> tuple[list[int], list[int], list[int]]:
        """The pair's prompt, chosen and rejected token ids.

        Raises:
            RowError: the chat template cannot render the row, or an answer has no token to train.
        """
        enc = self.encoder
        if not pair.is_chat:
            (p, c, r), _ = enc._tokenize([pair.prompt, pair.chosen, pair.rejected], offsets=False)  # type: ignore[list-item]
            return enc.plain_prefix + p, c + self.eos, r + self.eos
        if self.template is None:
            raise _SetupError(self.template_error)
        from .templates import TemplateRowError

        self.chat_rows += 1
        rendered = []
        for side in (pair.chosen, pair.rejected):
            chat = Chat(pair.prompt + side, pair.tools)  # type: ignore[operator]
            try:
                rendered.append(self.template.render(chat.messages, tools=chat.tools))
            except TemplateRowError as e:
                raise RowError(str(e)) from None
        ids: list = [None, None]
        labels: list = [None, None]
        enc._encode_chats([(0, rendered[0]), (1, rendered[1])], ids, labels)
        bounds = []
        for side, lab in zip(("chosen", "rejected"), labels):
            trained = [i for i, t in enumerate(lab) if t != IGNORE]
            if not trained:
                raise RowError(f"'{side}' has no token to train after rendering with the chat template")
            bounds.append((trained[0], trained[-1] + 1))
        cut = min(bounds[0][0], bounds[1][0], _common_prefix(ids[0], ids[1]))
        return ids[0][:cut], ids[0][cut : bounds[0][1]], ids[1][cut : bounds[1][1]]


class _SetupError(Exception):
    """A problem with the setup rather than a row (a chat pair but no chat template)."""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def read_pairs(
    path: Path, label: str, job: TuneJob, encoder: PairEncoder, *, split: str = "train", limit_rows: int | None = None
) -> tuple[list[dict], dict]:
    """Every pair of one source, tokenized, with what happened to its rows.

    Returns:
        ``(rows, report)``: rows are ``{prompt_ids, chosen_ids, rejected_ids, where, full_len}`` (before the
        length limit); report has ``format``, ``rows_read``, ``bad_rows``, ``bad_examples``.

    Raises:
        DataError: a malformed row (``file:line``) unless ``dataset.on_bad_rows`` is skip, mixed formats,
            chat rows without a chat template, or no pair at all.
    """
    ds = job.dataset
    sf = list_files(path, split=split)
    columns, keys = dict(ds.columns), inner_keys(dict(ds.columns))
    fixed = None if ds.format == "auto" else ds.format
    fmt_seen: str | None = None
    rows: list[dict] = []
    report: dict[str, Any] = {"rows_read": 0, "bad_rows": 0, "bad_examples": [], "format": fixed}
    for fi, line, payload in iter_items(sf, 0, split=split):
        if limit_rows is not None and report["rows_read"] >= limit_rows:
            break
        report["rows_read"] += 1
        loc = where(str(sf.files[fi]), line, sf.kinds[fi])
        try:
            row = dict(parse_row(payload, columns))
            fmt = fixed or detect_preference(row)
            if fmt is None:
                raise RowError(describe_preference_keys(row))
            if fmt_seen is None:
                fmt_seen = fmt
            elif fmt != fmt_seen:
                raise DataError(
                    f"{loc}: a {fmt} row in a dataset whose rows so far are {fmt_seen}",
                    hint="keep one shape per dataset, or set dataset.format",
                )
            pair = normalize_preference(row, fmt, keys)
            p, c, r = encoder.encode(pair)
        except _SetupError as e:
            from .prepare import _template_hint

            raise DataError(f"{redact_uri(label)}: {e}", hint=_template_hint()) from None
        except RowError as e:
            if ds.on_bad_rows == "error":
                raise DataError(
                    f"{loc}: {e}",
                    hint="fix the row, or skip malformed rows (they are counted): dataset.on_bad_rows: skip, or --on-bad-rows skip",
                ) from None
            report["bad_rows"] += 1
            if len(report["bad_examples"]) < BAD_EXAMPLES:
                report["bad_examples"].append(f"{loc}: {e}")
            continue
        rows.append({"prompt_ids": p, "chosen_ids": c, "rejected_ids": r, "where": loc, "full_len": len(p) + max(len(c), len(r))})
    report["format"] = fmt_seen or fixed
    if not rows and report["rows_read"] and not report["bad_rows"]:
        raise DataError(f"{redact_uri(label)}: no rows", hint="check dataset.source and dataset.split")
    return rows, report


def fit_length(row: dict, limit: int, handling: str) -> dict | None:
    """The row within ``limit`` tokens (answers cut at the end), or None when it cannot be trained (dropped)."""
    p = len(row["prompt_ids"])
    if p >= limit:
        return None
    if p + max(len(row["chosen_ids"]), len(row["rejected_ids"])) <= limit:
        return row
    if handling == "drop":
        return None
    room = limit - p
    return {**row, "chosen_ids": row["chosen_ids"][:room], "rejected_ids": row["rejected_ids"][:room], "truncated": True}


def prepare_preference(
    job: TuneJob,
    tokenizer: Any,
    *,
    source: Path,
    eval_source: Path | None = None,
    log: Callable[[str], None] = lambda m: None,
    warn: Callable[[str], None] | None = None,
) -> Any:
    """Read, check, tokenize and split the job's preference pairs.

    Returns:
        :class:`~.prepare.Prepared` whose datasets have the columns ``prompt_ids``, ``chosen_ids`` and
        ``rejected_ids``, and statistics (format, rows, bad, dropped and truncated rows, tokens).

    Raises:
        DataError: as :func:`read_pairs`; no pairs left; an evaluation split that leaves nothing to train.
    """
    import datasets

    from .prepare import Prepared, choose_template

    started = time.time()
    ds, t = job.dataset, job.training
    template, template_error, template_lines = choose_template(tokenizer, ds.chat_template)
    encoder = PairEncoder(tokenizer, template, template_error=template_error or "the tokenizer has no chat template")
    rows, report = read_pairs(Path(source), ds.source, job, encoder, split=ds.split)
    eval_rows: list[dict] | None = None
    if eval_source is not None:
        from .prepare import _eval_files

        _, eval_split = _eval_files(Path(eval_source))
        eval_rows, _ = read_pairs(Path(eval_source), ds.eval_source or str(eval_source), job, encoder, split=eval_split)
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        (warn or (lambda m: log(f"warning: {m}")))(msg)

    if encoder.chat_rows:
        for line in template_lines:
            (_warn if line.startswith("warning: ") else log)(line.removeprefix("warning: "))

    def fit(rs: list[dict]) -> tuple[list[dict], int, int]:
        kept, dropped, cut = [], 0, 0
        for r in rs:
            f = fit_length(r, t.max_seq_length, ds.length_handling)
            if f is None:
                dropped += 1
                continue
            cut += bool(f.get("truncated"))
            kept.append(f)
        return kept, dropped, cut

    rng = random.Random(t.seed)
    rng.shuffle(rows)
    if ds.max_rows is not None:
        rows = rows[: ds.max_rows]
    if ds.eval_split and eval_rows is None:
        n_eval = int(round(len(rows) * ds.eval_split))
        if n_eval >= len(rows):
            raise DataError(f"dataset.eval_split {ds.eval_split} leaves no training rows out of {len(rows)}", hint="lower dataset.eval_split")
        eval_rows, rows = rows[:n_eval], rows[n_eval:]
    train, dropped, truncated = fit(rows)
    evald, _, _ = fit(eval_rows) if eval_rows else ([], 0, 0)
    if dropped:
        _warn(f"{dropped} pairs dropped: the prompt alone reaches training.max_seq_length ({t.max_seq_length})"
              + (" or the pair is longer (dataset.length_handling: drop)" if ds.length_handling == "drop" else ""))
    if truncated:
        _warn(f"{truncated} pairs had their answers cut to fit training.max_seq_length ({t.max_seq_length})")
    if not train:
        raise DataError(
            f"{redact_uri(ds.source)}: no preference pairs left to train ({report['rows_read']} rows read, {report['bad_rows']} malformed, {dropped} too long)",
            hint="check dataset.source, dataset.on_bad_rows and training.max_seq_length",
        )

    def to_dataset(rs: list[dict]):
        return datasets.Dataset.from_dict({c: [r[c] for r in rs] for c in COLUMNS})

    prompt_tokens = sum(len(r["prompt_ids"]) for r in train)
    answer_tokens = sum(len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in train)
    stats = {
        "objective": job.method.objective,
        "format": report["format"],
        "sources": [{"source": redact_uri(ds.source), "format": report["format"], "rows": report["rows_read"]}],
        "rows_read": report["rows_read"],
        "rows": len(train),
        "eval_rows": len(evald),
        "bad_rows": report["bad_rows"],
        "bad_examples": report["bad_examples"],
        "dropped_too_long": dropped,
        "truncated": truncated,
        # Each pair is two sequences (prompt + chosen, prompt + rejected); only the answers are trained.
        "train_tokens": 2 * prompt_tokens + answer_tokens,
        "trained_tokens": answer_tokens,
        "chat_template": getattr(template, "name", None) if encoder.chat_rows else None,
        "cache": "off",
        "warnings": warnings,
        "seconds": round(time.time() - started, 3),
    }
    log(f"prepared {len(train)} preference pairs ({report['format']}), {len(evald)} eval pairs, "
        f"{stats['train_tokens']} tokens ({answer_tokens} trained) in {stats['seconds']}s")
    return Prepared(train=to_dataset(train), eval=to_dataset(evald) if evald else None, stats=stats)


def looks_like_preference(path: Path, columns: dict, *, split: str = "train") -> bool:
    """True when the source's first row holds a preference pair (``chosen`` and ``rejected``, after renaming)."""
    for _, _, payload in iter_items(list_files(path, split=split), 0, split=split):
        try:
            return detect_preference(dict(parse_row(payload, columns))) is not None
        except RowError:
            return False
    return False
