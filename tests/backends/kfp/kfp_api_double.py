"""KfpApiDouble: an HTTP test DOUBLE of the KFP REST API v2beta1 paths kubetune uses. Not a KFP server.

A KFP server cannot run here (it needs a cluster, Argo and MySQL), so the remote path is checked against
this stand-in on 127.0.0.1, as DESIGN.md allows for cluster APIs. It answers only what the kfp SDK's
``kfp.Client`` sends for kubetune, checks the bearer token, records every request, and plays a scripted
sequence of run states:

    GET  /apis/v2beta1/healthz                   {"multi_user": false}
    GET  /apis/v2beta1/experiments?filter=...     the experiment with that display_name, or none
    POST /apis/v2beta1/experiments                creates one
    POST /apis/v2beta1/runs                       records the pipeline spec and parameters, state PENDING
    GET  /apis/v2beta1/runs/{id}                  the next scripted state, with task details
    POST /apis/v2beta1/runs/{id}:terminate        the run becomes CANCELED

Pod logs (kubetune logs) come from the Kubernetes API, doubled by :class:`PodLogDouble` on the one path
``GET /api/v1/namespaces/{ns}/pods/{pod}/log``.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

API = "/apis/v2beta1"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: dict | None
    headers: dict


@dataclass
class KfpApiDouble:
    """The double's state; ``url`` once started."""

    token: str | None = None
    states: list[str] = field(default_factory=lambda: ["PENDING", "RUNNING", "SUCCEEDED"])  # played per GET run
    failure: dict | None = None  # {"message": ..., "task": ...} attached when the state is FAILED
    create_run_error: tuple[int, str] | None = None  # (HTTP status, message) answered to POST runs
    multi_user: bool = False
    requests: list[Recorded] = field(default_factory=list)
    experiments: dict[str, dict] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)
    url: str = ""

    def calls(self, method: str, prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]

    # -- the API -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None, headers: dict) -> tuple[int, dict]:
        self.requests.append(Recorded(method, path, query, body, headers))
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"error": "Unauthorized", "code": 16, "message": "Unauthorized: invalid or missing bearer token"}
        if method == "GET" and path == f"{API}/healthz":
            return 200, {"commit_sha": "double", "multi_user": self.multi_user}
        if method == "GET" and path == f"{API}/experiments":
            wanted = None
            if "filter" in query:
                preds = json.loads(query["filter"][0]).get("predicates", [])
                wanted = next((p.get("stringValue") or p.get("string_value") for p in preds if p.get("key") == "display_name"), None)
            found = [e for e in self.experiments.values() if wanted is None or e["display_name"] == wanted]
            return 200, ({"experiments": found, "total_size": len(found)} if found else {})
        if method == "POST" and path == f"{API}/experiments":
            exp = {"experiment_id": str(uuid.uuid4()), "display_name": body["display_name"], "namespace": body.get("namespace")}
            self.experiments[exp["experiment_id"]] = exp
            return 200, exp
        if method == "POST" and path == f"{API}/runs":
            if self.create_run_error:
                status, message = self.create_run_error
                return status, {"error": message, "code": 3, "message": message}
            spec = body.get("pipeline_spec") or {}
            if "pipelineInfo" not in (spec.get("pipeline_spec") or spec):
                return 400, {"message": "pipeline_spec has no pipelineInfo", "code": 3}
            run_id = str(uuid.uuid4())
            self.runs[run_id] = {**body, "run_id": run_id, "state": "PENDING", "_played": 0}
            return 200, self._run_view(run_id)
        m = re.fullmatch(rf"{API}/runs/([^/:]+)(:terminate)?", path)
        if m and m.group(1) not in self.runs:
            return 404, {"message": f"run {m.group(1)} not found", "code": 5}
        if m and method == "POST" and m.group(2):
            self.runs[m.group(1)]["state"] = "CANCELED"
            self.runs[m.group(1)]["_terminated"] = True
            return 200, {}
        if m and method == "GET" and not m.group(2):
            run = self.runs[m.group(1)]
            if not run.get("_terminated"):
                run["state"] = self.states[min(run["_played"], len(self.states) - 1)]
                run["_played"] += 1
            return 200, self._run_view(m.group(1))
        return 404, {"message": f"the double does not serve {method} {path}", "code": 5}

    def _run_view(self, run_id: str) -> dict:
        run = self.runs[run_id]
        state = run["state"]
        order = ["fetch", "train", "merge", "publish"]
        step = {"PENDING": 0, "RUNNING": 2, "SUCCEEDED": 4, "FAILED": 2, "CANCELED": 1, "CANCELING": 1}.get(state, 0)
        tasks = []
        for i, name in enumerate(order[:step]):
            task_state = "SUCCEEDED" if i < step - 1 or state == "SUCCEEDED" else ("FAILED" if state == "FAILED" else "RUNNING")
            task = {"task_id": f"{run_id}-{name}", "display_name": name, "state": task_state, "pod_name": f"{name}-pod-{run_id[:6]}"}
            if task_state == "FAILED" and self.failure:
                task["error"] = {"code": 2, "message": self.failure.get("task_message", "")}
            tasks.append(task)
        view = {k: v for k, v in run.items() if not k.startswith("_")}
        view["run_details"] = {"task_details": tasks}
        if state == "FAILED" and self.failure and self.failure.get("message"):
            view["error"] = {"code": 2, "message": self.failure["message"]}
        return view

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "KfpApiDouble":
        self._server = _serve(self.handle)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class PodLogDouble:
    """A double of the Kubernetes API's pod-log path (the one call `kubetune logs` makes for a remote run)."""

    logs: dict[str, str] = field(default_factory=dict)  # pod name -> log text
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""

    def handle(self, method: str, path: str, query: dict, body: dict | None, headers: dict) -> tuple[int, object]:
        self.requests.append(Recorded(method, path, query, body, headers))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", path)
        if method == "GET" and m and m.group(2) in self.logs:
            return 200, self.logs[m.group(2)]
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f'pods "{m.group(2) if m else path}" not found'}

    def start(self) -> "PodLogDouble":
        self._server = _serve(self.handle)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _serve(handle) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _do(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, payload = handle(self.command, parts.path, parse_qs(parts.query), body, headers)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _do

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
