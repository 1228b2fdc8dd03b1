"""The pod every flavour runs: inputs, volumes, env, resources, the worker command. Pure functions.

The flavours (``flavors.py``) place these parts into a batch/v1 Job, a PyTorchJob or a TrainJob; they never
build containers themselves, so the three renders agree on paths, env and commands by construction.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from ... import constants as C
from ...errors import SpecError
from ...redact import find_credentials, has_credentials
from ...spec import TuneJob, spec_to_dict
from ...spec.cluster import K8S_QUANTITY_RE
from .staging import is_local, staged_uri

__all__ = [
    "Input",
    "cluster_inputs",
    "worker_args",
    "worker_command",
    "default_image",
    "shipped_image",
    "object_labels",
    "pod_labels",
    "env_vars",
    "env_from",
    "resources",
    "volumes",
    "volume_mounts",
    "init_containers",
    "pod_scheduling",
    "pod_security_context",
    "container_security_context",
    "names",
    "refuse_credentials",
    "entrypoint_code",
    "entrypoint_file_name",
]

# An extended resource name: a domain, a slash, a name (nvidia.com/gpu, habana.ai/gaudi, nvidia.com/mig-1g.10gb).
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# What replaces a credential in a URI once it must reach a cluster: a Secret reference, or a staged copy.
CREDENTIALS_HINT = (
    "a spec that runs on a cluster is visible to anyone who can read its objects, so credentials never travel in it: "
    "remove them from the URI and reference a Secret instead: S3 keys with kubernetes.secrets.s3, a Hugging Face token "
    "with kubernetes.secrets.hf_token, a registry login with kubernetes.secrets.env (vars KUBETUNE_REGISTRY_USERNAME and "
    "KUBETUNE_REGISTRY_PASSWORD); an http(s) file behind a password or a signed URL: fetch it here "
    "(kubetune fetch URI DIR) and name the local copy, which kubetune run uploads to {staging}"
)


def _input_fields(job: TuneJob) -> list[tuple[str, str, str | None, str | None]]:
    """(spec field, role, directory in the pod, value) of every model and dataset source (and dataset.preprocess's
    code, which the worker fetches itself: no directory); none for an entrypoint job."""
    if job.entrypoint is not None:  # the user's function fetches what it needs itself
        return []
    d = job.dataset
    fields = [
        ("model.source", "model", C.K8S_MODEL_DIR, job.model.source),
        ("dataset.source", "data", C.K8S_DATA_DIR, d.source),
        ("dataset.eval_source", "eval", C.K8S_EVAL_DIR, d.eval_source),
    ]
    if job.method.objective == "dpo" and job.method.dpo.reference:  # a full DPO fine-tune's frozen reference model
        fields.append(("method.dpo.reference", "reference", f"{C.K8S_WORKSPACE}/reference", job.method.dpo.reference))
    for i, extra in enumerate(getattr(d, "mix", None) or []):  # more datasets trained together with source
        fields.append((f"dataset.mix.{i}.source", f"mix-{i}", f"{C.K8S_WORKSPACE}/mix-{i}", extra.source))
    if getattr(d, "preprocess", None) is not None:  # no init container: the worker fetches the code (a local file: staged)
        fields.append(("dataset.preprocess.file", "preprocess", None, d.preprocess.file))
    return fields


@dataclass(frozen=True)
class Input:
    """One model or dataset the pod needs.

    Attributes:
        field: the spec field, e.g. ``dataset.source``.
        role: ``model``, ``data`` or ``eval`` (the staging sub-folder and the init container's name).
        uri: what the cluster fetches (a staged s3:// URI for a local path).
        dest: the directory inside the pod, or None when the worker resolves the URI itself (builtin://).
        local: the local path that must be uploaded to ``uri`` first, if any.
        initializer: Kubeflow Trainer's initializer fetches it (trainjob flavour), not kubetune.
        in_spec: the field is a list item, which ``--set`` cannot address: the spec file in the ConfigMap
            carries the pod path instead.
    """

    field: str
    role: str
    uri: str
    dest: str | None
    local: str | None = None
    initializer: bool = False
    in_spec: bool = False


def names(job: TuneJob) -> dict[str, str]:
    """Object names: every one is an RFC 1035 label (job names are at most 40 characters)."""
    ws = job.kubernetes.workspace
    return {
        "workload": job.name,
        "configmap": f"{job.name}-spec",
        "service": job.name,
        "pvc": ws.claim_name or f"{job.name}-workspace",
    }


def cluster_inputs(job: TuneJob) -> list[Input]:
    """The model and datasets as the cluster sees them.

    Raises:
        SpecError: a local path without ``kubernetes.staging_uri``, or a URI that embeds credentials.
    """
    out = []
    for field, role, dest, value in _input_fields(job):
        if value is None:
            continue
        _refuse_credentials(field, value)
        listed = any(part.isdigit() for part in field.split("."))
        if value.startswith(f"{C.BUILTIN_SCHEME}://"):
            out.append(Input(field, role, value, None))
        elif is_local(value):
            if not job.kubernetes.staging_uri:
                raise SpecError(
                    f"{field} is a local path ({value}) that a cluster pod cannot read",
                    hint="set kubernetes.staging_uri: s3://bucket/prefix (kubetune run uploads it there), "
                    "or use a URI the cluster can fetch (s3://, hf://, https://, oci://)",
                )
            out.append(Input(field, role, staged_uri(job, role, value), dest, local=value, in_spec=listed))
        else:
            uri = job.model.pinned_source if field == "model.source" else value  # revision wins over @REV
            out.append(Input(field, role, uri, dest, in_spec=listed))
    return out


def _refuse_credentials(field: str, value: str) -> None:
    if has_credentials(value):
        raise SpecError(
            f"{field} carries credentials in its URI; they would be visible in the rendered objects",
            hint=CREDENTIALS_HINT.format(staging="kubernetes.staging_uri"),
        )


def refuse_credentials(job: TuneJob, *, staging: str = "kubernetes.staging_uri", extra: dict[str, str] | None = None) -> None:
    """Refuse a job whose spec holds a credential anywhere (a URI's user-info or token parameter, a bearer token):
    every field of it ends up in a rendered object, a ConfigMap or a compiled pipeline.

    Args:
        staging: the field that names where local copies are uploaded (for the hint).
        extra: more values that will be rendered, by the name to show (``--adapter NAME``).

    Raises:
        SpecError: naming every such field (never its value).
    """
    fields = find_credentials(spec_to_dict(job))
    fields += [name for name, value in (extra or {}).items() if has_credentials(value)]
    if fields:
        raise SpecError(
            f"{', '.join(fields)}: credentials in the spec (user:password@ or a token in a URI) would be visible in the "
            "rendered objects",
            hint=CREDENTIALS_HINT.format(staging=staging),
        )


def worker_args(job: TuneJob, inputs: list[Input]) -> list[str]:
    """Arguments of ``kubetune worker`` / ``-m kubetune.worker`` inside the pod."""
    args = ["--spec", C.K8S_SPEC_PATH]
    for inp in inputs:
        if inp.dest is not None and not inp.in_spec:
            args += ["--set", f"{inp.field}={inp.dest}"]
            if inp.field == "model.source" and job.model.revision:
                args += ["--set", "model.revision=null"]  # the revision was fetched; the local copy has none
    if job.entrypoint is not None and job.entrypoint.module is None:  # the function's source, mounted from the ConfigMap
        args += ["--set", f"entrypoint.file={C.K8S_SPEC_DIR}/{entrypoint_file_name(job)}"]
    args += ["--set", f"output.dir={C.K8S_OUTPUT_DIR}"]
    return args


_CODE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$")  # a ConfigMap key that is also a plain Python file name


def entrypoint_file_name(job: TuneJob) -> str:
    """The name the function's source travels under (ConfigMap key, file in the pod or KFP task): ``entrypoint.file``'s
    own name (``train.py``) where it is a plain Python file name, else ``entrypoint.py``."""
    e = job.entrypoint
    name = e.file.replace("\\", "/").rsplit("/", 1)[-1] if e is not None and e.file else ""
    return name if _CODE_NAME_RE.match(name) and name != C.K8S_SPEC_KEY else C.K8S_ENTRYPOINT_KEY


def entrypoint_code(job: TuneJob) -> str | None:
    """The source an entrypoint job ships in its spec ConfigMap (``entrypoint.file``'s text or ``entrypoint.source``);
    None for a built-in job or an ``entrypoint.module`` (that one must be in the image).

    Raises:
        SpecError: the file cannot be read, is not UTF-8, or is too big for a ConfigMap.
    """
    e = job.entrypoint
    if e is None or e.module is not None:
        return None
    if e.source is not None:
        return e.source
    from pathlib import Path

    path = Path(e.file).expanduser()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SpecError(f"entrypoint.file: cannot read {path}: {err.strerror or err}",
                        hint="relative paths resolve against the current directory, then the spec file's") from None
    if len(data) > C.ENTRYPOINT_MAX_FILE_BYTES:
        raise SpecError(f"entrypoint.file: {path} is {len(data)} bytes, more than the {C.ENTRYPOINT_MAX_FILE_BYTES} a ConfigMap carries here",
                        hint="keep the training code in an image and name it with entrypoint.module")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"entrypoint.file: {path} is not UTF-8 text") from None


def _with_packages(job: TuneJob, command: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """``entrypoint.packages``: pip installs them in the main container, then execs the worker command unchanged."""
    packages = job.entrypoint.packages if job.entrypoint is not None else []
    if not packages:
        return command, args
    import shlex

    script = f"{C.K8S_PIP_INSTALL} {' '.join(shlex.quote(p) for p in packages)} && exec \"$@\""
    return ["sh", "-c", script, "kubetune-worker"], [*command, *args]  # sh -c SCRIPT $0 ARGS...: "$@" is the worker


LAUNCHER = ["python", "-m", "kubetune.launch"]  # torchrun, plus the job's reason and timeouts (launch.py)


def worker_command(job: TuneJob, inputs: list[Input], *, launcher: str) -> tuple[list[str], list[str]]:
    """(command, args) of the main container.

    Args:
        launcher: ``static``: torchrun gets node rank and master from this pod's env (plain Job);
            ``operator``: the operator injects PET_NODE_RANK/PET_MASTER_ADDR/PET_MASTER_PORT, which torchrun reads.

    Several processes start through ``python -m kubetune.launch``, kubetune's drop-in for ``torchrun``
    (same arguments): it names the first failing rank in the job's reason, applies the spec's rendezvous
    timeout, and its ranks die with it.
    """
    r = job.resources
    wargs = worker_args(job, inputs)
    if r.world_size == 1:
        return _with_packages(job, ["kubetune", "worker"], wargs)
    if r.nodes == 1:
        return _with_packages(job, LAUNCHER, ["--standalone", "--nnodes=1", f"--nproc-per-node={r.processes_per_node}", "-m", "kubetune.worker", *wargs])
    head = [f"--nnodes={r.nodes}", f"--nproc-per-node={r.processes_per_node}"]
    if launcher == "static":
        head += ["--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    return _with_packages(job, LAUNCHER, [*head, "-m", "kubetune.worker", *wargs])


def shipped_image(job: TuneJob) -> str | None:
    """The kubetune image of this version for the job's accelerators (-cuda for nvidia.com, -rocm for amd.com,
    -gaudi for habana.ai), None where none ships."""
    from ..._version import __version__

    r = job.resources
    if r.accelerators == 0:
        return f"{C.K8S_IMAGE_REPO}:{__version__}"
    for prefix, suffix in C.K8S_ACCELERATOR_TAG_SUFFIXES.items():
        if r.accelerator_type.startswith(prefix):
            return f"{C.K8S_IMAGE_REPO}:{__version__}{suffix}"
    return None


def default_image(job: TuneJob) -> str:
    """The worker image: the spec's, else the kubetune image of this version for its accelerators (:func:`shipped_image`).

    Raises:
        SpecError: accelerators other than NVIDIA's and no ``kubernetes.image``.
    """
    image = job.kubernetes.image or shipped_image(job)
    if image is None:
        raise SpecError(
            f"kubernetes.image: kubetune ships no image for {job.resources.accelerator_type}",
            hint="build one from deploy/Dockerfile with your vendor's PyTorch base image (--build-arg BASE_IMAGE=... "
            "--build-arg INSTALL_TORCH=0) and set kubernetes.image; see docs/accelerators.md",
        )
    return image


def object_labels(job: TuneJob, flavor: str, run_id: str | None, *, workload: bool = False) -> dict[str, str]:
    """Labels of every rendered object (the workload also carries the Kueue queue)."""
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_JOB: job.name, C.LABEL_FLAVOR: flavor}
    if run_id:
        labels[C.LABEL_RUN_ID] = run_id
    labels.update(job.kubernetes.labels)
    if workload and job.kubernetes.queue:
        labels[C.LABEL_KUEUE_QUEUE] = job.kubernetes.queue
    return labels


def pod_labels(job: TuneJob, flavor: str, run_id: str | None) -> dict[str, str]:
    """Labels of the pods (how logs and diagnosis find them)."""
    return object_labels(job, flavor, run_id)


def env_vars(job: TuneJob, *, topology: list[dict] | None = None, main: bool = True) -> list[dict]:
    """The container env: kubetune's, the topology's, the user's plain values, then Secret references.

    Raises:
        SpecError: a variable is both a plain value and a Secret reference.
    """
    k = job.kubernetes
    plain: dict[str, str] = {C.ENV_HOME: C.K8S_HOME_DIR, "HF_HOME": C.K8S_HF_HOME, "PYTHONUNBUFFERED": "1"}
    if main:
        plain = {C.ENV_EVENT_STDOUT: "1", C.ENV_JOB_ID: job.name, **plain}
    env = [{"name": n, "value": v} for n, v in plain.items() if n not in k.env]
    env += topology or []
    env += [{"name": n, "value": v} for n, v in k.env.items()]
    secret_env = _secret_env(job)
    clash = {e["name"] for e in env} & {e["name"] for e in secret_env}
    if clash:
        raise SpecError(f"kubernetes.env and kubernetes.secrets both set {', '.join(sorted(clash))}", hint="keep one of them")
    return env + secret_env


def _secret_env(job: TuneJob) -> list[dict]:
    s = job.kubernetes.secrets

    def ref(var: str, secret: str, key: str, optional: bool = False) -> dict:
        sel = {"name": secret, "key": key}
        if optional:
            sel["optional"] = True
        return {"name": var, "valueFrom": {"secretKeyRef": sel}}

    out = []
    if s.hf_token:
        out.append(ref(C.ENV_HF_TOKEN, s.hf_token.secret, s.hf_token.key))
    if s.s3:
        out.append(ref(C.ENV_AWS_ACCESS_KEY_ID, s.s3.secret, s.s3.access_key_id_key))
        out.append(ref(C.ENV_AWS_SECRET_ACCESS_KEY, s.s3.secret, s.s3.secret_access_key_key))
    out += [ref(e.var, e.secret, e.key, e.optional) for e in s.env]
    names_seen: set[str] = set()
    for e in out:
        if e["name"] in names_seen:
            raise SpecError(f"kubernetes.secrets sets {e['name']} twice", hint="keep one reference per variable")
        names_seen.add(e["name"])
    return out


def env_from(job: TuneJob) -> list[dict]:
    """envFrom entries: whole Secrets."""
    return [{"secretRef": {"name": n}} for n in job.kubernetes.secrets.env_from]


def resources(job: TuneJob) -> dict:
    """requests/limits of the main container: cpu, memory, accelerators, hugepages.

    Raises:
        SpecError: a malformed resource name or quantity, or hugepages without memory/cpu.
    """
    r, k = job.resources, job.kubernetes
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for field, value in (("cpu", r.cpu), ("memory", r.memory)):
        if value is not None:
            if not K8S_QUANTITY_RE.match(str(value)):  # checked at load; again for a spec built without validation
                raise SpecError(f"resources.{field}: '{value}' is not a Kubernetes quantity (e.g. 8, 500m, 32Gi)")
            requests[field] = str(value)
    if r.memory is not None:
        limits["memory"] = str(r.memory)  # a memory limit equal to the request: OOM is predictable, never a node eviction
    if r.accelerators:
        if not _RESOURCE_RE.match(r.accelerator_type):
            raise SpecError(
                f"resources.accelerator_type: '{r.accelerator_type}' is not a Kubernetes resource name",
                hint="use the device plugin's name, e.g. nvidia.com/gpu, amd.com/gpu, habana.ai/gaudi, nvidia.com/mig-1g.10gb",
            )
        requests[r.accelerator_type] = limits[r.accelerator_type] = str(r.accelerators)
    if k.hugepages:
        if r.memory is None and r.cpu is None:
            raise SpecError("kubernetes.hugepages needs resources.memory (or resources.cpu) set: Kubernetes refuses hugepages alone")
        name = f"hugepages-{k.hugepages.page_size}"
        requests[name] = limits[name] = k.hugepages.amount
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _shared_inputs(job: TuneJob) -> bool:
    """Several pods share one PVC: each fetches its inputs into its own emptyDir instead (no concurrent writers)."""
    return job.kubernetes.workspace.volume == "pvc" and job.resources.nodes > 1


def volumes(job: TuneJob) -> list[dict]:
    """The pod's volumes: spec ConfigMap, workspace, per-pod inputs, /dev/shm, hugepages."""
    k, n = job.kubernetes, names(job)
    ws = k.workspace
    vols: list[dict] = [{"name": "spec", "configMap": {"name": n["configmap"]}}]
    if ws.volume == "pvc":
        vols.append({"name": "workspace", "persistentVolumeClaim": {"claimName": n["pvc"]}})
    else:
        vols.append({"name": "workspace", "emptyDir": {"sizeLimit": ws.size} if ws.size else {}})
    if _shared_inputs(job):
        vols.append({"name": "inputs", "emptyDir": {}})
    vols.append({"name": "dshm", "emptyDir": {"medium": "Memory", **({"sizeLimit": k.shm_size} if k.shm_size else {})}})
    if k.hugepages:
        vols.append({"name": "hugepages", "emptyDir": {"medium": "HugePages"}})
    return vols


def volume_mounts(job: TuneJob, *, main: bool = True) -> list[dict]:
    """Mounts of a container (init containers need no /dev/shm or hugepages)."""
    mounts = [{"name": "spec", "mountPath": C.K8S_SPEC_DIR, "readOnly": True}, {"name": "workspace", "mountPath": C.K8S_WORKSPACE}]
    if _shared_inputs(job):
        for inp in cluster_inputs(job):
            if inp.dest is not None:
                mounts.append({"name": "inputs", "mountPath": inp.dest, "subPath": inp.role})
    if main:
        mounts.append({"name": "dshm", "mountPath": C.K8S_SHM_DIR})
        if job.kubernetes.hugepages:
            mounts.append({"name": "hugepages", "mountPath": C.K8S_HUGEPAGES_DIR})
    return mounts


def fetch_commands(inputs: list[Input]) -> list[tuple[str, list[str]]]:
    """(container name, command) of each fetch: ``kubetune fetch URI DEST``."""
    return [(f"fetch-{i.role}", ["kubetune", "fetch", i.uri, i.dest]) for i in inputs if i.dest is not None and not i.initializer]


def init_containers(job: TuneJob, inputs: list[Input], image: str) -> list[dict]:
    """One init container per input to fetch into the workspace."""
    out = []
    for name, command in fetch_commands(inputs):
        c = {"name": name, "image": image, "command": command, "env": env_vars(job, main=False)}
        if job.kubernetes.image_pull_policy:
            c["imagePullPolicy"] = job.kubernetes.image_pull_policy
        if env_from(job):
            c["envFrom"] = env_from(job)
        c["volumeMounts"] = volume_mounts(job, main=False)
        sc = container_security_context(job)
        if sc:
            c["securityContext"] = sc
        out.append(c)
    return out


def pod_scheduling(job: TuneJob) -> dict:
    """Pod-level placement fields, only those set."""
    k = job.kubernetes
    spec: dict = {}
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in k.image_pull_secrets]
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [_toleration(t) for t in k.tolerations]
    if k.affinity:
        spec["affinity"] = copy.deepcopy(k.affinity)  # the rendered object never shares the spec's own dicts
    if k.priority_class:
        spec["priorityClassName"] = k.priority_class
    return spec


def _toleration(t) -> dict:
    out = {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect, "tolerationSeconds": t.toleration_seconds}
    return {k: v for k, v in out.items() if v is not None}


def pod_security_context(job: TuneJob) -> dict:
    """The pod's securityContext from kubernetes.security_context (runAsNonRoot, user, group, fsGroup); only what is set."""
    sc = job.kubernetes.security_context
    out = {"runAsNonRoot": sc.run_as_non_root, "runAsUser": sc.run_as_user, "runAsGroup": sc.run_as_group, "fsGroup": sc.fs_group}
    return {k: v for k, v in out.items() if v is not None}


def container_security_context(job: TuneJob) -> dict:
    """The main container's securityContext: allowPrivilegeEscalation and added/dropped capabilities, when set."""
    sc = job.kubernetes.security_context
    out: dict = {}
    if sc.allow_privilege_escalation is not None:
        out["allowPrivilegeEscalation"] = sc.allow_privilege_escalation
    caps = {}
    if sc.capabilities_add:
        caps["add"] = list(sc.capabilities_add)
    if sc.capabilities_drop:
        caps["drop"] = list(sc.capabilities_drop)
    if caps:
        out["capabilities"] = caps
    return out
