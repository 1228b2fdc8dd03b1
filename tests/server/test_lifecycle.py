"""A job's life on the jobs service beyond the happy path: cancel, pause and resume, the per-project limit with
its queue, pagination, and a server killed with SIGKILL mid-job and restarted on the same database."""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import wait_for, wait_for_step

pytestmark = pytest.mark.slow

LONG = {"method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}},
        "training": {"max_seq_length": 128, "max_steps": 400, "save_steps": 1000, "learning_rate": 3e-3, "batch_size": 2}}


def test_pause_resume_and_cancel(make_server, train_file):
    server = make_server(method_defaults={"supervised": LONG}).start()
    client = server.openai(server.key("alpha"))
    f = client.files.create(file=train_file.open("rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)
    lag = wait_for_step(client, job.id, 2)
    assert lag < 5  # progress reaches the database (and the API) within seconds, while the job runs

    paused = client.fine_tuning.jobs.pause(job.id)
    assert paused.status == "paused"
    saved = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert len(saved) == 1 and saved[0].step_number >= 2  # the pause saved where it stopped
    time.sleep(1.5)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "paused"  # the follower leaves it paused

    resumed = client.fine_tuning.jobs.resume(job.id)
    assert resumed.status in ("queued", "running")
    wait_for(client, job.id, ("running",))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
        if any(m.startswith("resuming from checkpoint-") for m in messages):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the resumed job did not resume from its checkpoint: {messages[:20]}")

    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
    time.sleep(1.5)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "cancelled"
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    assert "Fine-tuning job paused" in messages and "Fine-tuning job resumed" in messages and messages[0] == "Fine-tuning job cancelled"
    import openai

    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.resume(job.id)


def test_project_limit_queues_in_order_and_pages(make_server, train_file):
    server = make_server(method_defaults={"supervised": LONG}, max_running_jobs=1).start()
    alpha, beta = server.openai(server.key("alpha")), server.openai(server.key("beta"))
    f = alpha.files.create(file=train_file.open("rb"), purpose="fine-tune")
    jobs = [alpha.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id) for _ in range(3)]
    fb = beta.files.create(file=train_file.open("rb"), purpose="fine-tune")
    other = beta.fine_tuning.jobs.create(model="tiny-chat", training_file=fb.id)

    wait_for(alpha, jobs[0].id, ("running",))
    wait_for(beta, other.id, ("running",))  # another project's limit is its own
    time.sleep(1.5)
    assert [alpha.fine_tuning.jobs.retrieve(j.id).status for j in jobs] == ["running", "queued", "queued"]

    page = alpha.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in page.data] == [jobs[2].id, jobs[1].id] and page.has_more
    rest = alpha.fine_tuning.jobs.list(limit=2, after=jobs[1].id)
    assert [j.id for j in rest.data] == [jobs[0].id] and not rest.has_more

    alpha.fine_tuning.jobs.cancel(jobs[0].id)
    wait_for(alpha, jobs[1].id, ("running",), timeout=30)  # the oldest queued job starts next
    assert alpha.fine_tuning.jobs.retrieve(jobs[2].id).status == "queued"
    for j in (jobs[1], jobs[2]):
        assert alpha.fine_tuning.jobs.cancel(j.id).status == "cancelled"
    beta.fine_tuning.jobs.cancel(other.id)


def test_sigkill_mid_job_loses_nothing(make_server, train_file):
    steps = {"method": LONG["method"], "training": {**LONG["training"], "max_steps": 40, "save_steps": 10}}
    server = make_server(method_defaults={"supervised": steps}, max_running_jobs=1).start()
    key = server.key("alpha")
    client = server.openai(key)
    f = client.files.create(file=train_file.open("rb"), purpose="fine-tune")
    first = client.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)
    second = client.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)
    wait_for_step(client, first.id, 2)
    assert client.fine_tuning.jobs.retrieve(second.id).status == "queued"

    server.stop(signal.SIGKILL)  # no shutdown of any kind: the worker runs on alone
    time.sleep(2)
    server.start()
    client = server.openai(key)

    done = wait_for(client, first.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model and done.trained_tokens > 0 and done.finished_at
    events = client.fine_tuning.jobs.list_events(first.id, limit=100).data
    steps_seen = [e.data["step"] for e in events if e.type == "metrics"]
    assert sorted(steps_seen) == list(range(1, 41))  # every step, each exactly once, across the crash
    assert [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(first.id).data] == [40, 30, 20, 10]
    assert "job succeeded" in [e.message for e in events]

    after = wait_for(client, second.id, ("succeeded", "failed", "cancelled"))  # the queued one started after the restart
    assert after.status == "succeeded", after.error


def test_two_replicas_run_each_job_once_and_take_over(make_server, train_file):
    steps = {"method": LONG["method"], "training": {**LONG["training"], "max_steps": 30, "save_steps": 10}}
    first = make_server(method_defaults={"supervised": steps}).start()
    second = make_server(method_defaults={"supervised": steps}).start()  # same database, same data directory
    key = first.key("alpha")
    a, b = first.openai(key), second.openai(key)
    f = b.files.create(file=train_file.open("rb"), purpose="fine-tune")
    job = b.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)  # created through the replica
    wait_for_step(a, job.id, 2)
    time.sleep(2)  # both replicas have had turns of their runners
    started = [e for e in a.fine_tuning.jobs.list_events(job.id, limit=100).data if e.message == "Fine-tuning job started"]
    assert len(started) == 1  # submitted by one of them only

    first.stop(signal.SIGKILL)  # the leader (the first to start) dies: the replica takes over following the job
    done = wait_for(b, job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    steps_seen = [e.data["step"] for e in b.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "metrics"]
    assert sorted(steps_seen) == list(range(1, 31))
