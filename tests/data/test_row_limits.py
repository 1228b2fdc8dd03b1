"""One dataset row may not take more than KUBETUNE_MAX_ROW_BYTES (16 MiB by default): a bigger row stops the job
with ``file:line`` and how to raise the limit, before the row is held whole in memory (issue 14, "Trust", 12d)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import tracemalloc
from pathlib import Path

import pytest

from kubetune import constants as C
from kubetune.data.readers import iter_items, list_files, max_row_bytes
from kubetune.errors import DataError

from .conftest import write_rows

LIMIT = 4096


def _row(size: int) -> dict:
    """A prompt/completion row whose JSON text is ``size`` bytes."""
    base = json.dumps({"prompt": "", "completion": "ok"}, separators=(",", ":"))
    return {"prompt": "x" * (size - len(base)), "completion": "ok"}


def _read(path: Path) -> list:
    return list(iter_items(list_files(path), 0))


def _write(path: Path, rows: list[dict]) -> Path:
    """rows in the file type that ``path``'s suffix names; JSON text is written compactly (row size = line size)."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    elif name.endswith(".json"):
        text = "[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows) + "\n]\n"
    else:
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t" if name.endswith(".tsv") else ",", lineterminator="\n")
        w.writerow(["prompt", "completion"])
        for r in rows:
            w.writerow([r["prompt"], r["completion"]])
        text = buf.getvalue()
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture
def limit(monkeypatch):
    monkeypatch.setenv(C.ENV_MAX_ROW_BYTES, str(LIMIT))
    return LIMIT


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.json", "d.csv", "d.tsv", "d.csv.gz"])
def test_text_row_over_the_limit_names_file_and_line(tmp_path, limit, name):
    path = _write(tmp_path / name, [_row(100), _row(200), _row(LIMIT * 3), _row(100)])
    with pytest.raises(DataError) as e:
        _read(path)
    line = {"jsonl": 3, "json": 4, "csv": 4, "tsv": 4}[name.split(".")[1]]  # an array opens on line 1; CSV has a header
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: the row "), msg
    assert f" the limit of {LIMIT} bytes per row ({C.ENV_MAX_ROW_BYTES})" in msg
    assert f"{C.ENV_MAX_ROW_BYTES}=" in e.value.hint


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.csv"])
def test_rows_up_to_the_limit_are_read(tmp_path, limit, name):
    size = LIMIT if name != "d.csv" else LIMIT - 10  # a CSV row is its two fields, a comma and the newline
    path = _write(tmp_path / name, [_row(100), _row(size)])
    assert len(_read(path)) == 2


def test_json_lines_in_a_json_file(tmp_path, limit):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(_row(100)) + "\n" + json.dumps(_row(LIMIT + 1), separators=(",", ":")) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:2: the row takes {LIMIT + 1} bytes"):
        _read(path)


def test_csv_row_of_many_lines_counts_whole(tmp_path, limit):
    """A quoted field may span lines: the row is measured, not each line."""
    path = tmp_path / "d.csv"
    big = "\n".join(["y" * 100] * 100)  # 100 short lines, one field of ~10 kB
    path.write_text(f'prompt,completion\na,b\n"{big}",c\nd,e\n')
    with pytest.raises(DataError, match=rf"^{path}:3: the row is longer than the limit of {LIMIT}"):
        _read(path)


def test_csv_field_bigger_than_pythons_default_field_limit_is_read(tmp_path):
    """csv's own 128 KiB field limit no longer refuses rows that are within ours."""
    path = tmp_path / "d.csv"
    path.write_text(f"prompt,completion\n{'z' * 300_000},ok\n")
    ((_, _, row),) = _read(path)
    assert len(row["prompt"]) == 300_000


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_parquet_and_arrow_rows_are_measured(tmp_path, limit, kind):
    import pyarrow as pa

    rows = [_row(100) for _ in range(5000)]
    rows[4321] = _row(LIMIT * 2)  # in the second batch of 4096
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        import pyarrow.parquet as pq

        path = tmp_path / "d.parquet"
        pq.write_table(table, path)
    else:
        from datasets import Dataset

        Dataset(table).save_to_disk(str(tmp_path / "saved"))
        path = tmp_path / "saved"
    with pytest.raises(DataError, match=r"\[row 4322\]: the row takes \d+ bytes, more than the limit"):
        _read(path)
    rows[4321] = _row(100)
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        pq.write_table(table, path)
        assert len(_read(path)) == 5000


def test_default_limit_refuses_a_50_mb_row_with_bounded_memory(tmp_path, monkeypatch):
    """The review's case: one 50 MB row. It is refused while reading at most about the limit into memory."""
    monkeypatch.delenv(C.ENV_MAX_ROW_BYTES, raising=False)
    assert max_row_bytes() == C.DATA_MAX_ROW_BYTES
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(_row(100)) + "\n")
        f.write('{"prompt": "' + "x" * 50_000_000 + '", "completion": "ok"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=rf"^{path}:2: the row is longer than the limit of {C.DATA_MAX_ROW_BYTES} bytes"):
            _read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < C.DATA_MAX_ROW_BYTES * 2.5, peak  # readline joins its buffered blocks: about twice the limit, never the row


def test_limit_through_prepare_and_bad_setting(tmp_path, prepare, monkeypatch):
    rows = [{"prompt": "Hi", "completion": "Hello."}] * 3 + [{"prompt": "x" * 10_000, "completion": "y"}]
    path = write_rows(tmp_path / "d.jsonl", rows)
    monkeypatch.setenv(C.ENV_MAX_ROW_BYTES, "8192")
    with pytest.raises(DataError, match=rf"{path}:4: the row is longer than the limit of 8192 bytes"):
        prepare(path, dataset={"on_bad_rows": "skip"})  # not a malformed row: a limit, reported even when skipping
    monkeypatch.setenv(C.ENV_MAX_ROW_BYTES, "20000")
    assert prepare(path).stats["rows_read"] == 4
    monkeypatch.setenv(C.ENV_MAX_ROW_BYTES, "16MiB")
    with pytest.raises(DataError, match=rf"{C.ENV_MAX_ROW_BYTES}='16MiB' is not a positive whole number"):
        prepare(path)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json"])
def test_big_rows_are_tokenized_a_few_at_a_time(tmp_path, name):
    """Rows within the limit can still be big: a tokenizer call gets about CHUNK_BYTES of text, not 1000 such rows."""
    from kubetune.data.prepare import CHUNK_ROWS, _chunked

    path = _write(tmp_path / name, [_row(4000) for _ in range(10)] + [_row(50) for _ in range(30)])
    chunks = [len(c) for c in _chunked(iter_items(list_files(path), 0), CHUNK_ROWS, max_bytes=10_000)]
    assert chunks == [3, 3, 3, 31]
