"""A test double of the Kubernetes API paths kubetune uses. Not a Kubernetes API server.

No API server can run here, so the client tests point the real ``kubernetes`` client (through a generated
kubeconfig) at this small threaded HTTP server on 127.0.0.1. It speaks only the REST paths kubetune calls:

    /api/v1/namespaces/{ns}/{configmaps|services|persistentvolumeclaims|pods}[/{name}[/log|/exec]]
    /apis/batch/v1/namespaces/{ns}/jobs[/{name}]
    /apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs[/{name}]
    /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs[/{name}]
    /api/v1/namespaces[/{name}] (get and create), /api/v1/namespaces/{ns}/{serviceaccounts|secrets}[/{name}]
    /apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{roles|rolebindings}[/{name}]
    /apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues[/{name}]
    /apis/kaito.sh/v1beta1/namespaces/{ns}/workspaces[/{name}]
    /apis (discovery: the APIGroupList of the built-in groups and the installed CRDs' groups)
    /apis/{group}/{version} (discovery: the APIResourceList of a served group)
    /apis/authorization.k8s.io/v1/selfsubjectaccessreviews (create: allowed unless (verb, resource) is forbidden)
    /apis/{group}/{version}/{clusterqueues|clustertrainingruntimes}[/{name}] (cluster-scoped: get and list)

with create (POST), get and list (GET, equality label selectors), merge-patch (PATCH) and delete (DELETE,
with owner-reference garbage collection), bearer-token auth, and the API server's error shapes: 401, 403
(per verb and resource), 404 Status for objects and namespaces, a plain ``404 page not found`` for an API
group whose CRD is not installed, 409 AlreadyExists; ``exec`` speaks the channel.k8s.io websocket protocol
with whatever the test's ``exec_handler`` returns. It runs no controllers: a test plays the Job controller
and the kubelet by setting ``status`` and adding pods and their logs (``start_pods`` marks created pods
Running).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

CORE = "v1"
KNOWN = {
    (CORE, "configmaps"): "ConfigMap",
    (CORE, "services"): "Service",
    (CORE, "persistentvolumeclaims"): "PersistentVolumeClaim",
    (CORE, "pods"): "Pod",
    ("batch/v1", "jobs"): "Job",
    ("kubeflow.org/v1", "pytorchjobs"): "PyTorchJob",
    ("trainer.kubeflow.org/v1alpha1", "trainjobs"): "TrainJob",
    # what `kubetune cluster init` creates
    (CORE, "serviceaccounts"): "ServiceAccount",
    (CORE, "secrets"): "Secret",
    ("rbac.authorization.k8s.io/v1", "roles"): "Role",
    ("rbac.authorization.k8s.io/v1", "rolebindings"): "RoleBinding",
    ("kueue.x-k8s.io/v1beta1", "localqueues"): "LocalQueue",
    # what `kubetune cluster check` discovers
    ("kueue.x-k8s.io/v1beta1", "clusterqueues"): "ClusterQueue",
    ("kaito.sh/v1beta1", "workspaces"): "Workspace",
    ("trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes"): "ClusterTrainingRuntime",
    ("pipelines.kubeflow.org/v2beta1", "pipelines"): "Pipeline",
}
CRD_GROUPS = ("kubeflow.org/v1", "trainer.kubeflow.org/v1alpha1", "kueue.x-k8s.io/v1beta1")  # installed by default
OPTIONAL_GROUPS = ("kaito.sh/v1beta1", "pipelines.kubeflow.org/v2beta1")  # installed when a test names them in crds
BUILTIN_GROUPS = ("batch/v1", "rbac.authorization.k8s.io/v1", "authorization.k8s.io/v1")
_CLUSTER_SCOPED = {"clusterqueues", "clustertrainingruntimes"}
_CLUSTER_PATH = re.compile(r"^/apis/(?P<group>[^/]+/[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$")
_DISCOVERY = re.compile(r"^/apis(?:/(?P<group>[^/]+)/(?P<version>[^/]+))?/?$")
_SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_NAMESPACES = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+))?$")
_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+/[^/]+))/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?P<sub>/log|/exec)?)?$")
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class ApiServerDouble:
    """The double's state and controls.

    Args:
        token: the bearer token the kubeconfig carries; other tokens get 401.
        crds: API groups (``group/version``) whose CRDs are "installed".
        namespaces: namespaces that exist.
    """

    def __init__(self, *, token: str = "double-token", crds: tuple[str, ...] = CRD_GROUPS, namespaces: tuple[str, ...] = ("default", "team-a")):
        self.token = token
        self.crds = set(crds)
        self.namespaces = set(namespaces)
        self.forbidden: set[tuple[str, str]] = set()  # (verb, plural) answered with 403
        self.start_pods = False  # play the kubelet: pods created through the API report Running at once
        # (ns, pod, argv) -> (stdout, stderr, exit code): what `exec` into a pod runs
        self.exec_handler = None
        self.store: dict[tuple[str, str, str, str], dict] = {}  # (gv, plural, ns, name) -> object
        self.logs: dict[tuple[str, str, str], str] = {}  # (ns, pod, container) -> text
        self.requests: list[tuple[str, str]] = []  # (method, path?query)
        self.calls: set[tuple[str, str, str]] = set()  # (RBAC verb, API group, resource) of every authorized request
        self.reviews: list[tuple[str, str, str, str]] = []  # (verb, group, resource, namespace) of each SelfSubjectAccessReview
        self.discovery_forbidden: set[str] = set()  # group/version whose discovery document is answered with 403
        self.lock = threading.Lock()
        self._clock = itertools.count()
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "ApiServerDouble":
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path, *, namespace: str = "default", token: str | None = None) -> Path:
        """Write a kubeconfig whose current context points at this double."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token or self.token}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "tester", "namespace": namespace}}],
            "current-context": "double",
        }
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        return path

    # --- what a controller or kubelet would do -----------------------------------------------
    def get(self, gv: str, plural: str, ns: str, name: str) -> dict | None:
        with self.lock:
            obj = self.store.get((gv, plural, ns, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, gv: str, plural: str, ns: str) -> list[str]:
        with self.lock:
            return sorted(k[3] for k in self.store if k[:3] == (gv, plural, ns))

    def set_status(self, gv: str, plural: str, ns: str, name: str, status: dict) -> None:
        with self.lock:
            self.store[(gv, plural, ns, name)]["status"] = copy.deepcopy(status)

    def add_pod(self, ns: str, pod: dict, logs: dict[str, str] | None = None) -> dict:
        """Store a pod as the kubelet would report it (and the logs of its containers)."""
        pod = copy.deepcopy(pod)
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        md = pod["metadata"]
        md["namespace"] = ns
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("creationTimestamp", self._timestamp())
        with self.lock:
            self.store[(CORE, "pods", ns, md["name"])] = pod
            for container, text in (logs or {}).items():
                self.logs[(ns, md["name"], container)] = text
        return pod

    def add_object(self, gv: str, plural: str, ns: str, obj: dict) -> None:
        """Store an object some other installer created (the KFP API Service, a LocalQueue; ns "": cluster-scoped)."""
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {}).update(uid=str(uuid.uuid4()), creationTimestamp=self._timestamp(), **({"namespace": ns} if ns else {}))
        obj["apiVersion"], obj["kind"] = gv, KNOWN[(gv, plural)]
        with self.lock:
            self.store[(gv, plural, ns, obj["metadata"]["name"])] = obj

    def _timestamp(self) -> str:
        # distinct, increasing seconds: "newest first" is well defined even within one real second
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_700_000_000 + next(self._clock)))

    # --- request handling --------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, headers, body: bytes) -> tuple[int, str, bytes | list[bytes]]:
        self.requests.append((method, path + (("?" + "&".join(f"{k}={v[0]}" for k, v in query.items())) if query else "")))
        if headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if path == _SSAR and method == "POST":
            return self._review(json.loads(body or b"{}"))
        dm = _DISCOVERY.match(path)
        if dm and method == "GET":
            return self._discovery(dm.group("group"), dm.group("version"))
        nsm = _NAMESPACES.match(path)
        if nsm:
            return self._namespace(method, nsm.group("name"), body)
        m = _PATH.match(path)
        cm = None if m else _CLUSTER_PATH.match(path)
        if cm and method == "GET" and cm.group("plural") in _CLUSTER_SCOPED:
            return self._cluster_scoped(cm.group("group"), cm.group("plural"), cm.group("name"))
        if not m:
            return 404, "text/plain", b"404 page not found\n"
        gv = m.group("group") or CORE
        plural, ns, name = m.group("plural"), m.group("ns"), m.group("name")
        if gv in CRD_GROUPS + OPTIONAL_GROUPS and gv not in self.crds:
            return 404, "text/plain", b"404 page not found\n"  # what an API server says for an unknown group
        if (gv, plural) not in KNOWN:
            return 404, "text/plain", b"404 page not found\n"
        verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(method, "get" if name else "list")
        sub = m.group("sub") or ""
        resource = plural + sub
        self.calls.add((verb, gv.rpartition("/")[0], resource))
        if (verb, resource) in self.forbidden:
            return _status(403, "Forbidden", f'{resource} is forbidden: User "tester" cannot {verb} resource "{resource}" in API group "{gv.rpartition("/")[0]}" in the namespace "{ns}"')
        if ns not in self.namespaces:
            return _status(404, "NotFound", f'namespaces "{ns}" not found', details={"name": ns, "kind": "namespaces"})
        key = (gv, plural, ns, name)
        with self.lock:
            if sub == "/log":
                return self._log(ns, name, query)
            if sub == "/exec":
                if (CORE, "pods", ns, name) not in self.store:
                    return _not_found("pods", name)
                return 101, "exec", (ns, name, query.get("command", []))
            if method == "POST":
                return self._create(gv, plural, ns, json.loads(body or b"{}"))
            if method == "GET" and name:
                obj = self.store.get(key)
                return (200, "application/json", json.dumps(obj).encode()) if obj else _not_found(plural, name)
            if method == "GET":
                return self._list(gv, plural, ns, query.get("labelSelector", [""])[0])
            if method == "PATCH":
                obj = self.store.get(key)
                if not obj:
                    return _not_found(plural, name)
                patch = json.loads(body or b"{}")
                if not isinstance(patch, dict):
                    return _status(415, "UnsupportedMediaType", "the double applies merge patches only")
                self.store[key] = _merge(obj, patch)
                return 200, "application/json", json.dumps(self.store[key]).encode()
            if method == "DELETE":
                obj = self.store.get(key)
                if not obj:
                    return _not_found(plural, name)
                self._delete(key)
                return _status(200, "", "", status="Success", details={"name": name, "kind": plural})
        return _status(405, "MethodNotAllowed", method)

    def _served(self) -> list[str]:
        return [*BUILTIN_GROUPS, *(g for g in CRD_GROUPS + OPTIONAL_GROUPS if g in self.crds)]

    def _discovery(self, group: str | None, version: str | None):
        """``/apis``: the served groups; ``/apis/GROUP/VERSION``: that group's resources (404 when not served)."""
        self.calls.add(("get", "", "discovery"))
        if ("get", "discovery") in self.forbidden:
            return _status(403, "Forbidden", 'forbidden: User "tester" cannot get path "/apis"')
        if group is None:
            groups = []
            for gv in self._served():
                g, v = gv.split("/")
                entry = {"groupVersion": gv, "version": v}
                groups.append({"name": g, "versions": [entry], "preferredVersion": entry})
            return 200, "application/json", json.dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}).encode()
        gv = f"{group}/{version}"
        if gv not in self._served():
            return 404, "text/plain", b"404 page not found\n"
        if gv in self.discovery_forbidden:
            return _status(403, "Forbidden", f'forbidden: User "tester" cannot get path "/apis/{gv}"')
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": plural not in _CLUSTER_SCOPED, "kind": kind,
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
            for (g, plural), kind in KNOWN.items() if g == gv
        ]
        return 200, "application/json", json.dumps({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}).encode()

    def _cluster_scoped(self, gv: str, plural: str, name: str | None):
        """Get or list a cluster-scoped custom object (stored under namespace "")."""
        if gv in CRD_GROUPS + OPTIONAL_GROUPS and gv not in self.crds:
            return 404, "text/plain", b"404 page not found\n"
        verb = "get" if name else "list"
        self.calls.add((verb, gv.rpartition("/")[0], plural))
        if (verb, plural) in self.forbidden:
            return _status(403, "Forbidden", f'{plural} is forbidden: User "tester" cannot {verb} resource "{plural}" at the cluster scope')
        with self.lock:
            if name:
                obj = self.store.get((gv, plural, "", name))
                return (200, "application/json", json.dumps(obj).encode()) if obj else _not_found(plural, name)
            items = [o for (g, p, n, _), o in sorted(self.store.items()) if (g, p, n) == (gv, plural, "")]
        doc = {"apiVersion": gv, "kind": KNOWN[(gv, plural)] + "List", "metadata": {"resourceVersion": "1"}, "items": items}
        return 200, "application/json", json.dumps(doc).encode()

    def _review(self, review: dict):
        """A SelfSubjectAccessReview: allowed unless the test made (verb, resource[/subresource]) forbidden."""
        self.calls.add(("create", "authorization.k8s.io", "selfsubjectaccessreviews"))
        attrs = (review.get("spec") or {}).get("resourceAttributes") or {}
        resource = attrs.get("resource", "") + ("/" + attrs["subresource"] if attrs.get("subresource") else "")
        with self.lock:
            self.reviews.append((attrs.get("verb"), attrs.get("group", ""), resource, attrs.get("namespace")))
        allowed = (attrs.get("verb"), resource) not in self.forbidden
        doc = {**review, "status": {"allowed": allowed, **({} if allowed else {"reason": "RBAC: no rule allows it"})}}
        return 201, "application/json", json.dumps(doc).encode()

    def _namespace(self, method: str, name: str | None, body: bytes):
        """Namespaces are cluster-scoped: get one, or create one (POST to the collection)."""
        verb = "create" if method == "POST" else ("get" if name else "list")
        self.calls.add((verb, "", "namespaces"))
        if (verb, "namespaces") in self.forbidden:
            return _status(403, "Forbidden", f'namespaces is forbidden: User "tester" cannot {verb} resource "namespaces" in API group "" at the cluster scope')
        with self.lock:
            if method == "GET" and name:
                if name not in self.namespaces:
                    return _not_found("namespaces", name)
                doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}
                return 200, "application/json", json.dumps(doc).encode()
            if method == "POST" and not name:
                obj = json.loads(body or b"{}")
                new = obj.get("metadata", {}).get("name")
                if not new:
                    return _status(422, "Invalid", "Namespace is invalid: metadata.name: Required value")
                if new in self.namespaces:
                    return _status(409, "AlreadyExists", f'namespaces "{new}" already exists', details={"name": new, "kind": "namespaces"})
                self.namespaces.add(new)
                obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=self._timestamp())
                return 201, "application/json", json.dumps({**obj, "apiVersion": "v1", "kind": "Namespace"}).encode()
        return _status(405, "MethodNotAllowed", method)

    def _create(self, gv: str, plural: str, ns: str, obj: dict):
        name = obj.get("metadata", {}).get("name")
        if not name:
            return _status(422, "Invalid", f"{KNOWN[(gv, plural)]} is invalid: metadata.name: Required value")
        if (gv, plural, ns, name) in self.store:
            group = gv.rpartition("/")[0]
            return _status(409, "AlreadyExists", f'{plural}{"." + group if group else ""} "{name}" already exists', details={"name": name, "kind": plural})
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = gv, KNOWN[(gv, plural)]
        if plural == "secrets" and "stringData" in obj:  # what the API server stores: base64 data
            data = obj.setdefault("data", {})
            data.update({k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()})
        if plural == "pods" and self.start_pods:
            obj["status"] = {"phase": "Running", "containerStatuses": [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0, "state": {"running": {}}}
                for c in obj["spec"]["containers"]]}
        md = obj["metadata"]
        md.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=str(next(self._clock) + 1), creationTimestamp=self._timestamp())
        self.store[(gv, plural, ns, name)] = obj
        return 201, "application/json", json.dumps(obj).encode()

    def _list(self, gv: str, plural: str, ns: str, selector: str):
        want = [tuple(part.split("=", 1)) for part in selector.split(",") if part]
        items = [
            o
            for (g, p, n, _), o in sorted(self.store.items())
            if (g, p, n) == (gv, plural, ns) and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want)
        ]
        doc = {"apiVersion": gv, "kind": KNOWN[(gv, plural)] + "List", "metadata": {"resourceVersion": "1"}, "items": items}
        return 200, "application/json", json.dumps(doc).encode()

    def _delete(self, key) -> None:
        uid = self.store.pop(key)["metadata"]["uid"]
        for other in [k for k, o in self.store.items() if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]:
            if other in self.store:
                self._delete(other)  # what the garbage collector does for owned objects

    def _log(self, ns: str, pod: str, query: dict):
        if (CORE, "pods", ns, pod) not in self.store:
            return _not_found("pods", pod)
        container = query.get("container", [""])[0]
        text = self.logs.get((ns, pod, container))
        if text is None:
            return _status(400, "BadRequest", f'container "{container}" in pod "{pod}" is waiting to start: PodInitializing')
        lines = text.splitlines(keepends=True)
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"][0]) :]
        if query.get("follow", ["false"])[0] == "true":
            return 200, "text/plain", [line.encode() for line in lines]  # streamed line by line
        return 200, "text/plain", "".join(lines).encode()


def _status(code: int, reason: str, message: str, *, details: dict | None = None, status: str = "Failure"):
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status, "message": message, "reason": reason, "code": code}
    if details:
        doc["details"] = details
    return code, "application/json", json.dumps(doc).encode()


def _not_found(plural: str, name: str):
    return _status(404, "NotFound", f'{plural} "{name}" not found', details={"name": name, "kind": plural})


def _merge(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def _handler(double: ApiServerDouble):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a streamed log ends when the connection closes

        def log_message(self, *args):
            pass

        def _do(self):
            parts = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, ctype, payload = double.handle(self.command, parts.path, parse_qs(parts.query), self.headers, body)
            if code == 101:
                return self._exec(*payload)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            if isinstance(payload, list):
                self.end_headers()
                for chunk in payload:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    time.sleep(0.01)
                return
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _do

        def _exec(self, ns: str, pod: str, argv: list[str]) -> None:
            """The exec subresource as the API server speaks it: a websocket, one channel byte per frame."""
            key = self.headers.get("Sec-WebSocket-Key", "")
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            self.wfile.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n".encode()
            )
            stdout, stderr, code = double.exec_handler(ns, pod, argv) if double.exec_handler else (b"", b"no exec handler\n", 126)
            for channel, data in ((1, stdout), (2, stderr)):
                for i in range(0, len(data), 32768):
                    self.wfile.write(_frame(bytes([channel]) + data[i : i + 32768]))
            status = {"metadata": {}, "status": "Success"} if code == 0 else {
                "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
            self.wfile.write(_frame(b"\x03" + json.dumps(status).encode()))
            self.wfile.write(_frame(b"\x03\xe8", opcode=0x8))  # close, 1000
            self.wfile.flush()

    return Handler


def _frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One unmasked server-to-client websocket frame."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def make_pod(
    name: str,
    labels: dict,
    *,
    main: str,
    image: str = "ghcr.io/kubetune/kubetune:test",
    phase: str = "Running",
    init: list[tuple[str, dict]] | None = None,
    main_state: dict | None = None,
    conditions: list[dict] | None = None,
    annotations: dict | None = None,
    owner: dict | None = None,
    limits: dict | None = None,
    restarts: int = 0,
) -> dict:
    """A pod as the kubelet reports it: init containers (name, state) and the main container's state."""

    def status(cname: str, state: dict, ready: bool = False) -> dict:
        return {"name": cname, "image": image, "imageID": "", "ready": ready, "restartCount": restarts, "state": state}

    md: dict = {"name": name, "labels": labels}
    if annotations:
        md["annotations"] = annotations
    if owner:
        md["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    containers = [{"name": main, "image": image, **({"resources": {"limits": limits}} if limits else {})}]
    st: dict = {"phase": phase, "conditions": conditions or []}
    if init:
        st["initContainerStatuses"] = [status(n, s) for n, s in init]
    st["containerStatuses"] = [status(main, main_state or {"running": {"startedAt": "2023-11-14T22:13:20Z"}}, ready=phase == "Running")]
    return {"metadata": md, "spec": {"initContainers": [{"name": n, "image": image} for n, _ in init or []], "containers": containers}, "status": st}
