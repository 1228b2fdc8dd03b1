"""``kubetune llama-stack config``: the run config llama-stack starts from (the e2e tests start real servers on it;
these check what a user reads and the mistakes they make), without importing llama-stack or torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def _cli(*args: str, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked) +
            "from kubetune.cli import main\nsys.argv = ['kubetune', *sys.argv[1:]]\nmain()\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_inline_config_names_the_provider_its_specs_and_the_backend(tmp_path):
    out = _cli("llama-stack", "config", "--backend", "kfp", "--mode", "local", "-m", "llama3=hf://meta-llama/Llama-3.2-1B-Instruct",
               "--default-model", "llama3", "--store-dir", str(tmp_path), blocked=("torch", "llama_stack"))
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["apis"] == ["datasetio", "post_training"] and cfg["server"]["host"] == "127.0.0.1"
    (pt,) = cfg["providers"]["post_training"]
    assert pt["provider_type"] == "inline::kubetune"
    assert pt["config"]["backend"] == "kfp" and pt["config"]["mode"] == "local" and pt["config"]["default_model"] == "llama3"
    assert pt["config"]["models"] == {"llama3": "hf://meta-llama/Llama-3.2-1B-Instruct"}
    specs = Path(cfg["external_providers_dir"])
    inline = yaml.safe_load((specs / "inline" / "post_training" / "kubetune.yaml").read_text())
    remote = yaml.safe_load((specs / "remote" / "post_training" / "kubetune.yaml").read_text())
    assert inline["module"] == "kubetune.integrations.llama_stack.inline" and remote["adapter"]["module"] == "kubetune.integrations.llama_stack.remote"
    assert cfg["metadata_store"]["db_path"] == str(tmp_path / "registry.db")


def test_remote_config_references_the_key_and_mistakes_are_one_message(tmp_path):
    out = _cli("llama-stack", "config", "--provider", "remote", "--url", "https://kubetune.example.com", "--api-key-env", "TEAM_KEY",
               "-o", str(tmp_path / "sub" / "run.yaml"))
    assert out.returncode == 0 and "llama stack run" in out.stderr
    (pt,) = yaml.safe_load((tmp_path / "sub" / "run.yaml").read_text())["providers"]["post_training"]
    assert pt == {"provider_id": "kubetune", "provider_type": "remote::kubetune",
                  "config": {"url": "https://kubetune.example.com", "api_key": "${env.TEAM_KEY:}", "timeout_seconds": 120.0}}
    for args, message in ((["--model", "llama3"], "--model 'llama3': expected NAME=SOURCE"),
                          (["--provider", "cloud"], "--provider 'cloud': expected inline or remote"),
                          (["--backend", "slurm"], "--backend: Input should be 'local', 'kubernetes' or 'kfp'")):
        bad = _cli("llama-stack", "config", *args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
