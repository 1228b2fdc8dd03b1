"""KFP backend fixtures: the KFP API double, a clean environment, and the shared loopback servers (S3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests/ folder

from _support.fixtures_servers import *  # noqa: E402,F401,F403

from .kfp_api_double import KfpApiDouble, PodLogDouble  # noqa: E402


@pytest.fixture(autouse=True)
def clean_kfp_env(monkeypatch, tmp_path):
    """No KFP endpoint, token, bucket or kubeconfig leaks in from the machine running the tests."""
    for name in ("KF_PIPELINES_ENDPOINT", "KF_PIPELINES_UI_ENDPOINT", "KUBETUNE_KFP_TOKEN", "KFP_S3_BUCKET",
                 "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME", "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))


@pytest.fixture
def kfp_api():
    """The KFP API double (see kfp_api_double.py), started on 127.0.0.1."""
    double = KfpApiDouble().start()
    yield double
    double.stop()


@pytest.fixture
def pod_logs():
    """The Kubernetes pod-log double, started on 127.0.0.1."""
    double = PodLogDouble().start()
    yield double
    double.stop()
