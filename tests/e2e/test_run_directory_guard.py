"""A run directory is never lost or shared by mistake (issue 14, defects 4, 6 and 9).

* a rerun of a finished run with the same spec does nothing and exits 0; another spec is refused (exit 2)
  unless --restart, and even then the earlier result stays until the new run has proven it can start;
* two runs on one output directory at the same moment: exactly one trains, the other exits 2 naming the pid;
* an unwritable or full output directory ends in one clear message (exit 2) or a ``failed`` state with the
  reason, and ``list``/``status`` never crash on a damaged run directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kubetune import Client, constants as C
from kubetune.events import RunDir


def _write(tmp_path: Path, spec: dict, name: str = "job.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return f


def _cli(kubetune_cli, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*kubetune_cli, *args], capture_output=True, text=True, timeout=timeout)


def _fingerprint(run: Path) -> dict:
    """What a finished run's result is: DONE, result.json and the adapter, byte for byte."""
    files = [run / C.DONE_FILE, run / C.RESULT_FILE, *sorted((run / C.ADAPTER_DIR).rglob("*"))]
    return {str(p.relative_to(run)): p.read_bytes() for p in files if p.is_file()}


@pytest.fixture
def finished(tiny_job, tmp_path, kubetune_cli):
    """A spec file and its run directory after one successful CLI run."""
    spec = tiny_job(training={"max_steps": 2, "save_steps": 2})
    f = _write(tmp_path, spec)
    first = _cli(kubetune_cli, "run", str(f))
    assert first.returncode == 0, first.stdout + first.stderr
    return f, Path(spec["output"]["dir"])


def test_rerun_of_a_finished_run_with_the_same_spec_does_nothing(finished, kubetune_cli):
    f, run = finished
    before = _fingerprint(run)
    events_before = len(RunDir(run).read_events())
    again = _cli(kubetune_cli, "run", str(f))
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "nothing to do" in out and "succeeded" in out
    assert _fingerprint(run) == before  # DONE, result.json and the adapter untouched
    assert len(RunDir(run).read_events()) == events_before  # no worker started
    # the SDK says the same: the finished run's reference, state succeeded
    client = Client()
    ref = client.submit(str(f))
    assert ref.extra.get("already_complete") is True
    assert client.wait(ref, timeout=10).state == C.STATE_SUCCEEDED
    detached = _cli(kubetune_cli, "run", str(f), "--detach")
    assert detached.returncode == 0 and ref.id in detached.stdout


def test_rerun_with_another_spec_is_refused_and_keeps_the_result(finished, kubetune_cli):
    f, run = finished
    before = _fingerprint(run)
    other = _cli(kubetune_cli, "run", str(f), "--set", "training.learning_rate=1e-3")
    out = other.stdout + other.stderr
    assert other.returncode == 2, out
    assert "finished run of a different spec" in out and "training.learning_rate" in out and "--restart" in out
    assert "Traceback" not in out
    assert _fingerprint(run) == before


def test_restart_keeps_the_old_result_until_the_new_run_can_start(finished, kubetune_cli, tmp_path):
    f, run = finished
    before = _fingerprint(run)
    broken = _cli(kubetune_cli, "run", str(f), "--restart", "--set", f"dataset.source={tmp_path}/missing.jsonl")
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "missing.jsonl" in broken.stdout + broken.stderr
    assert _fingerprint(run) == before  # the new run never started training: the old result is intact
    fresh = _cli(kubetune_cli, "run", str(f), "--restart", "--set", "training.learning_rate=1e-3")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert yaml.safe_load((run / C.SPEC_FILE).read_text())["training"]["learning_rate"] == pytest.approx(1e-3)
    assert RunDir(run).is_done() and RunDir(run).read_result()


def test_two_runs_on_one_output_dir_at_the_same_moment_only_one_trains(tiny_job, tmp_path, kubetune_cli):
    spec = tiny_job(training={"max_steps": 3, "save_steps": 3})
    f = _write(tmp_path, spec)
    procs = [subprocess.Popen([*kubetune_cli, "run", str(f)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = outs[[p.returncode for p in procs].index(2)]
    assert "is in use" in loser and "process " in loser, loser
    assert "Traceback" not in loser
    events = RunDir(spec["output"]["dir"]).read_events()
    assert sum(1 for ev in events if ev.get("type") == "done") == 1  # one run's events, not two
    assert sum(1 for ev in events if (ev.get("data") or {}).get("state") == C.STATE_RUNNING) == 1


def test_a_worker_started_by_hand_on_a_busy_run_dir_exits_2_naming_the_holder(tiny_job, tmp_path):
    spec = tiny_job(training={"max_steps": 5000, "save_steps": 1000})
    client = Client()
    ref = client.submit(spec)
    try:
        deadline = time.time() + 120
        while client.status(ref).state != C.STATE_RUNNING and time.time() < deadline:
            time.sleep(0.2)
        holder = RunDir(ref.run_dir).holder_pid()
        assert holder == client.status(ref).extra.get("worker_pid")
        events_before = len(RunDir(ref.run_dir).read_events())
        f = _write(tmp_path, {**spec, "training": {**spec["training"], "max_steps": 5000}}, "second.yaml")
        env = {k: v for k, v in os.environ.items() if k != C.ENV_RUN_LOCK_FD}
        second = subprocess.run([sys.executable, "-m", "kubetune.worker", "--spec", str(f)], capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"process {holder}" in second.stderr
        assert client.status(ref).state == C.STATE_RUNNING  # the loser wrote nothing into the run directory
        assert len([ev for ev in RunDir(ref.run_dir).read_events() if ev.get("type") == "state"]) == len(
            [ev for ev in RunDir(ref.run_dir).read_events()[:events_before] if ev.get("type") == "state"])
    finally:
        client.cancel(ref)
    # the lock dies with its holder: the directory is free again
    again = client.submit({**spec, "training": {**spec["training"], "max_steps": 2, "save_steps": 2}})
    assert client.wait(again, timeout=300).state == C.STATE_SUCCEEDED


def test_cancel_stops_the_worker_even_when_a_racing_status_write_dropped_its_pid(tiny_job, tmp_path):
    """The submitter writes the worker's pid into status.json while the starting worker may be rewriting the same
    file; if the worker's write wins, the pid is gone from status.json. Cancel must still stop the worker (and so
    free the run directory), from the pid the reference carries or the worker's own."""
    import json

    spec = tiny_job(training={"max_steps": 5000, "save_steps": 1000})
    client = Client()
    ref = client.submit(spec)
    deadline = time.time() + 120
    while client.status(ref).state != C.STATE_RUNNING and time.time() < deadline:
        time.sleep(0.2)
    status_file = Path(ref.run_dir) / C.STATUS_FILE
    data = json.loads(status_file.read_text())
    data.pop("pid", None)
    status_file.write_text(json.dumps(data))
    client.cancel(ref.id)  # as `kubetune cancel ID` does: the reference is looked up again
    assert client.status(ref).state == C.STATE_CANCELLED
    again = client.submit({**spec, "training": {**spec["training"], "max_steps": 2, "save_steps": 2}})
    assert client.wait(again, timeout=300).state == C.STATE_SUCCEEDED


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_an_unwritable_output_dir_is_one_clear_error(tiny_job, tmp_path, kubetune_cli, where):
    if where == "under_a_file":
        (tmp_path / "plain").write_text("x")
        out_dir = tmp_path / "plain" / "run"
    else:
        out_dir = Path("/proc/self/kubetune-run")
    f = _write(tmp_path, tiny_job(output={"dir": str(out_dir)}))
    res = _cli(kubetune_cli, "run", str(f))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert str(out_dir.parent) in out and "Traceback" not in out


@pytest.fixture
def small_disk(tmp_path):
    """A 700 KiB tmpfs: room for the run's records, not for a 1.1 MB checkpoint (needs root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_fails_the_job_with_the_reason_and_list_status_still_work(tiny_job, tmp_path, kubetune_cli, small_disk):
    spec = tiny_job(training={"max_steps": 4, "save_steps": 2}, output={"dir": str(small_disk / "run")})
    f = _write(tmp_path, spec)
    res = _cli(kubetune_cli, "run", str(f))
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "no space left on device" in out
    st = RunDir(small_disk / "run").read_status()
    assert st is not None and st.state == C.STATE_FAILED, st
    assert "no space left on device" in (st.reason or "")
    assert not any((small_disk / "run" / C.CHECKPOINTS_DIR).glob("checkpoint-*")), "a half-written checkpoint was left"
    for args in (["status", str(small_disk / "run")], ["list"]):
        r = _cli(kubetune_cli, *args)
        assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "failed" in _cli(kubetune_cli, "status", str(small_disk / "run")).stdout


@pytest.mark.parametrize(
    "damage",
    {
        "status_not_json": {C.STATUS_FILE: b"{not json"},
        "status_binary": {C.STATUS_FILE: b"\xff\xfe\x00garbage"},
        "status_a_list": {C.STATUS_FILE: b"[1, 2]"},
        "status_wrong_types": {C.STATUS_FILE: json.dumps({"state": "running", "step": "many", "loss": "low", "extra": [1], "pid": "x"}).encode()},
        "events_and_result_damaged": {C.EVENTS_FILE: b"\xff\n[]\n{\"type\": 1}\n", C.RESULT_FILE: b"[]"},
    }.items(),
    ids=lambda kv: kv[0] if isinstance(kv, tuple) else str(kv),
)
def test_list_and_status_never_crash_on_a_damaged_run_dir(finished, kubetune_cli, damage):
    _, run = finished
    for name, data in damage[1].items():
        (run / name).write_bytes(data)
    for args in (["status", str(run)], ["status", str(run), "--json"], ["list"], ["list", "-o", "json"], ["list", "-o", "wide"], ["logs", str(run)]):
        r = _cli(kubetune_cli, *args)
        out = r.stdout + r.stderr
        assert r.returncode in (0, 2), out
        assert "Traceback" not in out, out


def test_list_and_status_speak_kubectl_s_output_formats(finished, kubetune_cli):
    """`-o json|yaml|wide` on list, `-o json|yaml` on status: the same records either way, raw values."""
    _, run = finished
    job_id = RunDir(run).read_status().job_id
    as_json = json.loads(_cli(kubetune_cli, "list", "-o", "json").stdout)
    mine = [j for j in as_json if j["job_id"] == job_id]
    assert len(mine) == 1 and mine[0]["state"] == C.STATE_SUCCEEDED and mine[0]["run_dir"] == str(run)
    assert mine[0]["step"] == mine[0]["total_steps"] == 2 and isinstance(mine[0]["finished_at"], float)
    assert yaml.safe_load(_cli(kubetune_cli, "list", "-o", "yaml").stdout) == as_json

    wide = _cli(kubetune_cli, "list", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["JOB", "NAME", "BACKEND", "STATE", "STAGE", "STEP", "LOSS", "TOKENS/S", "CREATED", "FINISHED", "RUN", "DIR"]
    row = next(line.split() for line in wide if line.split() and line.split()[0] == job_id)
    assert row[1:4] == ["tiny", "local", C.STATE_SUCCEEDED] and row[-1] == str(run)
    created, finished_at = row[-3:-1]  # ISO 8601, one word each
    assert created <= finished_at and finished_at.startswith(time.strftime("%Y-")) and "T" in finished_at
    assert _cli(kubetune_cli, "list").stdout.splitlines()[0].split() == ["JOB", "STATE", "STAGE", "STEP", "LOSS", "RUN", "DIR"]

    st_json = json.loads(_cli(kubetune_cli, "status", job_id, "-o", "json").stdout)
    assert st_json == json.loads(_cli(kubetune_cli, "status", job_id, "--json").stdout)
    assert yaml.safe_load(_cli(kubetune_cli, "status", job_id, "-o", "yaml").stdout) == st_json
    bad = subprocess.run([*kubetune_cli, "list", "-o", "xml"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'xml' is not one of table, wide, json, yaml" in bad.stderr and "Traceback" not in bad.stderr


def test_a_status_dir_in_place_of_status_json_is_reported_not_crashed(finished, kubetune_cli):
    _, run = finished
    (run / C.STATUS_FILE).unlink()
    (run / C.STATUS_FILE).mkdir()
    r = _cli(kubetune_cli, "list")
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    shutil.rmtree(run / C.STATUS_FILE)


def test_each_job_in_one_run_directory_keeps_its_own_status_and_log(finished, kubetune_cli, tmp_path):
    """Issue 22: reruns of a spec share its output.dir; `status`/`logs`/`cancel` of an earlier job id concern that job,
    the run directory (or the newest id) the newest job, and `logs --all` shows every job under its own header."""
    f, run = finished
    first = RunDir(run).read_status().job_id
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": [oops\n')
    failed = _cli(kubetune_cli, "run", str(f), "--restart", "--set", f"dataset.source={bad}", "--set", "dataset.eval_split=0")
    assert failed.returncode == 2, failed.stdout + failed.stderr
    second = RunDir(run).read_status().job_id
    assert second != first

    old = _cli(kubetune_cli, "status", first)
    assert old.returncode == 0, old.stderr
    assert "state succeeded" in " ".join(old.stdout.split()) and f"job_id {first}" in " ".join(old.stdout.split())
    assert "bad.jsonl" not in old.stdout
    raw = json.loads(_cli(kubetune_cli, "status", first, "--json").stdout)
    assert raw["state"] == C.STATE_SUCCEEDED and raw["step"] == raw["total_steps"] == 2
    assert isinstance(raw["created_at"], float) and raw["created_at"] < raw["finished_at"]
    for key in (second, str(run)):  # the newest id and the run directory: the newest job, as before
        newest = json.loads(_cli(kubetune_cli, "status", key, "--json").stdout)
        assert newest["job_id"] == second and newest["state"] == C.STATE_FAILED and f"{bad}:2" in newest["reason"]
    listed = _cli(kubetune_cli, "list").stdout
    rows = {line.split()[0]: line.split()[1] for line in listed.splitlines() if line.split() and line.split()[0] in (first, second)}
    assert rows == {first: C.STATE_SUCCEEDED, second: C.STATE_FAILED}, listed

    header = C.LOG_JOB_HEADER_PREFIX
    old_log = _cli(kubetune_cli, "logs", first).stdout.splitlines()
    assert old_log[0].startswith(f"{header}{first} ") and any("step 2/2" in line for line in old_log)
    assert not any(second in line or "bad.jsonl" in line for line in old_log)
    new_log = _cli(kubetune_cli, "logs", str(run)).stdout.splitlines()
    assert new_log[0].startswith(f"{header}{second} ") and not any(first in line or "step 2/2" in line for line in new_log)
    every = _cli(kubetune_cli, "logs", str(run), "--all").stdout.splitlines()
    headers = [line.split()[3] for line in every if line.startswith(header)]
    assert headers == [first, second] and every == old_log + new_log

    # a third job runs: cancelling an earlier id leaves it alone, and `logs -f` follows its part only
    third = _cli(kubetune_cli, "run", str(f), "--restart", "--detach", "--set", "training.max_steps=5000", "--set", "training.save_steps=1000")
    assert third.returncode == 0, third.stdout + third.stderr
    third_id = third.stdout.strip()
    follow = subprocess.Popen([*kubetune_cli, "logs", "-f", third_id], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cancel_old = _cli(kubetune_cli, "cancel", first)
        assert cancel_old.returncode == 0 and f"{first}: succeeded" in cancel_old.stdout
        deadline = time.time() + 180
        while RunDir(run).read_status().stage != C.STAGE_TRAIN and time.time() < deadline:
            time.sleep(0.3)
        assert RunDir(run).read_status().state == C.STATE_RUNNING
        assert _cli(kubetune_cli, "cancel", third_id).returncode == 0
        followed = follow.communicate(timeout=60)[0].splitlines()
    finally:
        follow.kill()
    assert follow.returncode == 0
    assert followed[0].startswith(f"{header}{third_id} ") and "[kubetune] training" in followed
    assert not any(first in line or second in line for line in followed)
    assert json.loads(_cli(kubetune_cli, "status", first, "--json").stdout)["state"] == C.STATE_SUCCEEDED
