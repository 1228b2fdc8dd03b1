"""Preparation as a whole: the cache (reruns skip tokenization), mixing sources by weight, evaluation
splits, max_rows, and worker processes that give the same result as one process."""

from __future__ import annotations

import pytest

from kubetune.data.encode import Encoder

from .conftest import write_rows


def _chat(i: int, tag: str = "") -> dict:
    return {"messages": [{"role": "user", "content": f"Question {tag} number {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]}


@pytest.fixture
def no_encoding(monkeypatch):
    """Make any tokenization fail: a cache hit must not tokenize."""

    def boom(self, items):
        raise AssertionError("tokenized although the prepared data was cached")

    def arm():
        monkeypatch.setattr(Encoder, "encode", boom)

    return arm


def test_rerun_reuses_the_cache_without_tokenizing(tmp_path, prepare, no_encoding):
    src = write_rows(tmp_path / "rows.jsonl", [_chat(i, "rerun") for i in range(50)])
    first = prepare(src, dataset={"cache": True, "eval_split": 0.2})
    assert first.stats["cache"] == "miss"
    no_encoding()
    again = prepare(src, dataset={"cache": True, "eval_split": 0.2})
    assert again.stats["cache"] == "hit"
    assert again.train["input_ids"] == first.train["input_ids"] and again.train["labels"] == first.train["labels"]
    assert again.eval["input_ids"] == first.eval["input_ids"]
    # the cached entry lives under $KUBETUNE_HOME/cache/data and is memory-mapped
    assert "/cache/data/" in again.train.cache_files[0]["filename"]


@pytest.mark.parametrize(
    "change",
    ["data", "max_seq_length", "train_on_inputs", "template", "packing", "seed"],
)
def test_cache_key_covers_data_tokenizer_and_settings(tmp_path, prepare, tokenizer, change):
    # the cache is keyed by content: rows unique to this case, so that other cases' entries do not match
    src = write_rows(tmp_path / "rows.jsonl", [_chat(i, change) for i in range(20)])
    dataset, training = {"cache": True}, {"max_seq_length": 256}
    assert prepare(src, dataset=dataset, training=training).stats["cache"] == "miss"
    assert prepare(src, dataset=dataset, training=training).stats["cache"] == "hit"
    if change == "data":
        write_rows(src, [_chat(i, change) for i in range(21)])
    elif change == "max_seq_length":
        training = {"max_seq_length": 128}
    elif change == "train_on_inputs":
        dataset = {**dataset, "train_on_inputs": True}
    elif change == "template":
        tokenizer.chat_template = tokenizer.chat_template.replace("<|im_end|>' + '\\n'", "<|im_end|>' + '\\n\\n'")
    elif change == "packing":
        training = {**training, "packing": True}
    elif change == "seed":
        training = {**training, "seed": 7}
    assert prepare(src, dataset=dataset, training=training).stats["cache"] == "miss"


def test_cache_off_always_prepares(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [_chat(i) for i in range(5)])
    assert prepare(src, dataset={"cache": False}).stats["cache"] == "miss"
    assert prepare(src, dataset={"cache": False}).stats["cache"] == "miss"


def test_eval_split_is_seeded_and_disjoint(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [_chat(i) for i in range(100)])
    a = prepare(src, dataset={"eval_split": 0.1})
    b = prepare(src, dataset={"eval_split": 0.1})
    c = prepare(src, dataset={"eval_split": 0.1}, training={"seed": 1})
    assert a.stats["rows"] == 90 and a.stats["eval_rows"] == 10
    assert a.eval["input_ids"] == b.eval["input_ids"]
    assert a.eval["input_ids"] != c.eval["input_ids"]
    assert not {tuple(x) for x in a.eval["input_ids"]} & {tuple(x) for x in a.train["input_ids"]}


def test_separate_eval_source(tmp_path, prepare):
    src = write_rows(tmp_path / "train.jsonl", [_chat(i) for i in range(10)])
    ev = write_rows(tmp_path / "eval.jsonl", [{"text": "evaluation text"}] * 3)
    prep = prepare(src, dataset={"eval_source": str(ev)}, eval_source=ev)
    assert prep.stats["rows"] == 10 and prep.stats["eval_rows"] == 3


def test_max_rows(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [_chat(i) for i in range(100)])
    prep = prepare(src, dataset={"max_rows": 30, "eval_split": 0.1})
    assert prep.stats["rows"] == 27 and prep.stats["eval_rows"] == 3


def test_mix_concatenates_sources_of_different_formats(tmp_path, prepare):
    a = write_rows(tmp_path / "a.jsonl", [_chat(i) for i in range(6)])
    b = write_rows(tmp_path / "b.jsonl", [{"instruction": "Say hi.", "output": "Hi."}] * 4)
    prep = prepare(a, dataset={"mix": [{"source": str(b)}]}, mix_sources=[b])
    assert prep.stats["rows"] == 10
    assert prep.stats["formats"] == ["messages", "alpaca"] and prep.stats["format"] == "mixed"
    assert [s["used_rows"] for s in prep.stats["sources"]] == [6, 4]


def test_mix_by_weight(tmp_path, prepare, tokenizer):
    a = write_rows(tmp_path / "a.jsonl", [_chat(i) for i in range(90)])
    b = write_rows(tmp_path / "b.jsonl", [{"text": f"small source {i}"} for i in range(10)])
    prep = prepare(a, dataset={"weight": 1, "mix": [{"source": str(b), "weight": 1}]}, mix_sources=[b])
    assert prep.stats["rows"] == 100
    assert [s["used_rows"] for s in prep.stats["sources"]] == [50, 50]
    texts = [tokenizer.decode(x) for x in prep.train["input_ids"]]
    assert sum("small source" in t for t in texts) == 50  # the small source is repeated (5 times each)
    assert len({t for t in texts if "small source" in t}) == 10


def test_mix_fetches_its_sources_itself(tmp_path, prepare):
    """Without mix_sources (as the worker calls it) the mix entries are materialized like dataset.source."""
    a = write_rows(tmp_path / "a.jsonl", [_chat(i) for i in range(3)])
    b = write_rows(tmp_path / "b.jsonl", [_chat(i) for i in range(2)])
    assert prepare(a, dataset={"mix": [{"source": str(b)}]}).stats["rows"] == 5


def test_worker_processes_give_the_same_result(tmp_path, prepare):
    rows = [_chat(i) for i in range(3500)]
    rows[1234] = "{broken"
    rows[2345] = {"messages": [{"role": "system", "content": "no answer"}]}
    src = write_rows(tmp_path / "rows.jsonl", rows)
    one = prepare(src, dataset={"num_proc": 1, "on_bad_rows": "skip"})
    two = prepare(src, dataset={"num_proc": 2, "on_bad_rows": "skip"})
    assert two.stats["num_proc"] == 2 and one.stats["num_proc"] == 1
    assert two.stats["bad_rows"] == one.stats["bad_rows"] == 2
    assert two.stats["bad_examples"] == one.stats["bad_examples"]
    assert two.train["input_ids"] == one.train["input_ids"] and two.train["labels"] == one.train["labels"]


def test_a_worker_process_that_dies_does_not_hang_the_preparation(tmp_path, prepare, monkeypatch):
    """A data worker killed mid-run (the OOM killer, a native crash): the rows it held and those after it are
    encoded in the parent instead, with a note, and the result is the one a single process gives."""
    import os

    rows = [_chat(i) for i in range(3500)]
    src = write_rows(tmp_path / "rows.jsonl", rows)
    one = prepare(src, dataset={"num_proc": 1})
    parent, encode = os.getpid(), Encoder.encode

    def dies_in_a_worker(self, items):
        if os.getpid() != parent:
            os._exit(9)  # the process ends at once, as a killed one does
        return encode(self, items)

    monkeypatch.setattr(Encoder, "encode", dies_in_a_worker)
    notes: list[str] = []
    (tmp_path / "again").mkdir()
    two = prepare(write_rows(tmp_path / "again" / "rows.jsonl", rows), dataset={"num_proc": 2}, log=notes.append)
    assert two.stats["num_proc"] == 2
    assert two.train["input_ids"] == one.train["input_ids"] and two.train["labels"] == one.train["labels"]
    assert any("a data worker process ended unexpectedly" in n for n in notes), notes


def test_worker_processes_stop_at_the_first_bad_row(tmp_path, prepare):
    from kubetune.errors import DataError

    rows = [_chat(i) for i in range(3000)]
    rows[2500] = "{broken"
    rows[2900] = "{broken too"
    src = write_rows(tmp_path / "rows.jsonl", rows)
    with pytest.raises(DataError, match=f"{src}:2501: invalid JSON"):
        prepare(src, dataset={"num_proc": 2})


def test_prepared_data_memory_stays_near_its_arrow_size(tmp_path):
    """60k rows prepared in a child process: the resident memory it adds is a small multiple of the
    Arrow data, not the Python-object size of every row (which would be several times larger)."""
    import json
    import subprocess
    import sys

    src = tmp_path / "rows.jsonl"
    with open(src, "w") as f:
        for i in range(60_000):
            f.write(json.dumps({"prompt": f"Question {i} about the capital of somewhere?", "completion": f" The answer is number {i}."}) + "\n")
    code = f"""
import json, resource, sys
from pathlib import Path
from transformers import AutoTokenizer
from kubetune.data import prepare_datasets
from kubetune.spec import load_spec
from kubetune.training.builtin import materialize
tok = AutoTokenizer.from_pretrained(materialize("tiny-chat"))
job = load_spec({{"model": {{"source": "builtin://tiny-chat"}}, "dataset": {{"source": "{src}", "cache": False, "num_proc": 1}}}})
tok("warm up", add_special_tokens=False)
import datasets, pyarrow  # loaded by preparation anyway: not part of what the data costs
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prep = prepare_datasets(job, tok, source=Path("{src}"))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
arrow = sum(prep.train.data.nbytes for _ in [0])
print(json.dumps({{"grew_kb": after - before, "arrow_kb": arrow // 1024, "rows": len(prep.train)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["rows"] == 60_000
    # Python lists of 60k rows of ~25 tokens (ids + labels) alone would take over 100 MB.
    assert rep["grew_kb"] < max(4 * rep["arrow_kb"], 60_000), rep


def test_tokenizer_with_its_own_truncation_does_not_cut_rows(tmp_path, prepare, tokenizer):
    """Preparation calls the Rust tokenizer directly for speed; a tokenizer.json that carries truncation or
    padding settings must not cut or pad rows behind the user's back (only max_seq_length applies)."""
    long_answer = " ".join(f"word{i}" for i in range(60))
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [{"role": "user", "content": "Talk."}, {"role": "assistant", "content": long_answer}]}])
    plain = prepare(src).train[0]
    tokenizer.backend_tokenizer.enable_truncation(8)
    tokenizer.backend_tokenizer.enable_padding(length=512)
    got = prepare(src).train[0]
    assert got["input_ids"] == plain["input_ids"] and got["labels"] == plain["labels"]
    assert len(got["input_ids"]) > 60


def test_encoder_falls_back_to_transformers_when_the_backend_was_changed(tokenizer):
    """If something sets truncation on the Rust tokenizer after the encoder was made, rows are still whole:
    the encoder then goes through transformers' call, which resets it."""
    from kubetune.data.encode import EncodeSettings
    from kubetune.data.templates import CHAT_TEMPLATES

    settings = EncodeSettings("auto", (), False, 4096, "truncate")
    enc = Encoder(tokenizer, CHAT_TEMPLATES["chatml"], settings)
    row = b'{"messages": [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "' + b" ".join(b"n%d" % i for i in range(80)) + b'"}]}'
    whole = enc.encode([(0, 1, row)]).batch.column("input_ids")[0].as_py()
    tokenizer.backend_tokenizer.enable_truncation(8)
    again = enc.encode([(0, 1, row)]).batch.column("input_ids")[0].as_py()
    assert again == whole and len(whole) > 80


def test_an_archive_as_dataset_source_is_unpacked_and_read(tmp_path, tiny_model):
    """docs/storage.md: archives are unpacked. A job whose dataset.source is a local .tar.gz of the quickstart's data
    trains on the file inside (fetch unpacks it; the reader never sees the '.gz' archive itself)."""
    import tarfile
    from pathlib import Path

    from kubetune.spec import load_spec
    from kubetune.worker import fetch_inputs, prepare_data

    capitals = Path(__file__).resolve().parents[2] / "examples" / "data" / "capitals.jsonl"
    arc = tmp_path / "capitals.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(capitals, arcname="capitals.jsonl")
    job = load_spec({"name": "archive", "model": {"source": "builtin://tiny-chat"},
                     "dataset": {"source": str(arc), "eval_split": 0.1, "cache": False}, "output": {"dir": str(tmp_path / "run")}})
    inputs = fetch_inputs(job)
    assert (inputs["dataset"] / "capitals.jsonl").is_file()
    _, prepared = prepare_data(job, inputs, None)
    assert (prepared.stats["rows"], prepared.stats["eval_rows"]) == (270, 30)
