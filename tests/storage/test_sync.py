"""OutputSync: checkpoints mirrored while training, newest complete one pulled back, results published."""

from __future__ import annotations

import json
import os
import gc
import shutil
import time
from pathlib import Path

import httpx
import pytest
from kt_storage_util import make_tree, read_tree

from kubetune import constants as C
from kubetune.storage import OutputSync


def _checkpoint(run: Path, step: int, *, complete: bool = True, size: int = 2000) -> Path:
    d = run / C.CHECKPOINTS_DIR / f"checkpoint-{step}"
    make_tree(d, {
        "adapter_model.safetensors": os.urandom(size),
        "optimizer.pt": os.urandom(size),
        "trainer_state.json": json.dumps({"global_step": step}).encode(),
    })
    if complete:
        (d / C.CHECKPOINT_COMPLETE).write_text("ok")
    return d


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    make_tree(run, {
        "adapter/adapter_config.json": json.dumps({"base_model_name_or_path": "/cache/x", "r": 8}).encode(),
        "adapter/adapter_model.safetensors": os.urandom(3000),
        "adapter/README.md": b"readme",
        "merged/model.safetensors": os.urandom(4000),
        "merged/config.json": b"{}",
        C.RESULT_FILE: b'{"train_loss": 1.5}',
        C.SPEC_FILE: b"name: tiny\nmodel:\n  source: s3://models/tiny-chat\nmethod:\n  type: lora\n",
        C.EVENTS_FILE: b'{"type":"done"}\n',
        "logs/worker.log": b"log line\n",
    })
    return run


def _keys(s3) -> list[str]:
    return sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", []))


def test_s3_checkpoint_sync_marker_last_and_pull(s3, tmp_path, fault_proxy, monkeypatch):
    proxy = fault_proxy(s3.endpoint)  # an observer here: it records the order of requests
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    run = tmp_path / "run"
    events: list[dict] = []
    sync = OutputSync(s3.uri("exp/run1"), emit=events.append)
    ck = _checkpoint(run, 5)
    sync.checkpoint_saved(ck)
    sync.checkpoint_saved(_checkpoint(run, 9, complete=False))  # not complete: never synced
    assert sync.wait(30)
    puts = [p for m, p in proxy.seen if m == "PUT"]
    assert puts[-1].endswith(f"checkpoint-5/{C.CHECKPOINT_COMPLETE}") and len(puts) == 4  # the marker went last
    assert sync.synced == ["checkpoint-5"] and events[-1]["type"] == "checkpoint"

    # a remote checkpoint without its marker (an upload cut short) does not count
    s3.client.put_object(Bucket=s3.bucket, Key="exp/run1/checkpoints/checkpoint-7/optimizer.pt", Body=b"half")
    sync.close(10)

    fresh = tmp_path / "rerun" / C.CHECKPOINTS_DIR
    got = OutputSync(s3.uri("exp/run1")).pull_latest_checkpoint(fresh)
    assert got == fresh / "checkpoint-5"
    assert read_tree(got) == read_tree(ck)
    assert [p.name for p in fresh.iterdir()] == ["checkpoint-5"]  # no scratch left behind


def test_pull_prefers_newer_local_and_returns_none_when_empty(s3, tmp_path):
    sync = OutputSync(s3.uri("empty/run"))
    assert sync.pull_latest_checkpoint(tmp_path / "ck") is None
    run = tmp_path / "run"
    sync.checkpoint_saved(_checkpoint(run, 3))
    sync.close(30)
    local = _checkpoint(tmp_path / "other", 8)
    assert OutputSync(s3.uri("empty/run")).pull_latest_checkpoint(local.parent) == local


def test_checkpoint_saved_never_blocks_and_drops_superseded(s3, tmp_path, fault_proxy, monkeypatch):
    proxy = fault_proxy(s3.endpoint)
    proxy.slow_seconds = 2.0
    proxy.fail(1000, "slow", when=lambda m, p: m == "PUT")  # a slow network: each PUT takes two seconds
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    events: list[dict] = []
    sync = OutputSync(s3.uri("slow/run"), emit=events.append)
    run = tmp_path / "run"
    waits = []
    gc.disable()  # a full collection in a big test process is not the network; keep it out of the timing
    try:
        for step in (1, 2, 3, 4, 5):
            ck = _checkpoint(run, step)
            t = time.monotonic()
            sync.checkpoint_saved(ck)
            waits.append(time.monotonic() - t)
            shutil.rmtree(ck)  # training rotates checkpoints away: the hard-linked snapshot must survive
            if step == 1:  # let the new worker thread take checkpoint-1 (a loaded machine may start it late)
                deadline = time.monotonic() + 30
                while sync._queue and time.monotonic() < deadline:
                    time.sleep(0.01)
    finally:
        gc.enable()
    assert max(waits) < proxy.slow_seconds / 2, waits  # training never waits for the network (a PUT takes 2 s)
    sync.close(60)
    assert sync.synced[0] == "checkpoint-1" and sync.synced[-1] == "checkpoint-5"
    assert len(sync.synced) < 5  # some waiting ones were superseded...
    skipped = [e for e in events if e["type"] == "warning" and "skipped" in e["message"]]
    assert len(skipped) == 5 - len(sync.synced)  # ...and each drop was reported
    remote = {k.split("/")[3] for k in _keys(s3) if k.endswith(C.CHECKPOINT_COMPLETE)}
    assert remote == set(sync.synced)
    assert not (run / C.STORAGE_SYNC_DIR / "checkpoint-5").exists()  # snapshots cleaned up


def test_keep_prunes_oldest_remote_checkpoints(s3, tmp_path):
    sync = OutputSync(s3.uri("keep/run"), keep=2)
    run = tmp_path / "run"
    for step in (10, 20, 30):
        sync.checkpoint_saved(_checkpoint(run, step))
        assert sync.wait(30)
    sync.close(10)
    names = {k.split("/")[3] for k in _keys(s3)}
    assert names == {"checkpoint-20", "checkpoint-30"}


def test_background_failure_does_not_raise(tmp_path, monkeypatch, s3):
    from _support.fixtures_servers import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    events: list[dict] = []
    sync = OutputSync(s3.uri("x"), emit=events.append)
    sync.checkpoint_saved(_checkpoint(tmp_path / "run", 1))
    sync.close(30)
    assert sync.synced == [] and len(sync.errors) == 1 and "cannot reach" in sync.errors[0]
    assert events[-1]["type"] == "warning" and "checkpoint-1" in events[-1]["message"]


def test_s3_publish_layout_done_last(s3, tmp_path, fault_proxy, monkeypatch):
    proxy = fault_proxy(s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    run = _run_dir(tmp_path)
    sync = OutputSync(s3.uri("pub/run"))
    sync.publish(run)
    sync.close(5)
    keys = _keys(s3)
    assert "pub/run/adapter/adapter_model.safetensors" in keys and "pub/run/merged/model.safetensors" in keys
    assert {"pub/run/result.json", "pub/run/spec.yaml", "pub/run/events.jsonl", "pub/run/logs/worker.log", "pub/run/DONE"} <= set(keys)
    puts = [p for m, p in proxy.seen if m == "PUT"]
    assert puts[-1].endswith("/pub/run/DONE")


def test_file_uri_sync_and_publish(tmp_path):
    remote = tmp_path / "remote"
    sync = OutputSync(f"file://{remote}")
    sync.checkpoint_saved(_checkpoint(tmp_path / "run", 4))
    run = _run_dir(tmp_path)
    sync.publish(run)
    sync.close(5)
    assert (remote / "checkpoints/checkpoint-4" / C.CHECKPOINT_COMPLETE).is_file()
    assert read_tree(remote / "adapter") == read_tree(run / "adapter") and (remote / "DONE").is_file()
    got = OutputSync(f"file://{remote}").pull_latest_checkpoint(tmp_path / "new")
    assert got.name == "checkpoint-4" and (got / C.CHECKPOINT_COMPLETE).is_file()


def test_oci_publish_adapter_artifact_and_checkpoints(oci_registry, tmp_path):
    host = oci_registry.host
    sync = OutputSync(f"oci://{host}/tuned/tiny-adapter:v1")
    assert sync.pull_latest_checkpoint(tmp_path / "none") is None
    ck = _checkpoint(tmp_path / "run", 6)
    sync.checkpoint_saved(ck)
    sync.checkpoint_saved(_checkpoint(tmp_path / "run", 12))
    run = _run_dir(tmp_path)
    sync.publish(run)
    sync.close(10)

    accept = {"Accept": C.OCI_MEDIA_MANIFEST}
    m = httpx.get(f"http://{host}/v2/tuned/tiny-adapter/manifests/v1", headers=accept).json()
    media = {lay["annotations"][C.OCI_ANNOTATION_TITLE]: lay["mediaType"] for lay in m["layers"]}
    assert media == {"adapter_config.json": C.OCI_MEDIA_ADAPTER_CONFIG, "adapter_model.safetensors": C.OCI_MEDIA_ADAPTER_WEIGHTS}
    assert m["artifactType"] == C.OCI_ARTIFACT_ADAPTER and m["config"]["mediaType"] == C.OCI_MEDIA_RUN_CONFIG
    assert m["annotations"][C.OCI_ANNOTATION_BASE_MODEL] == "s3://models/tiny-chat"
    assert m["annotations"][C.OCI_ANNOTATION_METHOD] == "lora"
    config = httpx.get(f"http://{host}/v2/tuned/tiny-adapter/blobs/{m['config']['digest']}").json()
    assert config["result"] == {"train_loss": 1.5} and config["base_model"] == "s3://models/tiny-chat"

    tags = httpx.get(f"http://{host}/v2/tuned/tiny-adapter/tags/list").json()["tags"]
    assert {"v1", "v1-merged", "v1-run", "v1-checkpoint-6", "v1-checkpoint-12"} <= set(tags)

    pulled = OutputSync(f"oci://{host}/tuned/tiny-adapter:v1").pull_latest_checkpoint(tmp_path / "resume")
    assert pulled.name == "checkpoint-12" and (pulled / C.CHECKPOINT_COMPLETE).is_file()

    from kubetune.storage import fetch

    adapter = fetch(f"oci://{host}/tuned/tiny-adapter:v1", tmp_path / "adapter")
    assert read_tree(adapter) == {k: v for k, v in read_tree(run / "adapter").items() if k != "README.md"}


def test_bad_uri_rejected():
    from kubetune.errors import SourceError

    with pytest.raises(SourceError, match="must be hf://, s3://, oci:// or file://"):
        OutputSync("https://example.com/out")
