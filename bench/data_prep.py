"""Dataset preparation speed: kubetune's preparation vs TRL SFTTrainer's own, on generated chat rows.

Both start from the same JSON Lines file of ``messages`` rows and end with tokenized ``input_ids`` and
``labels`` (-100 outside the assistant answers), with the same tokenizer (the builtin tiny-chat, with
kubetune's ChatML template, which carries the ``{% generation %}`` markers TRL needs for
``assistant_only_loss``), the same maximum length (truncating the end) and the same worker processes:

* kubetune: ``kubetune.data.prepare_datasets`` with the prepared-data cache off (reading, checking,
  rendering, tokenizing, masking, writing the Arrow result; a rerun with the cache on would skip all of it);
* TRL: ``datasets.load_dataset("json")`` (how a user feeds a JSONL file to SFTTrainer) followed by
  ``SFTTrainer._prepare_dataset`` with ``SFTConfig(assistant_only_loss=True, max_length=...,
  dataset_num_proc=...)``, on a trainer built once outside the timing, with a fresh datasets cache per run.

Before timing, the tokens and labels of a sample of rows are compared between the two. Runs are
interleaved (TRL, kubetune, TRL, kubetune, ...) because the machine is shared; medians are reported.

    .venv/bin/python bench/data_prep.py                 # 100k rows, 3 runs each (the issue's setting):
                                                        # ~20 min on an idle 2-core machine, ~35 min on a busy one
    .venv/bin/python bench/data_prep.py --rows 5000 --runs 1   # quick look (about a minute)
    .venv/bin/python bench/data_prep.py --write-docs    # record in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402

SECTION = "## Dataset preparation: kubetune vs TRL SFTTrainer (bench/data_prep.py)"
WORDS = (
    "the a of to and in is it that for on with as was at by this be from or an are which you one have had not "
    "capital city river mountain country language history science number answer question because however model "
    "train data token learning small large quickly slowly always never every some many few first last next "
    "café naïve Zürich 東京 北京 ñandú 🚀 résumé"
).split()


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` chat rows: an optional system prompt, 1-3 user/assistant turns of varied length, some unicode."""
    rng = random.Random(seed)

    def sentence(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": sentence(4, 12)})
            for _ in range(rng.choice((1, 1, 2, 3))):
                msgs.append({"role": "user", "content": sentence(4, 30)})
                msgs.append({"role": "assistant", "content": " ".join(sentence(4, 24) for _ in range(rng.randint(1, 3)))})
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")


def tokenizer():
    from transformers import AutoTokenizer

    from kubetune.data.templates import CHAT_TEMPLATES
    from kubetune.training.builtin import materialize

    tok = AutoTokenizer.from_pretrained(materialize("tiny-chat"))
    # tiny-chat's own template is plain ChatML; TRL's assistant_only_loss needs {% generation %} markers and cannot
    # patch this one itself, so both sides use kubetune's ChatML twin (it renders the same text, with markers).
    tok.chat_template = CHAT_TEMPLATES["chatml"].jinja
    return tok


# --- kubetune ------------------------------------------------------------------------------------
def run_kubetune(src: Path, max_len: int, num_proc: int):
    from kubetune.data import prepare_datasets
    from kubetune.spec import load_spec

    job = load_spec(
        {
            "name": "bench-data",
            "model": {"source": "builtin://tiny-chat"},
            "dataset": {"source": str(src), "cache": False, "num_proc": num_proc},
            "training": {"max_seq_length": max_len},
        }
    )
    tok = tokenizer()
    t0 = time.perf_counter()
    prep = prepare_datasets(job, tok, source=src)
    return time.perf_counter() - t0, prep


# --- TRL ------------------------------------------------------------------------------------------
class TRL:
    """An SFTTrainer built once (outside the timing); each run prepares the file with its own _prepare_dataset."""

    def __init__(self, max_len: int, num_proc: int, work: Path) -> None:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM
        from trl import SFTConfig, SFTTrainer

        from kubetune.training.builtin import materialize

        self.tok = tokenizer()
        self.args = SFTConfig(
            output_dir=str(work / "trl-out"),
            max_length=max_len,
            assistant_only_loss=True,
            dataset_num_proc=num_proc if num_proc > 1 else None,
            packing=False,
            report_to=[],
            use_cpu=True,
            bf16=False,
        )
        seed = Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}])
        model = AutoModelForCausalLM.from_pretrained(materialize("tiny-chat"))
        self.trainer = SFTTrainer(model=model, args=self.args, train_dataset=seed, processing_class=self.tok)
        self.work = work

    def run(self, src: Path):
        from datasets import load_dataset

        cache = Path(tempfile.mkdtemp(prefix="trl-cache-", dir=self.work))
        try:
            t0 = time.perf_counter()
            ds = load_dataset("json", data_files=str(src), split="train", cache_dir=str(cache))
            t1 = time.perf_counter()
            out = self.trainer._prepare_dataset(ds, self.tok, self.args, False, None, "train")
            t2 = time.perf_counter()
            return t2 - t0, t2 - t1, out
        finally:
            shutil.rmtree(cache, ignore_errors=True)


# --- comparing ------------------------------------------------------------------------------------
def compare(ours, theirs, sample: int, tok) -> dict:
    """Tokens and labels of a random sample of rows (rows are in file order on both sides)."""
    rng = random.Random(1)
    n = min(len(ours), len(theirs))
    idx = sorted(rng.sample(range(n), min(sample, n)))
    same_ids = same_labels = 0
    diffs = []
    for i in idx:
        a, b = ours[i], theirs[i]
        ok_ids = a["input_ids"] == list(b["input_ids"])
        ok_lab = a["labels"] == list(b["labels"])
        same_ids += ok_ids
        same_labels += ok_lab
        if not (ok_ids and ok_lab) and len(diffs) < 3:
            pos = next((k for k, (x, y) in enumerate(zip(a["labels"], b["labels"])) if x != y), None)
            diffs.append({"row": i, "ids_equal": ok_ids, "first_label_difference_at": pos, "token": tok.decode([a["input_ids"][pos]]) if pos is not None else None})
    return {"rows_kubetune": len(ours), "rows_trl": len(theirs), "sampled": len(idx), "same_ids": same_ids, "same_labels": same_labels, "differences": diffs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--num-proc", type=int, default=None, help="worker processes for both (default: what kubetune picks for the file)")
    ap.add_argument("--sample", type=int, default=500, help="rows whose tokens and labels are compared")
    ap.add_argument("--write-docs", action="store_true")
    a = ap.parse_args()

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-data-"))
    os.environ["KUBETUNE_HOME"] = str(work / "home")  # kubetune's own cache and builtin model live here
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    try:
        src = work / "chat.jsonl"
        generate(src, a.rows)
        from kubetune.data.prepare import _num_proc
        from kubetune.data.readers import list_files

        num_proc = a.num_proc or _num_proc(None, [list_files(src)])
        size_mb = src.stat().st_size / 1e6
        print(f"{a.rows} rows ({size_mb:.1f} MB), max length {a.max_length}, {num_proc} process(es) each", flush=True)

        trl = TRL(a.max_length, num_proc, work)
        # correctness first (untimed), on the first rows of the same generated data
        head = work / "head.jsonl"
        with open(src, encoding="utf-8") as f, open(head, "w", encoding="utf-8") as g:
            g.writelines(line for _, line in zip(range(max(a.sample * 4, 2000)), f))
        _, ours = run_kubetune(head, a.max_length, num_proc)
        _, _, theirs = trl.run(head)
        cmp = compare(ours.train, theirs, a.sample, trl.tok)
        print("comparison:", json.dumps(cmp), flush=True)

        k_times, t_times, t_prep_times = [], [], []
        for r in range(a.runs):
            total, prep_only, _ = trl.run(src)
            t_times.append(total)
            t_prep_times.append(prep_only)
            secs, prep = run_kubetune(src, a.max_length, num_proc)
            k_times.append(secs)
            truncated = prep.stats["truncated"]
            print(f"run {r + 1}: TRL {total:.2f}s (prepare {prep_only:.2f}s), kubetune {secs:.2f}s", flush=True)

        k_rps = a.rows / median(k_times)
        t_rps = a.rows / median(t_times)
        t_prep_rps = a.rows / median(t_prep_times)
        ratio = k_rps / t_rps
        print(f"kubetune {k_rps:,.0f} rows/s, TRL {t_rps:,.0f} rows/s (prepare only {t_prep_rps:,.0f}); ratio {ratio:.2f}x")

        equal = cmp["same_ids"] == cmp["sampled"] and cmp["same_labels"] == cmp["sampled"] and cmp["rows_kubetune"] == cmp["rows_trl"]
        cmd = "python bench/data_prep.py" + ("" if a.rows == 100_000 else f" --rows {a.rows}") + ("" if a.runs == 3 else f" --runs {a.runs}") + " --write-docs"
        body = f"""
Prepares {a.rows:,} generated chat rows (`messages` format: optional system prompt, 1-3 turns, some unicode;
{size_mb:.1f} MB of JSON Lines; {truncated} rows longer than {a.max_length} tokens are cut) into `input_ids` and
`labels` masked to the assistant answers. Same tokenizer (builtin tiny-chat with the ChatML template that has
`{{% generation %}}` markers, which TRL's `assistant_only_loss` needs), same maximum length (keep the start),
{num_proc} worker process(es) on both sides. Median of {a.runs} interleaved runs each.

| | seconds (median) | rows/s |
|---|---:|---:|
| TRL {_version('trl')} `load_dataset("json")` + `SFTTrainer._prepare_dataset` (`assistant_only_loss=True`) | {median(t_times):.2f} | {t_rps:,.0f} |
| of which `_prepare_dataset` alone | {median(t_prep_times):.2f} | {t_prep_rps:,.0f} |
| kubetune `prepare_datasets` (cache off) | {median(k_times):.2f} | {k_rps:,.0f} |
| **ratio kubetune / TRL** | | **{ratio:.2f}x** |

Same output: on {cmp['sampled']} sampled rows (of the first {len(ours.train):,}), token ids equal in {cmp['same_ids']} and labels equal in
{cmp['same_labels']}; {cmp['rows_kubetune']} rows from kubetune, {cmp['rows_trl']} from TRL{'' if equal else ' (differences: ' + json.dumps(cmp['differences']) + ')'}.
A rerun of kubetune with the cache on (the default) skips all of this and loads the memory-mapped result.

Command: `{cmd}`. Machine: {machine()} (the shared 2-core dev machine, other people's jobs running; numbers are noisy).
"""
        print(body)
        if a.write_docs:
            write_section(SECTION, body)
            print("recorded in docs/benchmarks.md")
        return 0 if equal else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    raise SystemExit(main())
