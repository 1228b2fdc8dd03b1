"""The jobs service on the kfp backend: an OpenAI fine-tuning job runs as a real KFP local pipeline
(SubprocessRunner: fetch -> train -> publish) started by ``kubetune server --backend kfp``, followed to the end,
and its model served by the same server. Everything is real: the server in its own process, the official
``openai`` client, the KFP SDK's local runner."""

from __future__ import annotations

import pytest

from .conftest import CAPITALS, Server, wait_for

pytestmark = pytest.mark.slow


def test_an_openai_job_runs_as_a_local_kfp_pipeline_and_its_model_is_served(tmp_path):
    server = Server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}", backend="kfp").start()
    try:
        client = server.openai(server.key("alpha"))
        upload = client.files.create(file=CAPITALS.open("rb"), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="tiny-chat", training_file=upload.id, suffix="pipeline")
        finished = wait_for(client, job.id, ("succeeded", "failed", "cancelled"), timeout=300)
        assert finished.status == "succeeded", (finished.error, server.log.read_text()[-3000:])
        assert finished.fine_tuned_model.startswith("ft:tiny-chat:pipeline:")
        events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
        assert any(e.type == "metrics" and (e.data or {}).get("train_loss") for e in events)
        assert sorted(c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data) == [2, 4]
        run_dir = next((server.data / "runs").glob(f"{job.id}*"))
        assert list((run_dir / "kfp").glob("kubetune-*/train")), "the job ran as a KFP pipeline (its tasks' folders)"
        reply = client.chat.completions.create(model=finished.fine_tuned_model, messages=[{"role": "user", "content": "Capital of France?"}],
                                               max_tokens=8, temperature=0)
        assert reply.model == finished.fine_tuned_model and reply.choices[0].message.content
    finally:
        server.stop()
        server.kill_workers()
