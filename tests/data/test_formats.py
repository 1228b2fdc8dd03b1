"""Every format, as a user writes it, prepared as a job prepares it: the trained tokens, decoded, are
exactly the answers plus the end-of-turn token, and nothing else."""

from __future__ import annotations

import gzip
import json

import pytest

from .conftest import IGNORE, trained_runs, write_rows

EOT = "<|im_end|>"  # the tiny-chat model's end-of-turn token (= its EOS)


def user(c):
    return {"role": "user", "content": c}


def bot(c, **kw):
    return {"role": "assistant", "content": c, **kw}


def system(c):
    return {"role": "system", "content": c}


# (id, row, dataset settings, the decoded trained runs)
CASES = [
    ("messages", {"messages": [user("Capital of France?"), bot("Paris.")]}, {}, ["Paris." + EOT]),
    (
        "messages-system-multiturn",
        {"messages": [system("Be brief."), user("2+2?"), bot("4."), user("And 3+3?"), bot("6.")]},
        {},
        ["4." + EOT, "6." + EOT],
    ),
    (
        "messages-weight-0-turn",
        {"messages": [user("Hi"), bot("Bad answer.", weight=0), user("Again?"), bot("Good answer.", weight=1)]},
        {},
        ["Good answer." + EOT],
    ),
    (
        "messages-tool-turn",
        {"messages": [user("Weather?"), bot("Calling the tool."), {"role": "tool", "content": "sunny"}, bot("It is sunny.")]},
        {},
        ["Calling the tool." + EOT, "It is sunny." + EOT],
    ),
    (
        "messages-content-parts",
        {"messages": [user([{"type": "text", "text": "Name a "}, {"type": "text", "text": "river."}]), bot([{"type": "text", "text": "The Nile."}])]},
        {},
        ["The Nile." + EOT],
    ),
    (
        "messages-unicode",
        {"messages": [user("Ça va? 日本の首都は? 🚀"), bot("Tōkyō — 東京です 🚀 ça va.")]},
        {},
        ["Tōkyō — 東京です 🚀 ça va." + EOT],
    ),
    ("messages-empty-answer", {"messages": [user("Say nothing."), bot("")]}, {}, [EOT]),
    ("messages-empty-question", {"messages": [user(""), bot("You said nothing.")]}, {}, ["You said nothing." + EOT]),
    (
        "messages-last-turn-user",
        {"messages": [user("Hi"), bot("Hello."), user("Bye")]},
        {},
        ["Hello." + EOT],
    ),
    (
        "sharegpt",
        {"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "Hi!"}, {"from": "gpt", "value": "Hello there."}]},
        {},
        ["Hello there." + EOT],
    ),
    (
        "sharegpt-multiturn",
        {"conversations": [{"from": "human", "value": "A?"}, {"from": "gpt", "value": "B."}, {"from": "human", "value": "C?"}, {"from": "gpt", "value": "D."}]},
        {},
        ["B." + EOT, "D." + EOT],
    ),
    (
        "sharegpt-weight-0-turn",
        {"conversations": [{"from": "human", "value": "A?"}, {"from": "gpt", "value": "Wrong.", "weight": 0}, {"from": "human", "value": "A?"}, {"from": "gpt", "value": "Right."}]},
        {},
        ["Right." + EOT],
    ),
    (
        "sharegpt-unicode",
        {"conversations": [{"from": "human", "value": "Grüße 👋 — 你好?"}, {"from": "gpt", "value": "Ñandú 🦤 café, 你好!"}]},
        {},
        ["Ñandú 🦤 café, 你好!" + EOT],
    ),
    ("sharegpt-empty-answer", {"conversations": [{"from": "human", "value": "Silence?"}, {"from": "gpt", "value": ""}]}, {}, [EOT]),
    (
        "sharegpt-role-content-variant",
        {"conversations": [user("Capital of Cuba?"), bot("Havana.")]},
        {},
        ["Havana." + EOT],
    ),
    ("prompt-completion", {"prompt": "Q: capital of Peru?\nA:", "completion": " Lima."}, {}, [" Lima." + EOT]),
    ("prompt-completion-unicode", {"prompt": "Hauptstadt von Österreich? ", "completion": "Wien — 维也纳 🎻"}, {}, ["Wien — 维也纳 🎻" + EOT]),
    ("prompt-completion-empty-completion", {"prompt": "Say nothing:", "completion": ""}, {}, [EOT]),
    ("prompt-completion-empty-prompt", {"prompt": "", "completion": "Only an answer."}, {}, ["Only an answer." + EOT]),
    (
        "prompt-completion-conversational",
        {"prompt": [user("Capital of Chile?")], "completion": [bot("Santiago.")]},
        {},
        ["Santiago." + EOT],
    ),
    (
        "prompt-completion-fewshot-prompt-not-trained",
        {"prompt": [user("1+1?"), bot("2."), user("2+2?")], "completion": [bot("4.")]},
        {},
        ["4." + EOT],
    ),
    ("alpaca", {"instruction": "Translate to French.", "input": "cat", "output": "chat"}, {}, ["chat" + EOT]),
    ("alpaca-empty-input", {"instruction": "Name a color.", "input": "", "output": "Blue."}, {}, ["Blue." + EOT]),
    ("alpaca-no-input-key", {"instruction": "Name a shape.", "output": "A circle."}, {}, ["A circle." + EOT]),
    ("alpaca-unicode", {"instruction": "Übersetze ins Japanische.", "input": "Katze 🐈", "output": "猫 🐈"}, {}, ["猫 🐈" + EOT]),
    ("alpaca-system-column", {"system": "Answer in one word.", "instruction": "Largest planet?", "output": "Jupiter."}, {}, ["Jupiter." + EOT]),
    ("alpaca-empty-output", {"instruction": "Say nothing.", "input": "", "output": ""}, {}, [EOT]),
    ("text", {"text": "The capital of Norway is Oslo."}, {}, ["The capital of Norway is Oslo." + EOT]),
    ("text-unicode", {"text": "Reykjavík — レイキャビク 🌋 is Iceland's capital."}, {}, ["Reykjavík — レイキャビク 🌋 is Iceland's capital." + EOT]),
    ("text-empty", {"text": ""}, {}, [EOT]),
    (
        "columns-mapping",
        {"question": "Capital of Kenya?", "answer": " Nairobi."},
        {"columns": {"prompt": "question", "completion": "answer"}},
        [" Nairobi." + EOT],
    ),
    (
        "columns-mapping-inner-keys",
        {"dialog": [{"speaker": "user", "text": "Hi"}, {"speaker": "assistant", "text": "Hey."}]},
        {"columns": {"messages": "dialog", "role": "speaker", "content": "text"}},
        ["Hey." + EOT],
    ),
    ("explicit-format", {"text": "Plain words.", "id": 7}, {"format": "text"}, ["Plain words." + EOT]),
]


@pytest.mark.parametrize("row,settings,answers", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_trained_tokens_are_exactly_the_answers(tmp_path, prepare, tokenizer, row, settings, answers):
    src = write_rows(tmp_path / "rows.jsonl", [row, row])
    prep = prepare(src, dataset=settings)
    assert prep.stats["rows"] == 2 and prep.stats["bad_rows"] == 0
    first = prep.train[0]
    assert trained_runs(tokenizer, first["input_ids"], first["labels"]) == answers
    # everything else is context the model sees but is not trained on (text rows and empty prompts have none)
    has_context = "text" not in row and settings.get("format") != "text" and row.get("prompt") != ""
    if has_context:
        assert first["labels"][0] == IGNORE


def test_every_format_in_one_table_decodes_to_answers(tmp_path, prepare, tokenizer):
    """One file per format: the trained tokens of every row are the answers plus the end-of-turn token."""
    for name, row, settings, answers in CASES:
        src = write_rows(tmp_path / f"{name}.jsonl", [row])
        prep = prepare(src, dataset=settings)
        r = prep.train[0]
        got = trained_runs(tokenizer, r["input_ids"], r["labels"])
        assert got == answers, name
        assert all(a.endswith(EOT) for a in got), name


def test_empty_answers_are_counted_and_reported(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [user("Say nothing."), bot("")]}, {"messages": [user("x"), bot("y")]}])
    logs = []
    prep = prepare(src, log=logs.append)
    assert prep.stats["empty_answers"] == 1
    assert any("empty answer" in w for w in prep.stats["warnings"])


def test_train_on_inputs_trains_every_token(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [system("S"), user("Q?"), bot("A.")]}])
    r = prepare(src, dataset={"train_on_inputs": True}).train[0]
    assert r["labels"] == r["input_ids"]


def test_train_on_inputs_allows_conversations_without_answers(tmp_path, prepare):
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [system("Only a system prompt.")]}])
    r = prepare(src, dataset={"train_on_inputs": True}).train[0]
    assert r["labels"] == r["input_ids"] and len(r["input_ids"]) > 3


# --- files and directories ---------------------------------------------------------------------
def test_json_array_file(tmp_path, prepare, tokenizer):
    rows = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "2+2=", "completion": "4"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    prep = prepare(tmp_path / "rows.json")
    assert prep.stats["format"] == "prompt_completion" and prep.stats["rows"] == 2
    assert trained_runs(tokenizer, prep.train[1]["input_ids"], prep.train[1]["labels"]) == ["4" + EOT]


def test_jsonl_gz_file(tmp_path, prepare):
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "compressed"}) + "\n")
    assert prepare(tmp_path / "rows.jsonl.gz").stats["rows"] == 1


def test_csv_file(tmp_path, prepare, tokenizer):
    (tmp_path / "rows.csv").write_text('prompt,completion\n"Capital of Italy?"," Rome."\n"Capital, of Spain?"," Madrid."\n', encoding="utf-8")
    prep = prepare(tmp_path / "rows.csv")
    assert prep.stats["format"] == "prompt_completion" and prep.stats["rows"] == 2
    assert trained_runs(tokenizer, prep.train[1]["input_ids"], prep.train[1]["labels"]) == [" Madrid." + EOT]


def test_csv_with_conversations_as_json_cells(tmp_path, prepare, tokenizer):
    import csv

    with open(tmp_path / "rows.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["messages"])
        w.writerow([json.dumps([user("Hi"), bot("Hello!")])])
    r = prepare(tmp_path / "rows.csv").train[0]
    assert trained_runs(tokenizer, r["input_ids"], r["labels"]) == ["Hello!" + EOT]


def test_parquet_file(tmp_path, prepare, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"instruction": ["Name a fruit.", "Name a tree."], "input": ["", ""], "output": ["Apple.", "Oak."]})
    pq.write_table(table, tmp_path / "rows.parquet")
    prep = prepare(tmp_path / "rows.parquet")
    assert prep.stats["format"] == "alpaca" and prep.stats["rows"] == 2
    assert trained_runs(tokenizer, prep.train[1]["input_ids"], prep.train[1]["labels"]) == ["Oak." + EOT]


def test_directory_of_files(tmp_path, prepare):
    d = tmp_path / "data"
    write_rows(d / "a.jsonl", [{"messages": [user("a"), bot("b")]}] * 3)
    write_rows(d / "nested" / "b.jsonl", [{"messages": [user("c"), bot("d")]}] * 2)
    (d / "README.md").write_text("not data")
    (d / ".hidden.jsonl").write_text("not read either")
    prep = prepare(d)
    assert prep.stats["rows"] == 5 and prep.stats["format"] == "messages"


def test_save_to_disk_folder(tmp_path, prepare, tokenizer):
    from datasets import Dataset, DatasetDict

    rows = {"messages": [[user("Capital of Egypt?"), bot("Cairo.")]]}
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    r = prepare(tmp_path / "saved").train[0]
    assert trained_runs(tokenizer, r["input_ids"], r["labels"]) == ["Cairo." + EOT]
    DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict({"messages": [[user("q"), bot("t")]] * 2})}).save_to_disk(
        str(tmp_path / "dd")
    )
    prep = prepare(tmp_path / "dd", eval_source=tmp_path / "dd")
    assert prep.stats["rows"] == 1 and prep.stats["eval_rows"] == 2


def test_hub_style_split_folder(tmp_path, prepare):
    """A Hub dataset arrives as a folder whose file names carry the split."""
    d = tmp_path / "hub"
    write_rows(d / "data" / "train-00000-of-00001.jsonl", [{"text": "train row"}] * 4)
    write_rows(d / "data" / "test-00000-of-00001.jsonl", [{"text": "test row"}] * 2)
    (d / "README.md").write_text("---\nlicense: mit\n---\n")
    prep = prepare(d, eval_source=d)
    assert prep.stats["rows"] == 4 and prep.stats["eval_rows"] == 2
    assert prepare(d, dataset={"split": "test"}).stats["rows"] == 2


# --- lengths ---------------------------------------------------------------------------------
def test_very_long_rows_are_truncated_and_reported(tmp_path, prepare):
    long = " ".join(["word"] * 400)
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [user("Talk."), bot(long)]}, {"messages": [user("a"), bot("b")]}])
    prep = prepare(src, training={"max_seq_length": 64})
    assert prep.stats["truncated"] == 1 and prep.stats["over_max_length"] == 1 and prep.stats["rows"] == 2
    assert max(len(r) for r in prep.train["input_ids"]) == 64
    assert any("were cut" in w for w in prep.stats["warnings"])


def test_very_long_rows_are_dropped_when_asked(tmp_path, prepare):
    long = " ".join(["word"] * 400)
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [user("Talk."), bot(long)]}, {"messages": [user("a"), bot("b")]}])
    prep = prepare(src, dataset={"length_handling": "drop"}, training={"max_seq_length": 64})
    assert prep.stats["too_long_dropped"] == 1 and prep.stats["rows"] == 1
    assert any("dropped" in w for w in prep.stats["warnings"])


def test_rows_whose_prompt_fills_the_length_are_dropped(tmp_path, prepare):
    long = " ".join(["word"] * 400)
    src = write_rows(tmp_path / "rows.jsonl", [{"messages": [user(long), bot("Answer.")]}, {"messages": [user("a"), bot("b")]}])
    prep = prepare(src, training={"max_seq_length": 32})
    assert prep.stats["nothing_trained"] == 1 and prep.stats["rows"] == 1
    assert all(any(x != IGNORE for x in lab) for lab in prep.train["labels"])


# --- the same rows in every file type ------------------------------------------------------------
def _write_as(kind: str, path_base, rows: list[dict]):
    """Rows as a JSON array, CSV (nested values as JSON text in a cell) or Parquet (nested as lists/structs)."""
    import csv

    if kind == "json":
        path = path_base.with_suffix(".json")
        path.write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    elif kind == "csv":
        path = path_base.with_suffix(".csv")
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(keys)
            for r in rows:
                w.writerow([json.dumps(r[k], ensure_ascii=False) if isinstance(r.get(k), (list, dict)) else str(r.get(k, "")) for k in keys])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = path_base.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("kind", ["json", "csv", "parquet"])
def test_every_case_gives_the_same_tokens_from_every_file_type(tmp_path, prepare, tokenizer, kind):
    """A JSON array, a CSV file and a Parquet file of the rows of CASES prepare exactly like JSON Lines."""
    for name, row, settings, answers in CASES:
        if kind == "csv" and not any(row.values()):
            continue  # a CSV line of empty fields is a blank line (spreadsheets write them), see test_csv_blank_lines
        ref = prepare(write_rows(tmp_path / f"{name}.jsonl", [row, row]), dataset=settings).train
        got = prepare(_write_as(kind, tmp_path / f"{name}-{kind}", [row, row]), dataset=settings).train
        assert got["input_ids"] == ref["input_ids"] and got["labels"] == ref["labels"], (kind, name)
        assert trained_runs(tokenizer, got[1]["input_ids"], got[1]["labels"]) == answers, (kind, name)


LONG = " ".join(f"w{i}" for i in range(300))
LONG_ROWS = [
    ("messages", {"messages": [user("Go on."), bot(LONG)]}),
    ("sharegpt", {"conversations": [{"from": "human", "value": "Go on."}, {"from": "gpt", "value": LONG}]}),
    ("prompt_completion", {"prompt": "Go on:", "completion": LONG}),
    ("alpaca", {"instruction": "Go on.", "output": LONG}),
    ("text", {"text": LONG}),
]


@pytest.mark.parametrize("fmt,row", LONG_ROWS, ids=[r[0] for r in LONG_ROWS])
def test_very_long_rows_of_every_format_are_cut_and_counted(tmp_path, prepare, tokenizer, fmt, row):
    """A row longer than max_seq_length keeps its first tokens; what is trained is the start of the answer."""
    src = write_rows(tmp_path / "rows.jsonl", [row, {"text": "short"} if fmt == "text" else row])
    prep = prepare(src, training={"max_seq_length": 48})
    assert prep.stats["format"] == fmt and prep.stats["over_max_length"] >= 1 and prep.stats["truncated"] >= 1
    first = prep.train[0]
    assert len(first["input_ids"]) == 48
    (run,) = trained_runs(tokenizer, first["input_ids"], first["labels"])
    assert LONG.startswith(run) and len(run) > 10  # the cut end (and its end-of-turn token) is not trained


def test_csv_blank_lines(tmp_path, prepare):
    """Blank lines and lines of empty fields (as spreadsheets export them) are not rows."""
    (tmp_path / "rows.csv").write_text('prompt,completion\n"a","b"\n\n,\n"",""\n"c","d"\n', encoding="utf-8")
    assert prepare(tmp_path / "rows.csv").stats["rows"] == 2
