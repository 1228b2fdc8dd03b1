"""Packing: kubetune's packer (kubetune.data.packing.pack) vs TRL's ``pack_dataset(strategy="bfd")``.

Both take the same tokenized rows (``input_ids`` and ``labels``, every row at most the sequence length) and
return sequences with ``seq_lengths``, which TRL's padding-free collator turns into per-row position ids. The
two place rows with the same rule (best-fit-decreasing); they differ in how ties and bins are searched. Reported:
sequences produced (fewer is better: each is a forward pass at the same length), fill (tokens / (sequences x
length)), and the packing time (median of ``--runs`` interleaved runs). Before timing, both outputs are checked
to hold every row whole, once. Rows: long-tailed lengths like chat data (Pareto, 8 to the sequence length).

    python bench/packing.py                   # 100k rows, sequence length 2048, 5 runs each
    python bench/packing.py --write-docs      # record in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402

SECTION = "## Packing: kubetune's packer vs TRL's pack_dataset (bench/packing.py)"


def make_rows(n: int, seq: int, seed: int = 0):
    import datasets

    rng = random.Random(seed)
    lengths = [min(seq, max(8, int(60 * rng.paretovariate(1.2)))) for _ in range(n)]
    ids = [[(7 * i + j) % 32000 for j in range(k)] for i, k in enumerate(lengths)]  # row i is recognisable by its ids
    labels = [[-100] * (k // 3) + r[k // 3:] for r, k in zip(ids, lengths)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels}), lengths


def rows_of(packed) -> Counter:
    """Every row the packed sequences hold, as (first ids, length): each must appear as often as in the input."""
    out: Counter = Counter()
    for ids, lens in zip(packed["input_ids"], packed["seq_lengths"]):
        at = 0
        for k in lens:
            out[(tuple(ids[at:at + 3]), k)] += 1
            at += k
        assert at == len(ids)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--write-docs", action="store_true")
    a = p.parse_args()

    import datasets
    from trl.data_utils import pack_dataset

    from kubetune.data.packing import pack

    datasets.disable_progress_bars()
    ds, lengths = make_rows(a.rows, a.seq)
    ds = ds.flatten_indices()
    tokens = sum(lengths)
    sides = {"kubetune": lambda: pack(ds, a.seq), "trl": lambda: pack_dataset(ds, a.seq, strategy="bfd")}
    want = Counter((tuple(r[:3]), len(r)) for r in ds["input_ids"])
    out = {name: fn() for name, fn in sides.items()}
    for name, packed in out.items():
        assert rows_of(packed) == want, f"{name}: the packed sequences do not hold every row once"
    times: dict[str, list[float]] = {n: [] for n in sides}
    for _ in range(a.runs):  # interleaved
        for name, fn in sides.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    seqs = {n: len(out[n]) for n in sides}
    fill = {n: tokens / (seqs[n] * a.seq) for n in sides}
    t_med = {n: median(times[n]) for n in sides}
    body = f"""
{a.rows} tokenized rows ({tokens} tokens; lengths long-tailed, 8 to {a.seq}), sequence length {a.seq},
{a.runs} interleaved runs each; both outputs checked to hold every row whole, once.

| | TRL `pack_dataset(strategy="bfd")` | kubetune `data.packing.pack` | ratio |
|---|---|---|---|
| sequences (fewer is better) | {seqs['trl']} | {seqs['kubetune']} | **{seqs['trl'] / seqs['kubetune']:.4f}x** fewer forward passes |
| fill | {100 * fill['trl']:.2f}% | {100 * fill['kubetune']:.2f}% | |
| packing time (median) | {t_med['trl']:.2f} s | {t_med['kubetune']:.2f} s | **{t_med['trl'] / t_med['kubetune']:.2f}x** faster |

Command: `python bench/packing.py --write-docs`. Machine: {machine()}.
"""
    print(body)
    if a.write_docs:
        write_section(SECTION, body)
        print("recorded in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
