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


# --- a failed test leaves no worker behind ------------------------------------------------------------
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (``item.rep_call``), for the fixture below."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _session_workers(home: Path) -> set[int]:
    """Pids of kubetune workers and launchers started by this test session (their KUBETUNE_HOME is its home)."""
    found: set[int] = set()
    want = f"KUBETUNE_HOME={home}".encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"kubetune.worker" not in cmdline and b"kubetune.launch" not in cmdline:
                continue
            if want in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


@pytest.fixture(autouse=True)
def _no_worker_outlives_a_failed_test(request, kubetune_home):
    """A test that fails or times out while its detached job still trains would leave that worker running (it
    has its own session) and slow every later test on a small machine: such workers are killed with their
    process group. Passing tests are left alone (they clean up after themselves)."""
    import signal

    before = _session_workers(kubetune_home)
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed:
        return
    for pid in _session_workers(kubetune_home) - before:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
