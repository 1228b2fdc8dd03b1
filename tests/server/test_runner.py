"""The runner's one delicate moment: the server died after the backend started a job and before the database
recorded it. The next runner finds the submission in the job's run directory and re-attaches to it instead of
starting the job a second time."""

from __future__ import annotations

import json
import os

from kubetune.events import JobStatus, RunDir
from kubetune.server.config import ServerConfig
from kubetune.server.runner import Runner
from kubetune.server.store import Store


def test_a_submission_the_database_missed_is_reattached_not_repeated(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    config = ServerConfig(data_dir=tmp_path / "data")
    project = store.project("alpha")
    run = RunDir(tmp_path / "data" / "runs" / "ftjob-x")
    run.init()
    # what the local backend had written before the crash: a live worker (this test's own process) running the job
    run.write_status(JobStatus(state="running", job_id="ftjob-x-20260101", name="ftjob-x", backend="local", run_dir=str(run.path), pid=os.getpid()))
    spec = {"name": "ftjob-x", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(tmp_path / "none.jsonl")},
            "output": {"dir": str(run.path)}}
    store.add_job(id="ftjob-x", project_id=project["id"], kind="openai", model="tiny-chat", hyperparameters={}, method={}, spec=spec,
                  status="queued", backend="local", fine_tuned_model=None)

    Runner(store, config).tick()

    job = store.get_job(None, "ftjob-x")
    assert job["status"] == "running" and job["backend_ref"]["id"] == "ftjob-x-20260101"
    assert not run.worker_log.exists()  # no worker was started: nothing wrote a log header for a new one
    assert json.loads(run.status_file.read_text())["job_id"] == "ftjob-x-20260101"
    store.close()
