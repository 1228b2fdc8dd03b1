"""Streaming commands whose reader goes away (`kubetune logs -f RUN | head`, `kubetune run SPEC | head`) end
quietly with exit code 141, what a shell reports for SIGPIPE: no traceback, no "Exception ignored" at exit.
`kubetune chat` is tested with the serving commands (tests/serve/test_cli.py)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kubetune.events import RunDir


def _cut_after_first_line(argv: list[str], **kw) -> tuple[str, int, str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does once it has its line
        err = proc.stderr.read()
        return first, proc.wait(timeout=300), err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("follow", [False, True])
def test_logs_end_quietly_when_the_reader_goes_away(tmp_path, kubetune_cli, follow):
    run = RunDir(tmp_path / "run")
    run.submitted("job-1", name="job", backend="local", spec_text="")
    run.worker_log.write_text("".join(f"line {i}\n" for i in range(200_000)))  # more than a pipe holds
    first, code, err = _cut_after_first_line([*kubetune_cli, "logs", str(run.path), *(["-f"] if follow else [])])
    assert first == "line 0\n"
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_run_stops_following_and_the_job_goes_on(tiny_job, tmp_path, kubetune_cli):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(tiny_job(training={"max_steps": 40, "save_steps": 40})))
    first, code, err = _cut_after_first_line([*kubetune_cli, "run", str(spec)])
    job_id = first.split()[0]
    try:
        assert code == 141, err
        assert "Traceback" not in err and f"stopped following {job_id}, which goes on" in err, err
        st = subprocess.run([*kubetune_cli, "status", job_id, "--json"], capture_output=True, text=True, timeout=60)
        assert yaml.safe_load(st.stdout)["state"] in ("pending", "running", "succeeded"), st.stdout + st.stderr
    finally:
        subprocess.run([*kubetune_cli, "cancel", job_id], capture_output=True, timeout=120)


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["run", "--help"],
    ["presets"],
    ["data", "inspect", "examples/data/capitals.jsonl", "--model", "builtin://tiny-chat"],
], ids=["help", "run-help", "presets", "data-inspect"])
def test_printing_commands_end_quietly_on_a_closed_stdout(kubetune_cli, argv):
    """`kubetune --help | head`, `kubetune presets | head`: the reader is gone before anything is written, so the
    very first write fails; every rich console (typer's help pages included) must end as kubetune's own do (141),
    not with rich's exit 1."""
    import os
    from pathlib import Path

    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that has already gone away: the first write gets EPIPE
    try:
        proc = subprocess.run([*kubetune_cli, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[2])
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
