"""``kubetune cluster init``: what a team namespace needs for kubetune (docs/cluster-setup.md).

The objects: the Namespace, a ServiceAccount, a Role with the least rules kubetune's flavours use
(:data:`RBAC_RULES`, the same rules as deploy/rbac.yaml; a test keeps the two identical), a RoleBinding of the
ServiceAccount to it, optionally a Kueue LocalQueue pointing at a ClusterQueue, and only when asked, Secrets
whose values come from environment variables or files.

Secret values never leave this process except in the API request that creates them: :func:`plan` keeps
them out of the objects it renders (a render lists Secrets as ``kubectl create secret`` commands that read
the same variables and files), and nothing prints them.

Applying is create-or-leave-alone: an object that exists is reported ``unchanged`` and never overwritten.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BackendError, SpecError
from .api import Cluster, api_call

__all__ = ["RBAC_RULES", "SecretSource", "Plan", "plan", "parse_secret", "renderable", "apply", "KUEUE_API_VERSION"]

# What kubetune run/status/logs/cancel/list/download call with --backend kubernetes, for every flavour.
# deploy/rbac.yaml holds the same rules (tests/backends/kubernetes/test_k8s_deploy.py checks both against the calls).
RBAC_RULES: list[dict] = [
    {"apiGroups": [""], "resources": ["configmaps", "services", "persistentvolumeclaims"], "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "patch", "delete"]},
    {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create", "get", "list", "patch", "delete"]},
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["create", "get", "list", "patch", "delete"]},
    {"apiGroups": ["kaito.sh"], "resources": ["workspaces"], "verbs": ["create", "get", "list", "patch", "delete"]},
]
ROLE_NAME = "kubetune"
DEFAULT_SERVICE_ACCOUNT = "kubetune"
DEFAULT_QUEUE = "kubetune"
# v1beta1: served by every Kueue release (v0.19 serves v1beta2 too and stores that; v1beta1 is deprecated there, still served).
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta1"
_MANAGED = {"app.kubernetes.io/managed-by": "kubetune"}
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass
class SecretSource:
    """A Secret to create: its name and, per key, where the value comes from (``env`` or ``file``)."""

    name: str
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> ("env", VAR) | ("file", path)

    def values(self) -> dict[str, str]:
        """Read the values (only when applying). Raises SpecError for an unset variable or a missing file."""
        out = {}
        for key, (kind, where) in self.keys.items():
            if kind == "env":
                if where not in os.environ:
                    raise SpecError(f"Secret {self.name}: environment variable {where} is not set", hint=f"export {where}=... first")
                out[key] = os.environ[where]
            else:
                try:
                    out[key] = Path(where).expanduser().read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as e:
                    raise SpecError(f"Secret {self.name}: cannot read {where}: {e.strerror or e}", hint="name a readable text file") from None
        return out

    def kubectl_hint(self, namespace: str) -> str:
        """The ``kubectl create secret`` command that creates this Secret from the same variables and files."""
        parts = ["kubectl", "create", "secret", "generic", self.name, "-n", namespace]
        cmd = " ".join(shlex.quote(p) for p in parts)
        for key, (kind, where) in self.keys.items():
            if kind == "env":
                cmd += f' --from-literal={shlex.quote(key)}="${where}"'
            else:
                cmd += " " + shlex.quote(f"--from-file={key}={where}")
        return cmd


def parse_secret(value: str, *, from_files: bool = False) -> SecretSource:
    """``NAME=ENVVAR[,ENVVAR...]`` (keys named as the variables) or, with from_files, ``NAME=PATH[,PATH...]``
    (keys named as the files); ``KEY:ENVVAR`` / ``KEY:PATH`` names a key otherwise."""
    flag = "--secret-file" if from_files else "--secret"
    name, sep, rest = value.partition("=")
    name = name.strip()
    if not sep or not rest.strip():
        example = "hf-token=token:./hf_token.txt" if from_files else "s3-credentials=AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY"
        raise SpecError(f"{flag} '{value}' is not NAME={'PATH' if from_files else 'ENVVAR'}[,...]", hint=f"e.g. {flag} {example}")
    _check_name(name, "Secret name")
    src = SecretSource(name)
    for item in (p.strip() for p in rest.split(",")):
        if not item:
            continue
        key, colon, where = item.partition(":")
        if not colon:
            where = item
            key = Path(item).name if from_files else item
        if not from_files and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", where):
            raise SpecError(f"{flag} {name}: '{where}' is not an environment variable name", hint="the value is read from that variable, never given on the command line")
        if not _KEY_RE.match(key) or len(key) > 253:
            raise SpecError(f"{flag} {name}: '{key}' is not a valid Secret key (letters, digits, '-', '_', '.')")
        if key in src.keys:
            raise SpecError(f"{flag} {name}: key {key} given twice")
        src.keys[key] = ("file" if from_files else "env", where)
    return src


@dataclass
class Plan:
    """What ``cluster init`` makes: the objects (Secrets without their values) and the Secrets' sources."""

    namespace: str
    service_account: str
    queue: str | None
    objects: list[dict]
    secrets: list[SecretSource]

    def spec_hint(self) -> str:
        """The ``kubernetes:`` section of a job spec that uses what this plan creates."""
        lines = ["kubernetes:", f"  namespace: {self.namespace}", f"  service_account: {self.service_account}"]
        if self.queue:
            lines.append(f"  queue: {self.queue}")
        if self.secrets:
            lines.append("  secrets:")
            hf = next((s for s in self.secrets if any(k in ("HF_TOKEN", "token") for k in s.keys)), None)
            s3 = next((s for s in self.secrets if "AWS_ACCESS_KEY_ID" in s.keys and "AWS_SECRET_ACCESS_KEY" in s.keys), None)
            if hf:
                key = "HF_TOKEN" if "HF_TOKEN" in hf.keys else "token"
                lines.append(f"    hf_token: {{secret: {hf.name}, key: {key}}}")
            if s3:
                lines.append(f"    s3: {{secret: {s3.name}}}")
            rest = [s for s in self.secrets if s is not hf and s is not s3]
            if rest:
                lines.append("    env:")
                lines += [f"      - {{var: {k}, secret: {s.name}, key: {k}}}" for s in rest for k in s.keys]
        return "\n".join(lines)


def _check_name(name: str, what: str, *, label: bool = False) -> None:
    ok = (_LABEL_RE if label else _NAME_RE).match(name) and len(name) <= (63 if label else 253)
    if not ok:
        raise SpecError(f"'{name}' is not a valid {what}: lowercase letters, digits and '-'" + (", at most 63 characters" if label else ""))


def plan(
    namespace: str,
    *,
    service_account: str = DEFAULT_SERVICE_ACCOUNT,
    cluster_queue: str | None = None,
    queue: str = DEFAULT_QUEUE,
    secrets: list[SecretSource] | None = None,
) -> Plan:
    """The objects a team namespace needs, in the order they are created. Secrets carry their keys' names only."""
    _check_name(namespace, "namespace", label=True)
    _check_name(service_account, "ServiceAccount name")
    secrets = list(secrets or [])
    names = [s.name for s in secrets]
    if len(set(names)) != len(names):
        raise SpecError(f"a Secret is named twice: {sorted(n for n in set(names) if names.count(n) > 1)}", hint="give each --secret one NAME")

    def meta(name: str, ns: bool = True) -> dict:
        return {"name": name, **({"namespace": namespace} if ns else {}), "labels": dict(_MANAGED)}

    binding = f"{ROLE_NAME}-{service_account}"
    objects: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(namespace, ns=False)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(service_account)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(ROLE_NAME), "rules": copy.deepcopy(RBAC_RULES)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(binding),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]
    if cluster_queue:
        _check_name(cluster_queue, "ClusterQueue name")
        _check_name(queue, "LocalQueue name", label=True)
        objects.append({"apiVersion": KUEUE_API_VERSION, "kind": "LocalQueue", "metadata": meta(queue), "spec": {"clusterQueue": cluster_queue}})
    for s in secrets:
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta(s.name), "type": "Opaque"})
    return Plan(namespace, service_account, queue if cluster_queue else None, objects, secrets)


def renderable(p: Plan) -> list[dict]:
    """The objects a render prints: everything but the Secrets (their values are never printed; see :meth:`SecretSource.kubectl_hint`)."""
    return [o for o in p.objects if o["kind"] != "Secret"]


# kind -> (API, read method, create method, RBAC resource, namespaced)
_CORE_CALLS = {
    "Namespace": ("core", "read_namespace", "create_namespace", "namespaces", False),
    "ServiceAccount": ("core", "read_namespaced_service_account", "create_namespaced_service_account", "serviceaccounts", True),
    "Secret": ("core", "read_namespaced_secret", "create_namespaced_secret", "secrets", True),
    "Role": ("rbac", "read_namespaced_role", "create_namespaced_role", "roles", True),
    "RoleBinding": ("rbac", "read_namespaced_role_binding", "create_namespaced_role_binding", "rolebindings", True),
}


def apply(cluster: Cluster, p: Plan, echo) -> list[tuple[str, str]]:
    """Create what is missing, leave alone what exists; ``echo`` gets one line per object.

    Returns:
        (``kind/name``, ``created`` | ``unchanged``) per object.

    Raises:
        BackendError: 401, 403 (with what the caller may not do), an unreachable server, Kueue not installed.
        SpecError: a Secret's variable is unset or its file unreadable (checked before anything is created).
    """
    values = {s.name: s.values() for s in p.secrets}  # every value read first: a missing one creates nothing
    results = []
    for obj in p.objects:
        body = copy.deepcopy(obj)
        if obj["kind"] == "Secret":
            body["stringData"] = values[obj["metadata"]["name"]]
        outcome = _ensure(cluster, p.namespace, body)
        what = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        results.append((what, outcome))
        echo(f"{what} {outcome}")
    return results


def _ensure(cluster: Cluster, namespace: str, obj: dict) -> str:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "LocalQueue":
        group, version = KUEUE_API_VERSION.split("/")
        api, resource = cluster.custom(), "localqueues"

        def read():
            return api.get_namespaced_custom_object(group, version, namespace, resource, name)

        def create():
            return api.create_namespaced_custom_object(group, version, namespace, resource, obj)
    else:
        which, read_m, create_m, resource, namespaced = _CORE_CALLS[kind]
        api = cluster.core() if which == "core" else _rbac(cluster)

        def read():
            return getattr(api, read_m)(name, namespace) if namespaced else getattr(api, read_m)(name)

        def create():
            return getattr(api, create_m)(namespace, obj) if namespaced else getattr(api, create_m)(obj)

    try:
        with _call(cluster, "get", resource, namespace, name, kind):
            read()
        return "unchanged"
    except _Forbidden:
        if kind == "Namespace":  # a namespace admin who may not read namespaces: the namespaced calls tell if it is missing
            return "not checked (you may not read namespaces; assumed to exist)"
        raise
    except BackendError as e:
        if getattr(e.__cause__, "status", None) != 404:
            raise
        if kind == "LocalQueue" and not _is_status(e.__cause__):
            raise BackendError(
                f"the cluster has no LocalQueue kind ({KUEUE_API_VERSION}): Kueue is not installed",
                hint="install Kueue (https://kueue.sigs.k8s.io/docs/installation/), or leave out --queue",
            ) from None
    try:
        with _call(cluster, "create", resource, namespace, name, kind):
            create()
    except BackendError as e:
        if "already exists" in str(e):  # created meanwhile by someone else: still left alone
            return "unchanged"
        raise
    return "created"


def _rbac(cluster: Cluster):
    from kubernetes import client

    return client.RbacAuthorizationV1Api(cluster.api)


def _is_status(exc) -> bool:
    try:
        return json.loads(getattr(exc, "body", None) or "").get("kind") == "Status"
    except (TypeError, ValueError, AttributeError):
        return False


class _Forbidden(BackendError):
    """A 403 while setting a namespace up."""


class _call:
    """:func:`api_call`, with a 403's advice for setting a namespace up (an admin's job) instead of running jobs."""

    def __init__(self, cluster: Cluster, verb: str, resource: str, namespace: str, name: str, kind: str) -> None:
        self._cm = api_call(cluster, verb, resource, namespace=namespace, name=name, kind=kind)
        self.verb, self.resource, self.namespace = verb, resource, namespace

    def __enter__(self):
        return self._cm.__enter__()

    def __exit__(self, *exc):
        try:
            return self._cm.__exit__(*exc)
        except BackendError as e:
            if str(e).startswith("forbidden:"):
                where = "cluster-wide" if self.resource == "namespaces" else f"in namespace '{self.namespace}'"
                raise _Forbidden(
                    f"forbidden: you may not {self.verb} {self.resource} {where} (RBAC)",
                    hint="setting up a namespace needs its admin (or a cluster admin for a new namespace): run it as one, "
                    f"or hand them the output of `kubetune cluster init --namespace {self.namespace} --render`",
                ) from e.__cause__
            raise

