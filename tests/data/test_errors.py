"""Malformed data is never passed through: it stops with ``file:line`` and the problem, or with
``on_bad_rows: skip`` it is skipped and counted."""

from __future__ import annotations

import json
import re

import pytest

from kubetune.errors import DataError, SpecError

from .conftest import make_job, write_rows

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}

# (id, the bad line, what the message must say after "file:3: ")
BAD_ROWS = [
    ("broken-json", '{"messages": [{"role": "user", "content": "Hi"}', r"invalid JSON"),
    ("not-an-object", "[1, 2, 3]", r"expected a JSON object, got list"),
    ("system-only", {"messages": [{"role": "system", "content": "You are helpful."}]}, r"no assistant message.*roles: system"),
    ("no-assistant-turn", {"messages": [{"role": "user", "content": "Hello?"}]}, r"no assistant message"),
    (
        "all-weight-0",
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0}]},
        r"every assistant message has weight 0",
    ),
    (
        "weight-not-0-or-1",
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 2}]},
        r"weight must be 0 or 1",
    ),
    ("weight-on-user", {"messages": [{"role": "user", "content": "a", "weight": 0}, {"role": "assistant", "content": "b"}]}, r"weight applies to assistant"),
    ("unknown-role", {"messages": [{"role": "narrator", "content": "a"}, {"role": "assistant", "content": "b"}]}, r"unknown role 'narrator'"),
    ("content-not-text", {"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "b"}]}, r"content must be a string, got int"),
    ("content-null", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]}, r"content is missing"),
    ("messages-empty", {"messages": []}, r"'messages' is empty"),
    ("messages-not-list", {"messages": "hello"}, r"'messages' must be a list"),
    ("image-part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}, {"role": "assistant", "content": "b"}]}, r"only text parts"),
    ("matches-no-format", {"question": "a", "answer": "b"}, r"row matches no format \(found answer, question"),
    ("sharegpt-no-gpt-turn", {"conversations": [{"from": "human", "value": "Anyone?"}]}, r"no assistant message.*roles: user"),
    ("sharegpt-system-only", {"conversations": [{"from": "system", "value": "Be nice."}]}, r"no assistant message.*roles: system"),
    ("sharegpt-unknown-speaker", {"conversations": [{"from": "narrator", "value": "a"}, {"from": "gpt", "value": "b"}]}, r"unknown speaker 'narrator'"),
    ("sharegpt-empty", {"conversations": []}, r"'conversations' is empty"),
    ("sharegpt-turn-without-value", {"conversations": [{"from": "human"}, {"from": "gpt", "value": "b"}]}, r"conversations\[0\] must be an object with 'from' and 'value'"),
    ("prompt-not-a-string", {"prompt": 5, "completion": "x"}, r"'prompt' must be a string, got int"),
    ("prompt-completion-mixed-kinds", {"prompt": [{"role": "user", "content": "a"}], "completion": "b"}, r"both be strings or both be message lists"),
    ("prompt-completion-no-answer", {"prompt": [{"role": "user", "content": "a"}], "completion": [{"role": "user", "content": "b"}]}, r"no assistant message"),
    ("alpaca-output-null", {"instruction": "a", "output": None}, r"output is missing \(null\)"),
    ("alpaca-instruction-not-text", {"instruction": 3, "output": "b"}, r"instruction must be a string, got int"),
    ("text-not-a-string", {"text": {"body": "x"}}, r"text must be a string, got dict"),
]


@pytest.mark.parametrize("bad,message", [c[1:] for c in BAD_ROWS], ids=[c[0] for c in BAD_ROWS])
def test_bad_row_names_file_and_line(tmp_path, prepare, bad, message):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DataError) as err:
        prepare(src)
    assert str(err.value).startswith(f"{src}:3: "), str(err.value)
    assert re.search(message, err.value.message), err.value.message
    assert "on_bad_rows" in str(err.value)  # the hint says how to skip


@pytest.mark.parametrize("bad", [c[1] for c in BAD_ROWS], ids=[c[0] for c in BAD_ROWS])
def test_bad_rows_are_skipped_and_counted_when_asked(tmp_path, prepare, bad):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD, bad, GOOD, bad])
    prep = prepare(src, dataset={"on_bad_rows": "skip"})
    assert prep.stats["rows"] == 2 and prep.stats["bad_rows"] == 2
    assert prep.stats["bad_examples"][0].startswith(f"{src}:2: ")
    assert any("skipped 2 malformed rows" in w for w in prep.stats["warnings"])


def test_broken_json_array_names_the_line(tmp_path, prepare):
    text = json.dumps([GOOD, GOOD], indent=2)
    lines = text.splitlines()
    lines.insert(5, '    "oops": ,')
    path = tmp_path / "rows.json"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}:6: invalid JSON")):
        prepare(path)


def test_json_array_rows_report_their_own_line(tmp_path, prepare):
    rows = [GOOD, {"messages": [{"role": "user", "content": "only a question"}]}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    starts = [i + 1 for i, line in enumerate(json.dumps(rows, indent=2).splitlines()) if line == "  {"]
    start = starts[1]  # the second element's opening brace
    with pytest.raises(DataError, match=re.escape(f"{path}:{start}: no assistant message")):
        prepare(path)


def test_csv_row_with_wrong_field_count(tmp_path, prepare):
    path = tmp_path / "rows.csv"
    path.write_text("prompt,completion\na,b\nc,d,e\n", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}:3: has 3 fields, the header has 2")):
        prepare(path)


def test_parquet_rows_are_named_by_row_number(tmp_path, prepare):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"], "completion": ["x", None]}), tmp_path / "rows.parquet")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'rows.parquet'}[row 2]: 'completion' must be a string")):
        prepare(tmp_path / "rows.parquet")


def test_mixed_formats_in_one_file(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD, GOOD, {"instruction": "a", "output": "b"}])
    with pytest.raises(DataError) as err:
        prepare(src, dataset={"on_bad_rows": "skip"})  # a different format is not a skippable bad row
    msg = str(err.value)
    assert "rows of different formats" in msg
    assert f"messages (first at {src}:1)" in msg and f"alpaca (first at {src}:3)" in msg
    assert "dataset.mix" in msg


def test_mixed_formats_across_files_of_a_directory(tmp_path, prepare):
    d = tmp_path / "data"
    write_rows(d / "a.jsonl", [GOOD])
    (d / "b.csv").write_text("instruction,input,output\nName a color.,,Red.\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"rows of different formats: messages .*a\.jsonl:1.*alpaca .*b\.csv:2"):
        prepare(d)


def test_declared_format_that_rows_do_not_have(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD])
    with pytest.raises(DataError, match=re.escape(f"{src}:1: not a alpaca row: missing 'instruction', 'output' (found messages)")):
        prepare(src, dataset={"format": "alpaca"})


def test_unsupported_file_type(tmp_path, prepare):
    (tmp_path / "rows.txt").write_text("hello")
    with pytest.raises(DataError, match=r"unsupported file type '\.txt'"):
        prepare(tmp_path / "rows.txt")


def test_missing_source(tmp_path, prepare):
    with pytest.raises(DataError, match="dataset not found"):
        prepare(tmp_path / "nope.jsonl")


def test_empty_file_has_no_rows(tmp_path, prepare):
    (tmp_path / "rows.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no usable rows"):
        prepare(tmp_path / "rows.jsonl")


def test_only_bad_rows_when_skipping(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", ["{nope", "{nope"])
    with pytest.raises(DataError, match=r"no usable rows \(2 malformed rows skipped\)"):
        prepare(src, dataset={"on_bad_rows": "skip"})


def test_conversations_need_a_chat_template(tmp_path, prepare, tokenizer):
    tokenizer.chat_template = None
    src = write_rows(tmp_path / "rows.jsonl", [GOOD])
    with pytest.raises(DataError) as err:
        prepare(src)
    assert "no chat template" in err.value.message and "dataset.chat_template" in err.value.hint
    text = write_rows(tmp_path / "text.jsonl", [{"text": "plain text needs no template"}])
    assert prepare(text).stats["rows"] == 1


def test_spec_rejects_unknown_columns_and_templates(tmp_path):
    with pytest.raises(SpecError, match=r"dataset.columns: unknown column name\(s\) questoin"):
        make_job(tmp_path / "x.jsonl", dataset={"columns": {"questoin": "q"}})
    with pytest.raises(SpecError, match=r"dataset.chat_template: unknown chat template 'chatlm'"):
        make_job(tmp_path / "x.jsonl", dataset={"chat_template": "chatlm"})
    with pytest.raises(SpecError, match=r"or none of them"):
        make_job(tmp_path / "x.jsonl", dataset={"weight": 1.0, "mix": [{"source": str(tmp_path / "y.jsonl")}]})
