"""dataset.preprocess: the user's function changes what is trained, runs once per code and data (cached),
runs again when its code changes, and a failure in it is one line naming the file and the function, with the
traceback in the log."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from kubetune.data.preprocess import preprocess_inputs
from kubetune.errors import DataError, SpecError
from kubetune.spec import load_spec
from kubetune.worker import prepare_data

from .conftest import write_rows

PREP = """
import json, os

def transform(rows):
    with open(os.environ["PREP_CALLS"], "a") as f:   # the test counts how often the code really ran
        f.write("called\\n")
    for row in rows:
        if row.get("keep"):
            yield {"prompt": row["q"] + "{suffix}", "completion": row["a"]}
"""


def _code(path: Path, suffix: str = "?", body: str = PREP) -> Path:
    path.write_text(textwrap.dedent(body).replace("{suffix}", suffix), encoding="utf-8")
    return path


def _rows(tag: str, n: int = 12) -> list[dict]:
    return [{"q": f"Capital of land {tag}{i}", "a": f"City {tag}{i}.", "keep": i % 3 != 0} for i in range(n)]


def _job(source: Path, code: Path, *, function: str = "transform", **dataset):
    return load_spec({
        "name": "prep-test",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(source), "preprocess": {"file": str(code), "function": function}, **dataset},
        "training": {"max_seq_length": 128},
    })  # fmt: skip


@pytest.fixture
def calls(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "calls.txt"
    monkeypatch.setenv("PREP_CALLS", str(path))
    return path


def _ran(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_function_decides_what_is_trained(tmp_path, calls, tiny_model):
    src = write_rows(tmp_path / "raw.jsonl", _rows("train"))
    ev = write_rows(tmp_path / "eval.jsonl", _rows("eval", 6))
    job = _job(src, _code(tmp_path / "prep.py"), eval_source=str(ev))
    tokenizer, prepared = prepare_data(job, {"model": tiny_model, "dataset": src, "eval_dataset": ev}, None)
    # rows the function dropped are not trained; the kept ones arrive in the format it produced
    assert prepared.stats["rows"] == 8 and prepared.stats["format"] == "prompt_completion"
    assert prepared.stats["eval_rows"] == 4  # eval_source goes through the same function
    text = "".join(tokenizer.decode(ids) for ids in prepared.train["input_ids"])
    assert "Capital of land train1?" in text and "City train1." in text
    assert "land train0" not in text and "land train3" not in text  # keep: false
    assert _ran(calls) == 2  # once for source, once for eval_source


def test_same_code_hits_the_cache_and_changed_code_runs_again(tmp_path, calls):
    src = write_rows(tmp_path / "raw.jsonl", _rows("cache"))
    code = _code(tmp_path / "prep.py")
    logs: list[str] = []
    first = preprocess_inputs(_job(src, code), {"dataset": src}, log=logs.append)["dataset"]
    assert _ran(calls) == 1 and logs[-1].startswith(f"preprocessed {src} with prep.py:transform: 12 rows in, 8 rows out")
    again = preprocess_inputs(_job(src, code), {"dataset": src}, log=logs.append)["dataset"]
    assert _ran(calls) == 1, "the same code over the same data ran again"
    assert again == first and "reusing preprocessed rows" in logs[-1] and "prep.py:transform unchanged" in logs[-1]
    # the same file name with other content: the cache key holds the code's bytes, not its path
    _code(code, suffix="??")
    changed = preprocess_inputs(_job(src, code), {"dataset": src}, log=logs.append)["dataset"]
    assert _ran(calls) == 2 and changed != first
    assert json.loads(changed.read_text().splitlines()[0])["prompt"].endswith("??")
    assert json.loads(first.read_text().splitlines()[0])["prompt"].endswith("?")  # the old entry is intact
    # other data with the same code: runs; dataset.cache: false: always runs
    src2 = write_rows(tmp_path / "raw2.jsonl", _rows("other"))
    preprocess_inputs(_job(src, code), {"dataset": src2})
    preprocess_inputs(_job(src, code, cache=False), {"dataset": src})
    assert _ran(calls) == 4


def test_a_failing_function_is_one_line_and_its_traceback_is_in_the_log(tmp_path, calls, capfd):
    src = write_rows(tmp_path / "raw.jsonl", [{"q": "x", "a": "y", "keep": True}, {"question": "no q here"}])
    code = _code(tmp_path / "prep.py", body="""
        def transform(rows):
            return [{"prompt": r["q"], "completion": r["a"]} for r in rows]
    """)
    with pytest.raises(DataError) as e:
        preprocess_inputs(_job(src, code), {"dataset": src})
    assert str(e.value).splitlines()[0] == "dataset.preprocess: prep.py:transform raised KeyError: 'q'"
    assert "traceback is in the log" in str(e.value)
    err = capfd.readouterr().err
    assert "Traceback (most recent call last)" in err and f'File "{code}", line 3' in err
    # nothing half-written was cached: the fixed code runs
    _code(code)
    write_rows(src, _rows("fixed"))
    assert preprocess_inputs(_job(src, code), {"dataset": src})["dataset"].is_file()


@pytest.mark.parametrize(
    ("body", "function", "message"),
    [
        ("def other(rows):\n    return rows\n", "transform", "prep.py defines no function 'transform' (it defines other)"),
        ("def transform(rows):\n    return None\n", "transform", "prep.py:transform returned NoneType for"),
        ("def transform(rows):\n    return [1, 2]\n", "transform", "prep.py:transform gave a int as row 1, not a dict"),
        ("def transform(rows):\n    return []\n", "transform", "prep.py:transform returned no rows"),
        ("import not_a_module_anywhere\n", "transform", "loading prep.py failed: ModuleNotFoundError"),
    ],
)
def test_what_the_code_gets_wrong_is_named(tmp_path, calls, body, function, message):
    src = write_rows(tmp_path / "raw.jsonl", _rows("bad", 3))
    code = _code(tmp_path / "prep.py", body=body)
    with pytest.raises(DataError, match=None) as e:
        preprocess_inputs(_job(src, code, function=function), {"dataset": src})
    assert message in str(e.value)


def test_a_malformed_input_row_names_its_line(tmp_path, calls):
    src = write_rows(tmp_path / "raw.jsonl", [{"q": "a", "a": "b", "keep": True}, "{not json"])
    code = _code(tmp_path / "prep.py")
    with pytest.raises(DataError, match=r"raw.jsonl:2: invalid JSON"):
        preprocess_inputs(_job(src, code), {"dataset": src})
    out = preprocess_inputs(_job(src, code, on_bad_rows="skip"), {"dataset": src})["dataset"]
    assert len(out.read_text().splitlines()) == 1


def test_the_spec_field(tmp_path):
    spec_dir = tmp_path / "project"
    spec_dir.mkdir()
    _code(spec_dir / "prep.py")
    write_rows(spec_dir / "rows.jsonl", _rows("spec", 2))
    (spec_dir / "job.yaml").write_text(
        "model: {source: 'builtin://tiny-chat'}\ndataset: {source: rows.jsonl, preprocess: {file: prep.py, function: transform}}\n"
    )
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        job = load_spec(spec_dir / "job.yaml")  # relative to the spec file, like dataset.source
    finally:
        os.chdir(cwd)
    assert job.dataset.preprocess.file == str(spec_dir / "prep.py")
    assert load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "x.jsonl", "preprocess": {"file": "p.py"}}}).dataset.preprocess.function == "preprocess"
    for bad, message in [({"file": "prep.sh"}, "is not a Python file"), ({"file": "p.py", "function": "mod.fn"}, "not a Python function name"),
                         ({"file": "p.py", "extra": 1}, "extra")]:
        with pytest.raises(SpecError, match=message):
            load_spec({"name": "x", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "x.jsonl", "preprocess": bad}})


# --- through a real worker (local backend) ----------------------------------------------------------
KEEP_ODD = """
def transform(rows):
    for i, row in enumerate(rows):
        if i % 2:
            yield row
"""


def _run_local(job: dict):
    from kubetune import Client

    client = Client("local")
    ref = client.submit(job)
    status = client.wait(ref, timeout=400)
    return status, Path(ref.run_dir)


@pytest.mark.slow
def test_a_local_job_trains_on_the_preprocessed_rows(tiny_job, tmp_path, capitals):
    code = _code(tmp_path / "prep.py", body=KEEP_ODD)
    job = tiny_job(dataset={"source": str(capitals), "eval_split": 0.0, "preprocess": {"file": str(code), "function": "transform"}},
                   training={"max_steps": 2, "save_steps": 2})
    status, run = _run_local(job)
    assert status.state == "succeeded", (status.reason, (run / "logs" / "worker.log").read_text()[-3000:])
    total = len(capitals.read_text().splitlines())
    assert json.loads((run / "result.json").read_text())["data"]["rows"] == total // 2
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    said = [e["message"] for e in events if e["type"] == "stage"]
    assert any(m.startswith(f"preprocessed {capitals} with prep.py:transform: {total} rows in, {total // 2} rows out") for m in said)


@pytest.mark.slow
def test_a_local_job_whose_function_fails_says_so_in_one_line(tiny_job, tmp_path, capitals):
    code = _code(tmp_path / "prep.py", body="def transform(rows):\n    raise ValueError('no rows for you')\n")
    status, run = _run_local(tiny_job(dataset={"source": str(capitals), "preprocess": {"file": str(code), "function": "transform"}}))
    assert status.state == "failed"
    assert status.reason.splitlines()[0] == "dataset.preprocess: prep.py:transform raised ValueError: no rows for you"
    log = (run / "logs" / "worker.log").read_text()
    assert "Traceback (most recent call last)" in log and "raise ValueError('no rows for you')" in log
