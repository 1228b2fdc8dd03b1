"""Storage test fixtures: real servers from tests/_support/fixtures_servers.py, quick retries, a clean AWS env."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _support.fixtures_servers import *  # noqa: E402,F401,F403


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Short backoff (same number of attempts) so fault tests take seconds, not minutes."""
    from kubetune.storage import _common

    monkeypatch.setattr(_common, "RETRY", _common.RetryPolicy(base=0.02, cap=0.2))


@pytest.fixture(autouse=True)
def no_registry_env(monkeypatch, tmp_path):
    """No registry credentials leak in from the machine running the tests."""
    for name in ("KUBETUNE_REGISTRY_USERNAME", "KUBETUNE_REGISTRY_PASSWORD", "KUBETUNE_REGISTRY_PLAIN_HTTP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
