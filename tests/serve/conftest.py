"""Fixtures of the serving tests: two LoRA adapters with different random weights, a run directory, and
live servers on 127.0.0.1 (uvicorn in a thread) that the official ``openai`` client talks to."""

from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared real servers
from _support.fixtures_servers import s3, s3_server  # noqa: E402,F401  (moto's S3 server, for s3:// sources)

REPO = Path(__file__).resolve().parents[2]
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"
API_KEY = "test-key-123"


def make_adapter(base_dir: Path, out: Path, *, seed: int, r: int = 8, scale: float = 0.3, modules_to_save: list[str] | None = None) -> Path:
    """A LoRA adapter on ``base_dir`` whose B matrices are random (a fresh adapter is a no-op: B=0).

    ``modules_to_save`` are saved whole in the adapter and perturbed too, tied like kubetune trains them.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    extra = {"modules_to_save": modules_to_save, "ensure_weight_tying": True} if modules_to_save else {}
    with torch.random.fork_rng():  # PEFT draws the A matrices from the global generator: the same adapter whatever ran before
        torch.manual_seed(seed)
        model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM", **extra))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            elif "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale / 3)
    model.save_pretrained(out)
    return out


def make_run(run_dir: Path, adapter: Path, *, name: str) -> Path:
    """A finished LoRA run directory: spec.yaml naming the builtin base model, adapter/ with its tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    from kubetune.spec import dump_spec, load_spec
    from kubetune.training.builtin import materialize

    job = load_spec({"name": name, "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(CAPITALS)}, "output": {"dir": str(run_dir)}})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.yaml").write_text(dump_spec(job), encoding="utf-8")
    shutil.copytree(adapter, run_dir / "adapter")
    AutoTokenizer.from_pretrained(materialize("tiny-chat")).save_pretrained(run_dir / "adapter")
    (run_dir / "DONE").write_text("")
    return run_dir


@dataclass
class Artifacts:
    base: Path  # the builtin tiny model directory
    alpha: Path  # adapter directory
    beta: Path  # adapter directory
    run: Path  # a run directory whose adapter is alpha


@pytest.fixture(scope="session")
def artifacts(tiny_model, tmp_path_factory) -> Artifacts:
    root = tmp_path_factory.mktemp("serve-artifacts")
    alpha = make_adapter(tiny_model, root / "alpha", seed=1)
    beta = make_adapter(tiny_model, root / "beta", seed=2)
    run = make_run(root / "runs" / "capitals-bot", alpha, name="capitals-bot")
    return Artifacts(base=tiny_model, alpha=alpha, beta=beta, run=run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving a kubetune app on 127.0.0.1 in a background thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "unused", **kw):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def async_client(self, api_key: str = "unused"):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=300)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(source: str, adapters: dict[str, str] | None = None, **options) -> LiveServer:
    from kubetune.serve.app import create_app
    from kubetune.serve.options import ServeOptions
    from kubetune.serve.sources import resolve_sources

    plan = resolve_sources(source, adapters or {})
    return LiveServer(create_app(plan, ServeOptions(**options)))


@pytest.fixture(scope="session")
def server(artifacts) -> LiveServer:
    """The run (its adapter is model 'capitals-bot' on base 'tiny-chat') plus adapter 'beta'."""
    s = start_server(str(artifacts.run), {"beta": str(artifacts.beta)}, max_model_len=512)
    yield s
    s.close()


@pytest.fixture(scope="session")
def keyed_server(artifacts) -> LiveServer:
    """The base model alone, with an API key."""
    s = start_server("builtin://tiny-chat", api_key=API_KEY)
    yield s
    s.close()


def spec_file(tmp_path: Path, **sections) -> Path:
    """A job spec YAML for render-serve tests."""
    spec = {"name": "support-bot", "model": {"source": "hf://Qwen/Qwen2.5-0.5B-Instruct"}, "dataset": {"source": "s3://data/chats.jsonl"}}
    for k, v in sections.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) and isinstance(spec.get(k), dict) else v
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path
