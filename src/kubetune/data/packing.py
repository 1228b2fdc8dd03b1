"""Packing: several tokenized rows per training sequence, kept apart.

Rows are placed best-fit-decreasing into sequences of at most ``max_seq_length`` tokens; a packed
sequence records the lengths of its rows in ``seq_lengths``. The trainer's padding-free collator
(TRL's ``DataCollatorForLanguageModeling(padding_free=True)``) turns ``seq_lengths`` into
``position_ids`` that restart at 0 for every row and into ``cu_seq_lens`` for varlen kernels, and it
masks the first label of every row. From position ids that restart, transformers builds a
block-diagonal causal mask for sdpa and eager attention, and flash-attention uses the cumulative
lengths: no token attends across a row boundary and positions restart per row, so a packed batch
gives the same per-row losses as the rows run one by one (tests/data/test_packing.py checks this).
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["pack", "plan_bins"]


def plan_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit-decreasing: row indices per bin, each bin's total length at most ``capacity``.

    Rows longer than ``capacity`` must have been truncated or dropped before.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    spaces: list[int] = []  # free space of open bins, sorted ascending
    bins_at: dict[int, list[int]] = {}  # free space -> stack of bin ids with that space
    bins: list[list[int]] = []
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(spaces, n)
        if k < len(spaces):
            space = spaces.pop(k)
            b = bins_at[space].pop()
        else:
            space = capacity
            b = len(bins)
            bins.append([])
        bins[b].append(i)
        left = space - n
        if left > 0:
            bisect.insort(spaces, left)
            bins_at.setdefault(left, []).append(b)
    return bins


def pack(dataset: Any, capacity: int) -> Any:
    """Pack a dataset with ``input_ids`` and ``labels`` into sequences with ``seq_lengths``.

    Args:
        dataset: a ``datasets.Dataset`` (rows no longer than ``capacity``).
        capacity: the maximum packed sequence length (``training.max_seq_length``).

    Returns:
        A new in-memory ``datasets.Dataset`` with ``input_ids``, ``labels`` and ``seq_lengths``.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from datasets import Dataset

    table = dataset.with_format("arrow")[:]
    table = table.select(["input_ids", "labels"]).combine_chunks()
    lengths = pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int64)
    bins = plan_bins(lengths.tolist(), capacity)
    order = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=len(lengths))
    taken = table.take(pa.array(order)).combine_chunks()
    row_lens = lengths[order]
    per_bin = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    bin_bounds = np.zeros(len(bins) + 1, dtype=np.int64)
    np.cumsum(per_bin, out=bin_bounds[1:])  # row index where each bin starts
    token_bounds = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(row_lens, out=token_bounds[1:])
    seq_offsets = pa.array(token_bounds[bin_bounds].astype(np.int32))

    def regroup(col: str):
        flat = taken[col].chunk(0).flatten()
        return pa.ListArray.from_arrays(seq_offsets, flat)

    seq_lengths = pa.ListArray.from_arrays(pa.array(bin_bounds.astype(np.int32)), pa.array(row_lens.astype(np.int32)))
    packed = pa.table({"input_ids": regroup("input_ids"), "labels": regroup("labels"), "seq_lengths": seq_lengths})
    return Dataset(packed)
