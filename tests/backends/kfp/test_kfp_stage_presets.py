"""Remote KFP runs upload local inputs and submit the job with their s3:// URIs: that derived job must still know
which fields its spec set, so that method presets keep following method.type (tests/test_spec_overrides.py)."""

from __future__ import annotations

from kubetune import load_spec
from kubetune import constants as C
from kubetune.backends.kfp.remote import stage_inputs


def test_kfp_staging_keeps_the_presets_unset(tmp_path, s3, monkeypatch, capitals):
    monkeypatch.setenv(C.ENV_KFP_S3_BUCKET, s3.bucket)
    job = load_spec({"name": "job", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(capitals)}})
    staged, uploads = stage_inputs(job, "id1")
    assert staged.dataset.source.startswith("s3://") and [u["field"] for u in uploads] == ["dataset.source"]
    assert staged.field_sources()["training.learning_rate"] == "preset lora"
    full = staged.with_overrides(["method.type=full"])
    assert full.training.learning_rate == 2e-5 and full.field_sources()["training.learning_rate"] == "preset full"
