"""A real sweep on the builtin tiny model, through the command line: a 4-trial grid run 2 at a time is
killed mid-way (the sweep process and its trials, as a crash would), resumed from checkpoints, ranked,
exported, and rerun without training anything again."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C
from kubetune.events import RunDir

pytestmark = pytest.mark.slow

MAX_STEPS = 8
NAMES = ["rank-t-r2-lr1e-3", "rank-t-r2-lr3e-3", "rank-t-r8-lr1e-3", "rank-t-r8-lr3e-3"]


@pytest.mark.timeout(1200)
def test_grid_sweep_killed_resumed_ranked_and_skipped_on_rerun(tmp_path, tiny_model, capitals, kubetune_cli):
    spec = tmp_path / "rank.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "rank",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(capitals), "eval_split": 0.1},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16}},
        "training": {"max_steps": MAX_STEPS, "batch_size": 8, "learning_rate": 3e-3, "max_seq_length": 128, "save_steps": 2, "logging_steps": 1},
        "sweep": {"dir": str(tmp_path / "sweeps" / "{id}")},
    }))
    sweep_cmd = [*kubetune_cli, "sweep", str(spec), "--grid", "method.lora.r=2,8", "--grid", "training.learning_rate=1e-3,3e-3",
                 "--parallel", "2", "--run-id", "t"]
    trials = tmp_path / "sweeps" / "rank-t" / C.SWEEP_TRIALS_DIR

    # 1. Start the sweep; once a trial has succeeded and another is mid-way with a checkpoint, kill -9 all of it.
    started = time.time()
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(sweep_cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        victim = _wait_until_mid_way(proc, trials, tmp_path / "first.log")
    finally:
        killed_at = _kill_everything(proc, trials)
    done_before = [n for n in NAMES if RunDir(trials / n).is_done()]
    assert 1 <= len(done_before) < 4 and victim not in done_before
    ids_before = {n: RunDir(trials / n).read_status().job_id for n in done_before}

    crashed = _cli(*kubetune_cli, "sweep", "status", "rank-t", cwd=tmp_path)
    assert "sweep rank-t (interrupted" in crashed.stdout

    # 2. The same command again: finished trials are skipped, the killed one continues from its checkpoint.
    resumed_at = time.time()
    rerun = _cli(*sweep_cmd, cwd=tmp_path)
    for name in done_before:
        assert f"{name}: skipped (succeeded earlier" in rerun.stdout
        assert RunDir(trials / name).read_status().job_id == ids_before[name]
    results = {n: RunDir(trials / n).read_result() for n in NAMES}
    assert all(RunDir(trials / n).is_done() and results[n]["global_step"] == MAX_STEPS for n in NAMES), rerun.stdout
    assert re.search(r"checkpoint-\d+$", results[victim]["resumed_from"] or ""), results[victim]
    resumes = [e for e in RunDir(trials / victim).read_events() if e["type"] == "checkpoint" and (e.get("data") or {}).get("resume")]
    assert resumes and resumes[-1]["time"] > resumed_at

    # Never more than 2 trials at once, and 2 at once when there was work for 2.
    assert _most_at_once(trials, started, killed_at) == 2
    assert _most_at_once(trials, resumed_at, time.time()) <= 2

    # Trials share the tokenized data: the prepared-data cache is built at most once (when the cache exists).
    caches = [(r.get("data") or {}).get("cache") for r in results.values()]
    if any(caches):
        assert caches.count("miss") <= 1, caches

    # 3. The table ranks the trials by eval_loss, best first, and marks the best.
    best = min(NAMES, key=lambda n: results[n]["eval_loss"])
    table = _cli(*kubetune_cli, "sweep", "status", "rank-t", "--csv", "t.csv", "--json", "t.json", "--plot", "t.png", "--html", "t.html", cwd=tmp_path).stdout
    assert "sweep rank-t (succeeded, eval_loss minimize)" in table
    assert re.search(rf"^\s*1 \*\s+{best}\s+(2|8)\s+0\.00[13]\s+succeeded\s+{results[best]['eval_loss']:.4g}\s", table, re.M), table
    order = sorted(NAMES, key=lambda n: table.index(f" {n} "))
    assert order == sorted(NAMES, key=lambda n: results[n]["eval_loss"])
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert [r["trial"] for r in rows] == order and rows[0]["best"] == "True"
    assert float(rows[0]["eval_loss"]) == pytest.approx(results[best]["eval_loss"])
    exported = json.loads((tmp_path / "t.json").read_text())
    assert exported["best"]["trial"] == best and len(exported["trials"]) == 4
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "t.html").read_text()
    assert best in page and "data:image/png;base64," in page
    as_yaml = yaml.safe_load(_cli(*kubetune_cli, "sweep", "status", "rank-t", "-o", "yaml", cwd=tmp_path).stdout)
    assert [t["trial"] for t in as_yaml["trials"]] == order and as_yaml["trials"][0]["run_dir"] == str(trials / best)
    wide = _cli(*kubetune_cli, "sweep", "status", "rank-t", "-o", "wide", cwd=tmp_path).stdout
    assert re.search(rf"^\s*1 \*\s+{best}\s.*\s{re.escape(str(trials / best))}", wide, re.M), wide

    # 4. Rerun once more: nothing trains, every trial keeps its job.
    ids = {n: RunDir(trials / n).read_status().job_id for n in NAMES}
    again = _cli(*sweep_cmd, cwd=tmp_path)
    assert "4 trials, 0 to run" in again.stdout and all(f"{n}: skipped" in again.stdout for n in NAMES)
    assert {n: RunDir(trials / n).read_status().job_id for n in NAMES} == ids


# --- helpers ---------------------------------------------------------------------------------
def _cli(*cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _wait_until_mid_way(proc: subprocess.Popen, trials: Path, log: Path, timeout: float = 900) -> str:
    """The name of a running trial with a complete checkpoint, once some other trial has succeeded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended (exit {proc.returncode}) before it could be killed mid-way:\n{log.read_text()}")
        done = [n for n in NAMES if RunDir(trials / n).is_done()]
        for name in NAMES:
            st = RunDir(trials / name).read_status()
            ckpts = trials / name / C.CHECKPOINTS_DIR
            if done and st and st.state == C.STATE_RUNNING and st.step < MAX_STEPS and ckpts.is_dir() \
                    and any((p / C.CHECKPOINT_COMPLETE).is_file() for p in ckpts.iterdir()):
                return name
        time.sleep(0.05)
    pytest.fail("no trial reached a checkpoint in time")


def _kill_everything(proc: subprocess.Popen, trials: Path) -> float:
    """kill -9 the sweep process, then every trial worker (each runs in its own process group)."""
    with_suppressed = (ProcessLookupError, PermissionError)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except with_suppressed:
        pass
    proc.wait()
    killed_at = time.time()
    for _ in range(2):  # twice: a worker started just before the kill records its pid a moment later
        for name in NAMES:
            st = RunDir(trials / name).read_status()
            for pid in {st.pid, st.extra.get("worker_pid")} if st else ():
                if pid:
                    try:
                        os.killpg(int(pid), signal.SIGKILL)
                    except with_suppressed:
                        pass
        time.sleep(0.5)
    return killed_at


def _most_at_once(trials: Path, since: float, until: float) -> int:
    """The most trial attempts that were submitted and not yet ended at the same moment in [since, until]."""
    edges = []
    for name in NAMES:
        start = None
        for ev in RunDir(trials / name).read_events():
            state = (ev.get("data") or {}).get("state") if ev["type"] == "state" else None
            if state == C.STATE_PENDING and since <= ev["time"] <= until:
                start = ev["time"]
            elif state in C.TERMINAL_STATES and start is not None:
                edges += [(start, 1), (min(ev["time"], until), -1)]
                start = None
        if start is not None:
            edges += [(start, 1), (until, -1)]
    most = now = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):
        now += delta
        most = max(most, now)
    return most
