"""Shared fixtures. Every test session gets its own KUBETUNE_HOME, so the builtin model is generated
once per session and no test touches the user's cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CAPITALS = EXAMPLES / "data" / "capitals.jsonl"


@pytest.fixture(scope="session", autouse=True)
def kubetune_home(tmp_path_factory) -> Path:
    """An isolated KUBETUNE_HOME for the whole session (children inherit it through the environment)."""
    home = tmp_path_factory.mktemp("kubetune-home")
    old = os.environ.get("KUBETUNE_HOME")
    os.environ["KUBETUNE_HOME"] = str(home)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield home
    if old is None:
        os.environ.pop("KUBETUNE_HOME", None)
    else:
        os.environ["KUBETUNE_HOME"] = old


@pytest.fixture(scope="session")
def tiny_model(kubetune_home) -> Path:
    """The generated builtin://tiny-chat model directory."""
    from kubetune.training.builtin import materialize

    return materialize("tiny-chat")


@pytest.fixture
def capitals() -> Path:
    """The quickstart's conversational dataset (300 rows, messages format)."""
    return CAPITALS


@pytest.fixture
def tiny_job(tmp_path):
    """A factory for a small, fast job spec dict; keyword sections are merged in.

    Example: ``tiny_job(training={"max_steps": 4})`` -> dict for ``kubetune.load_spec``.
    """

    def make(**sections):
        spec = {
            "name": "tiny",
            "model": {"source": "builtin://tiny-chat"},
            "dataset": {"source": str(CAPITALS), "eval_split": 0.1},
            "method": {"type": "lora", "lora": {"r": 8, "alpha": 16}},
            "training": {"max_steps": 6, "batch_size": 8, "learning_rate": 3e-3, "max_seq_length": 128, "save_steps": 3, "logging_steps": 1},
            "output": {"dir": str(tmp_path / "run")},
        }
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        return spec

    return make


@pytest.fixture
def kubetune_cli():
    """The argv prefix that runs the kubetune CLI with this interpreter."""
    return [sys.executable, "-m", "kubetune.cli"]
