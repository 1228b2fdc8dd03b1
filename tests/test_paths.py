"""Where kubetune keeps its files: caches in the XDG cache directory, registries and the server's database in the
XDG state directory (what cannot be made again does not belong where cache cleaners delete), and KUBETUNE_HOME
holding everything when set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBETUNE_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")}
    return {**env, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_STATE_HOME": str(tmp_path / "state")}


def _py(code: str, env: dict) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def test_registries_go_to_the_state_dir_and_caches_to_the_cache_dir(tmp_path):
    env = _env(tmp_path)
    code = (
        "from kubetune import paths; from kubetune.server.store import default_url; from kubetune.sweep.state import _registry; "
        "print(paths.home(), paths.jobs_dir(), _registry(), default_url(), sep='\\n')"
    )
    home, jobs, sweeps, db = _py(code, env).splitlines()
    assert home == str(tmp_path / "cache" / "kubetune")
    assert jobs == str(tmp_path / "state" / "kubetune" / "jobs")
    assert Path(sweeps).parent == tmp_path / "state" / "kubetune"
    assert db == f"sqlite:///{tmp_path / 'state' / 'kubetune' / 'server' / 'kubetune.db'}"
    without_xdg = {k: v for k, v in env.items() if k != "XDG_STATE_HOME"}
    assert _py("from kubetune import paths; print(paths.state_dir())", without_xdg) == str(tmp_path / "home" / ".local" / "state" / "kubetune")
    one_home = {**env, "KUBETUNE_HOME": str(tmp_path / "kt")}  # set: everything in it, as before
    assert _py("from kubetune import paths; print(paths.jobs_dir())", one_home) == str(tmp_path / "kt" / "jobs")


def test_an_older_registry_in_the_cache_is_moved_and_kubetune_list_still_shows_its_jobs(tmp_path, tiny_job):
    env = _env(tmp_path)
    old = tmp_path / "cache" / "kubetune" / "jobs"
    old.mkdir(parents=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"job_id": "tiny-20260101-000000-abcd", "name": "tiny", "state": "succeeded", "backend": "local",
                                                 "created_at": 1.0, "updated_at": 2.0}), encoding="utf-8")
    (old / "tiny-20260101-000000-abcd.json").write_text(json.dumps({"id": "tiny-20260101-000000-abcd", "run_dir": str(run), "name": "tiny"}), encoding="utf-8")
    listed = subprocess.run([sys.executable, "-m", "kubetune.cli", "list", "-o", "json"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [j["job_id"] for j in json.loads(listed.stdout)] == ["tiny-20260101-000000-abcd"]
    assert (tmp_path / "state" / "kubetune" / "jobs" / "tiny-20260101-000000-abcd.json").is_file() and not old.exists()
