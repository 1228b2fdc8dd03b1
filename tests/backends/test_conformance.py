"""Every backend in the registry keeps the one protocol the Client relies on (backends/base.py).

A backend added to ``BACKENDS`` without a case here fails this test: each needs a way to run in the suite
(the local and KFP-local backends run the builtin tiny model for real; Kubernetes runs against the API
server double, since no cluster runs here; the fake backend is in memory).
"""

from __future__ import annotations

import time

import pytest

from kubetune import Client
from kubetune import constants as C
from kubetune.backends import BACKENDS, Backend, JobRef, get_backend
from kubetune.errors import JobNotFound
from kubetune.events import JobStatus
from kubetune.spec import load_spec

from .kubernetes.apiserver_double import ApiServerDouble


def _long_job(tiny_job, **sections):
    """A job that is still running when the test cancels it."""
    return load_spec(tiny_job(training={"max_steps": 5000, "save_steps": 1000}, **sections))


@pytest.fixture
def case(request, tiny_job, tmp_path):
    name = request.param
    if name == "fake":
        yield get_backend("fake", steps=2), _long_job(tiny_job)
    elif name == "local":
        yield get_backend("local"), _long_job(tiny_job)
    elif name == "kfp":
        yield get_backend("kfp"), _long_job(tiny_job, kfp={"mode": "local"})
    elif name == "kubernetes":
        double = ApiServerDouble().start()
        try:
            backend = get_backend("kubernetes", kubeconfig=str(double.kubeconfig(tmp_path / "kubeconfig")), cache_seconds=0)
            job = load_spec({"name": "conformance", "model": {"source": "builtin://tiny-chat"},
                             "dataset": {"source": "s3://datasets/capitals.jsonl"}, "training": {"max_steps": 5}})
            yield backend, job
        finally:
            double.stop()
    else:
        pytest.fail(f"backend '{name}' is registered but has no conformance case here: add one")


@pytest.mark.parametrize("case", sorted(BACKENDS), indirect=True)
def test_every_backend_keeps_the_protocol(case):
    backend, job = case
    assert isinstance(backend, Backend), f"{type(backend).__name__} lacks a protocol method"
    ref = backend.submit(job)
    try:
        assert isinstance(ref, JobRef) and ref.id and ref.backend == backend.name and ref.name == job.name
        assert backend.resolve(ref.id).id == ref.id
        assert backend.resolve(job.name).id == ref.id  # a name finds its newest submission
        assert ref.id in [r.id for r in backend.list()]
        st = backend.status(ref)
        assert isinstance(st, JobStatus) and st.state in (C.STATE_PENDING, C.STATE_RUNNING)
        assert all(isinstance(ev, dict) and "type" in ev for ev in backend.events(ref))
        assert all(isinstance(line, str) for line in backend.logs(ref))
        # the Client delegates ids and names to resolve, never guessing
        client = Client.__new__(Client)
        client.backend = backend
        assert client.status(ref.id).state in (C.STATE_PENDING, C.STATE_RUNNING, C.STATE_CANCELLED)
    finally:
        backend.cancel(ref)
    deadline = time.monotonic() + 60
    while not (st := backend.status(ref)).terminal and time.monotonic() < deadline:
        time.sleep(0.2)
    assert st.state == C.STATE_CANCELLED, st
    with pytest.raises(JobNotFound):
        backend.resolve("no-such-job-anywhere")


def test_fake_backend_runs_a_job_to_its_outcome(tiny_job):
    client = Client("fake", steps=3)
    ref = client.submit(tiny_job())
    st = client.wait(ref, timeout=5, poll=0)
    assert st.state == C.STATE_SUCCEEDED and st.step == 3 and st.loss == pytest.approx(0.25)
    assert [ev["type"] for ev in client.events(ref)].count("metrics") == 3
    failing = Client("fake", outcome=C.STATE_FAILED)
    st = failing.wait(failing.submit(tiny_job()), timeout=5, poll=0)
    assert st.state == C.STATE_FAILED and "told to fail" in st.reason
