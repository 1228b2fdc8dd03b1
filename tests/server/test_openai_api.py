"""The jobs service through the official ``openai`` client, on SQLite and on PostgreSQL: upload, fine-tune
``tiny-chat``, follow it, read its events and checkpoints, chat with the result; and every error a client can
get (bad files, unknown models, wrong keys, another project's ids)."""

from __future__ import annotations

import shutil

import openai
import pytest

from .conftest import wait_for

pytestmark = pytest.mark.slow


def test_fine_tune_follow_and_chat(make_server, train_file):
    server = make_server().start()
    client = server.openai(server.key("alpha"))

    f = client.files.create(file=train_file.open("rb"), purpose="fine-tune")
    assert f.purpose == "fine-tune" and f.bytes == train_file.stat().st_size and f.filename == "train.jsonl"
    assert client.files.content(f.id).content == train_file.read_bytes()
    assert [x.id for x in client.files.list()] == [f.id]

    job = client.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id, suffix="caps", seed=7,
                                         method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1}}},
                                         metadata={"team": "geo"})
    assert job.status in ("validating_files", "queued", "running")
    assert job.hyperparameters.n_epochs == 1 and job.hyperparameters.batch_size == 8  # auto resolved and reported
    assert job.hyperparameters.learning_rate_multiplier == 1.0
    assert job.fine_tuned_model is None and job.metadata == {"team": "geo"} and job.seed == 7

    done = wait_for(client, job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:tiny-chat:caps:{job.id.removeprefix('ftjob-')}"
    assert done.finished_at >= done.created_at and done.trained_tokens > 0

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    messages = [e.message for e in events]
    assert messages[-1] == f"Created fine-tuning job: {job.id}"  # newest first
    metrics = [e for e in events if e.type == "metrics"]
    assert {e.data["step"] for e in metrics} == {1, 2, 3, 4} and all(e.data["train_loss"] > 0 for e in metrics)
    first_two = client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert first_two.has_more and len(first_two.data) == 2
    after = client.fine_tuning.jobs.list_events(job.id, limit=2, after=first_two.data[-1].id).data
    assert [e.id for e in after] == [e.id for e in events[2:4]]  # the cursor continues where the page ended

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == [4, 2]
    assert checkpoints[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-4"
    assert checkpoints[0].metrics.train_loss > 0

    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    reply = client.chat.completions.create(model=done.fine_tuned_model, messages=[{"role": "user", "content": "Capital of France?"}], max_tokens=4)
    assert reply.model == done.fine_tuned_model and reply.usage.completion_tokens >= 1

    # the job's history lives in the database: deleting its run directory loses none of it
    shutil.rmtree(server.data / "runs" / job.id)
    assert [e.id for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data] == [e.id for e in events]
    assert len(client.fine_tuning.jobs.checkpoints.list(job.id).data) == 2
    assert client.fine_tuning.jobs.retrieve(job.id).status == "succeeded"


def test_errors_are_openai_shaped(make_server, train_file, tmp_path):
    server = make_server().start()
    alpha = server.openai(server.key("alpha"))
    beta = server.openai(server.key("beta"))

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n{"prompt": 1\n', encoding="utf-8")
    with pytest.raises(openai.BadRequestError) as e:
        alpha.files.create(file=bad.open("rb"), purpose="fine-tune")
    assert "bad.jsonl:2" in e.value.message and e.value.code == "invalid_file_format" and e.value.param == "file"
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"question": "a", "answer": "b"}\n', encoding="utf-8")
    with pytest.raises(openai.BadRequestError) as e:
        alpha.files.create(file=wrong.open("rb"), purpose="fine-tune")
    assert "wrong.jsonl:1" in e.value.message and "matches no format" in e.value.message
    assert alpha.files.list().data == []  # nothing of a refused upload is kept

    f = alpha.files.create(file=train_file.open("rb"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError) as e:
        alpha.fine_tuning.jobs.create(model="gpt-9", training_file=f.id)
    assert e.value.code == "model_not_found" and "tiny-chat" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        alpha.fine_tuning.jobs.create(model="tiny-chat", training_file="file-nope")
    assert e.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as e:
        alpha.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id, hyperparameters={"n_epochs": 0})
    assert e.value.param == "hyperparameters.n_epochs"

    for key in ("kt-wrong", None):
        with pytest.raises(openai.AuthenticationError) as e:
            server.openai(key).files.list()
        assert e.value.code == "invalid_api_key" and e.value.body["type"] == "invalid_request_error"

    # another project's ids are answered as if they did not exist
    with pytest.raises(openai.NotFoundError):
        beta.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        beta.files.delete(f.id)
    with pytest.raises(openai.NotFoundError):
        beta.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)
    assert beta.files.list().data == []
    job = alpha.fine_tuning.jobs.create(model="tiny-chat", training_file=f.id)
    for call in (beta.fine_tuning.jobs.retrieve, beta.fine_tuning.jobs.cancel, beta.fine_tuning.jobs.list_events,
                 beta.fine_tuning.jobs.checkpoints.list):
        with pytest.raises(openai.NotFoundError):
            call(job.id)
    assert beta.fine_tuning.jobs.list().data == []
    alpha.fine_tuning.jobs.cancel(job.id)

    assert alpha.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        alpha.files.retrieve(f.id)
