"""The dashboard's routes in process (no browser, no training): the page and its assets (all local, none from a
CDN, all in the wheel), the jobs page filtered and searched on the server, one job with its spec, the live
stream's changes, and spec validation with each problem's field and line."""

from __future__ import annotations

import re
import time
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from kubetune.server.config import ServerConfig
from kubetune.server.dashboard import STATIC_DIR
from kubetune.server.dashboard.queries import changes_since, high_water
from kubetune.server.dashboard.validate import field_line
from kubetune.spec.reader import parse_spec_text
from kubetune.server.store import Store

from .conftest import CAPITALS

REPO = Path(__file__).resolve().parents[2]
SPEC = {"name": "x", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(CAPITALS)}}


@pytest.fixture
def app_and_key(tmp_path):
    from fastapi.testclient import TestClient

    from kubetune.server.app import create_app

    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    key, _ = store.create_key("alpha")
    other, _ = store.create_key("beta")
    alpha = store.authenticate(key)
    for i, status in enumerate(["succeeded", "failed", "cancelled"] * 4):
        store.add_job(id=f"job-{i:02d}", project_id=alpha["id"], kind="native", model="builtin://tiny-chat", hyperparameters={},
                      method={"type": "lora"}, spec={**SPEC, "name": f"run-{status}-{i}"}, status=status, backend="local", fine_tuned_model=None)
    store.add_events("job-00", [{"created_at": time.time(), "level": "info", "type": "metrics", "message": "step",
                                 "data": {"kubetune_type": "metrics", "step": s, "total_steps": 3, "loss": 3.0 - s}} for s in (1, 2, 3)])
    app = create_app(ServerConfig(data_dir=tmp_path / "data"), store)
    with TestClient(app) as http:
        yield http, {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {other}"}, store
    store.close()


def test_page_and_assets_are_served_locally_and_packaged(app_and_key):
    http, *_ = app_and_key
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert refs and all(r.startswith("/dashboard/") for r in refs), refs
    for ref in refs:
        assert http.get(ref).status_code == 200, ref
    for path in STATIC_DIR.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".js", ".css") and "vendor" not in path.parts:
            assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", path.read_text(encoding="utf-8")), f"{path.name} refers to the network"
    assert (STATIC_DIR / "vendor" / "uplot" / "LICENSE").is_file()
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kubetune"]
    for path in STATIC_DIR.rglob("*"):
        if path.is_file():
            rel = path.relative_to(REPO / "src" / "kubetune").as_posix()
            assert any(fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), f"{rel} is not in the wheel's package-data"


def test_jobs_page_filters_searches_and_pages_on_the_server(app_and_key):
    http, alpha, beta, _ = app_and_key
    assert http.get("/v1/dashboard/jobs").status_code == 401
    assert http.get("/v1/dashboard/jobs", headers={"Authorization": "Bearer kt-wrong"}).status_code == 401
    page = http.get("/v1/dashboard/jobs", params={"limit": 5}, headers=alpha).json()
    assert [j["id"] for j in page["data"]] == ["job-11", "job-10", "job-09", "job-08", "job-07"] and page["has_more"]
    rest = http.get("/v1/dashboard/jobs", params={"limit": 50, "after": "job-07"}, headers=alpha).json()
    assert len(rest["data"]) == 7 and not rest["has_more"]
    failed = http.get("/v1/dashboard/jobs", params={"status": "failed"}, headers=alpha).json()["data"]
    assert {j["status"] for j in failed} == {"failed"} and len(failed) == 4
    found = http.get("/v1/dashboard/jobs", params={"q": "RUN-CANCELLED-5"}, headers=alpha).json()["data"]
    assert [j["name"] for j in found] == ["run-cancelled-5"]
    assert http.get("/v1/dashboard/jobs", params={"q": "%"}, headers=alpha).json()["data"] == []  # LIKE's wildcards are literal
    first = http.get("/v1/dashboard/jobs/job-00", headers=alpha).json()
    assert first["progress"] == {"step": 3, "total_steps": 3, "loss": 0.0} and first["spark"] == [2.0, 1.0, 0.0]
    assert first["spec"]["name"] == "run-succeeded-0" and first["method"] == "lora"
    assert http.get("/v1/dashboard/jobs/job-00", headers=beta).status_code == 404  # another project's job
    assert http.get("/v1/dashboard/jobs", headers=beta).json()["data"] == []
    bad = http.get("/v1/dashboard/jobs", params={"status": "sleeping"}, headers=alpha)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "status"
    assert http.get("/v1/dashboard/jobs", params={"limit": 0}, headers=alpha).json()["error"]["param"] == "limit"


def test_stream_changes_are_the_projects_new_jobs_and_events(app_and_key):
    _, _, _, store = app_and_key
    jobs_at, events_at = high_water(store)
    alpha, beta = store.project("alpha"), store.project("beta")
    store.add_events("job-03", [{"created_at": time.time(), "level": "info", "type": "message", "message": "hello", "data": None}])
    store.add_job(id="job-new", project_id=alpha["id"], kind="native", model="m", hyperparameters={}, method={}, spec={},
                  status="succeeded", backend="local", fine_tuned_model=None)
    store.add_job(id="job-beta", project_id=beta["id"], kind="native", model="m", hyperparameters={}, method={}, spec={},
                  status="succeeded", backend="local", fine_tuned_model=None)
    changed, jobs_at2, events_at2 = changes_since(store, alpha["id"], jobs_at, events_at)
    assert [j["id"] for j in changed] == ["job-03", "job-new"]
    assert jobs_at2 == jobs_at + 1 and events_at2 == events_at + 1  # beta's job is not alpha's high-water mark
    assert changes_since(store, alpha["id"], jobs_at2, events_at2)[0] == []


def test_validate_names_the_field_and_its_line(app_and_key):
    http, alpha, *_ = app_and_key
    text = f"name: x\nmodel: {{source: builtin://tiny-chat}}\ndataset: {{source: {CAPITALS}}}\ntraining:\n  max_steps: many\n  learnin_rate: 1\n"
    r = http.post("/v1/jobs/validate", content=text, headers={**alpha, "Content-Type": "application/yaml"}).json()
    assert not r["valid"]
    assert {(e["field"], e["line"]) for e in r["errors"]} == {("training.max_steps", 5), ("training.learnin_rate", 6)}
    good = http.post("/v1/jobs/validate", content=text.replace("  max_steps: many\n  learnin_rate: 1\n", "  max_steps: 3\n"), headers=alpha).json()
    assert good["valid"] and good["errors"] == [] and good["spec"]["training"]["max_steps"] == 3
    broken = http.post("/v1/jobs/validate", content="name: [x\n", headers=alpha).json()
    assert not broken["valid"] and "not valid YAML" in broken["errors"][0]["message"] and broken["errors"][0]["line"]
    refused = http.post("/v1/jobs/validate", content="name: x\nentrypoint: {module: mine}\n", headers=alpha).json()
    assert [(e["field"], e["line"]) for e in refused["errors"]] == [("entrypoint", 2)]  # valid, but this server runs no client code
    assert http.post("/v1/jobs/validate", content=text).status_code == 401
    located = parse_spec_text("a:\n  b: 1\nmix:\n  - source: x\n    weight: 2\n", "spec")[1]
    assert field_line(located, "a.c") == 1 and field_line(located, "mix[0].weight") == 5 and field_line(located, "z") is None
