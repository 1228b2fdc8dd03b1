"""Writing to the Hugging Face Hub: ``kubetune push DIR hf://...`` and ``output.uri: hf://ORG/NAME``, against an HTTP
test double of the Hub's API paths (tests/_support/hub_double.py: no Hub is reachable here), driven by the real
huggingface_hub client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared helpers
from _support.hub_double import HubDouble  # noqa: E402

from kubetune import constants as C  # noqa: E402

TOKEN = "hf_ktWRITEtoken0000000000"


@pytest.fixture
def hub(monkeypatch):
    double = HubDouble(TOKEN).start()
    monkeypatch.setenv("HF_ENDPOINT", double.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub.constants as hc  # read once at import by huggingface_hub: this process may have imported it offline

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "ENDPOINT", double.url)
    yield double
    double.stop()


def test_push_a_folder_is_one_commit_to_a_new_private_repo(hub, tmp_path, kubetune_cli):
    src = tmp_path / "adapter"
    (src / "nested").mkdir(parents=True)
    (src / "adapter_config.json").write_text('{"r": 8}')
    (src / "nested" / "notes.txt").write_text("n")
    out = subprocess.run([*kubetune_cli, "push", str(src), "hf://kt-org/my-adapter"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert hub.private["kt-org/my-adapter"] is True  # created private: publishing is the owner's call
    assert hub.repos["kt-org/my-adapter"]["main"] == {"adapter_config.json": b'{"r": 8}', "nested/notes.txt": b"n"}
    assert len(hub.commits) == 1 and TOKEN not in out.stdout + out.stderr
    # into a folder of the repository, and a wrong token is one clear error
    subprocess.run([*kubetune_cli, "push", str(src / "adapter_config.json"), "hf://kt-org/my-adapter/configs/a.json"], check=True,
                   capture_output=True, timeout=120)
    assert hub.repos["kt-org/my-adapter"]["main"]["configs/a.json"] == b'{"r": 8}'
    bad = subprocess.run([*kubetune_cli, "push", str(src), "hf://kt-org/other"], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "HF_TOKEN": "hf_wrong"})
    assert bad.returncode == 2 and "hf://kt-org/other: the Hub refused to create the repository (401)" in bad.stderr
    assert "HF_TOKEN" in bad.stderr and "Traceback" not in bad.stderr and "hf_wrong" not in bad.stderr


def test_output_uri_on_the_hub_gets_checkpoints_then_the_results(hub, tmp_path, tiny_job, kubetune_cli):
    spec = tiny_job(output={"dir": str(tmp_path / "run"), "uri": "hf://kt-org/capitals@exp", "merge": True})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run([*kubetune_cli, "run", str(path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    files = hub.repos["kt-org/capitals"]["exp"]  # the branch, made from main
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(files)  # the adapter at the top: PeftModel.from_pretrained(repo)
    assert "merged/config.json" in files and any(f.startswith("merged/") and f.endswith(".safetensors") for f in files)
    result = json.loads(files["kubetune/result.json"])
    assert result["global_step"] == 6 and result == json.loads((tmp_path / "run" / C.RESULT_FILE).read_bytes())
    card = files["README.md"].decode()
    assert card.startswith("---\nlibrary_name: peft\ntags:\n- kubetune\n- lora\n---") and "| train_loss |" in card
    # checkpoints went up while it trained, each in one commit with its marker; the results last, in one commit
    kinds = [summary for _, branch, summary, _ in hub.commits if branch == "exp"]
    assert kinds[:2] == ["kubetune: checkpoint-3", "kubetune: checkpoint-6"] and kinds[-1] == "kubetune: lora results"
    assert f"checkpoints/checkpoint-6/{C.CHECKPOINT_COMPLETE}" in files
    assert hub.repos["kt-org/capitals"]["main"] == {}  # main untouched
    assert TOKEN.encode() not in b"".join(files.values())


def test_deliver_to_the_hub_is_verified_file_by_file(hub, tmp_path, kubetune_cli):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "weights.bin").write_bytes(bytes(range(256)) * 64)
    out = subprocess.run([*kubetune_cli, "deliver", str(src), "hf://kt-org/delivered/v1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verified 2 file(s)" in out.stdout + out.stderr
    assert set(hub.repos["kt-org/delivered"]["main"]) == {"v1/config.json", "v1/weights.bin"}

    from kubetune.errors import SourceError
    from kubetune.storage.hf_push import verify
    from kubetune.storage.uri import parse_uri

    hub.repos["kt-org/delivered"]["main"]["v1/weights.bin"] = b"x" * (256 * 64)  # same size, other bytes
    with pytest.raises(SourceError, match="verification failed for 'weights.bin': its checksum differs"):
        verify(parse_uri("hf://kt-org/delivered/v1"), {"config.json": src / "config.json", "weights.bin": src / "weights.bin"})
