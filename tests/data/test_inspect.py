"""``kubetune data inspect``: what a user sees about a dataset before training, in text and JSON, and
the exit code 2 with ``file:line`` for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import write_rows

GOOD = {"messages": [{"role": "user", "content": "Capital of Ghana?"}, {"role": "assistant", "content": "Accra."}]}


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_cli(*args):
    """The command in this process (the CLI's entry point maps user errors to exit code 2 and one line)."""
    from typer.testing import CliRunner

    from kubetune.cli import app
    from kubetune.errors import KubetuneError

    res = CliRunner().invoke(app, ["data", "inspect", *map(str, args)])
    if isinstance(res.exception, KubetuneError):
        return _Result(2, res.stdout, str(res.exception))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return _Result(res.exit_code, res.stdout, res.stderr)


def run_cli_process(*args, timeout=600):
    """The installed command in a child process: exit codes and stderr exactly as a user sees them."""
    return subprocess.run([sys.executable, "-m", "kubetune.cli", "data", "inspect", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_json_report(tmp_path):
    long = {"messages": [{"role": "user", "content": "Talk."}, {"role": "assistant", "content": " ".join(["word"] * 300)}]}
    src = write_rows(tmp_path / "rows.jsonl", [GOOD] * 5 + [long])
    out = run_cli(src, "--json", "--max-seq-length", "64")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["format"] == "messages" and rep["rows"] == 6 and rep["bad_rows"] == 0
    assert rep["chat_template"] == "chatml" and rep["end_of_turn"] == "<|im_end|>"
    assert rep["over_max_length"] == 1 and rep["max_seq_length"] == 64
    assert rep["tokens"]["max"] > 64 and rep["tokens"]["min"] < 64
    assert sum(b["rows"] for b in rep["histogram"]) == 6
    trained = "".join(s["text"] for s in rep["example"]["segments"] if s["trained"])
    assert trained == "Accra.<|im_end|>"
    assert rep["example"]["where"] == f"{src}:1"


def test_an_archive_is_inspected_like_the_file_inside(tmp_path):
    import tarfile
    from pathlib import Path

    capitals = Path(__file__).resolve().parents[2] / "examples" / "data" / "capitals.jsonl"
    arc = tmp_path / "capitals.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(capitals, arcname="capitals.jsonl")
    out = run_cli(arc, "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert (rep["format"], rep["files"], rep["rows"], rep["bad_rows"]) == ("messages", 1, 300, 0)
    assert rep["example"]["where"].endswith("/capitals.jsonl:1")


def test_text_report(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD] * 3)
    out = run_cli(src)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("format", "messages (1 file)", "3 usable, 0 malformed", "chatml", "tokens per row", "token lengths", "example", "Accra.<|im_end|>"):
        assert needle in text, needle


def test_bad_input_exits_2_with_file_and_line(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD, GOOD, '{"messages": [', GOOD])
    out = run_cli_process(src, "--json")
    assert out.returncode == 2
    assert f"{src}:3: invalid JSON" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_bad_rows_are_counted_when_skipping(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", [GOOD, "{nope", GOOD, {"messages": [{"role": "user", "content": "no answer"}]}])
    out = run_cli(src, "--json", "--on-bad-rows", "skip")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["rows"] == 2 and rep["bad_rows"] == 2
    assert rep["bad_examples"][0].startswith(f"{src}:2: invalid JSON")


@pytest.mark.parametrize(
    "args,fmt",
    [
        (["--format", "text"], "text"),
        (["--column", "prompt=q", "--column", "completion=a"], "prompt_completion"),
    ],
)
def test_format_and_columns_options(tmp_path, args, fmt):
    src = write_rows(tmp_path / "rows.jsonl", [{"q": "Capital of Mali?", "a": " Bamako.", "text": "t"}])
    out = run_cli(src, "--json", *args)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["format"] == fmt


def test_unknown_source_exits_2(tmp_path):
    out = run_cli(tmp_path / "missing.jsonl")
    assert out.returncode == 2 and "no such file or directory" in out.stderr
    out = run_cli(tmp_path / "missing.jsonl", "--column", "nonsense")
    assert out.returncode == 2 and "--column 'nonsense'" in out.stderr


def test_cli_module_stays_light():
    code = "import sys, kubetune.cli.data, kubetune.data; print(sorted(m for m in ('torch', 'datasets', 'pyarrow', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
