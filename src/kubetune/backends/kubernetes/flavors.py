"""The three cluster flavours: where the pod of ``pod.py`` is placed. A registry from name to renderer.

- ``job``: batch/v1 Job. One node: a plain Job. Several nodes: an Indexed Job whose pods find rank 0 through a
  headless Service (``<name>-0.<name>``); torchrun gets node rank, master address and port from the pod's env.
- ``pytorchjob``: kubeflow.org/v1 PyTorchJob (training operator v1): Master + Worker replicas, ``nprocPerNode``;
  the operator injects PET_* variables that torchrun reads.
- ``trainjob``: trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2.3): ``runtimeRef`` to a runtime
  (default ``torch-distributed``), ``trainer`` with numNodes/numProcPerNode/resourcesPerNode, and the pod's
  volumes and placement as a ``runtimePatches`` entry. Runtimes cannot gain init containers through a patch,
  so the trainer container fetches its inputs itself before starting the worker (or Kubeflow's initializers do).
- ``kaito``: kaito.sh/v1beta1 Workspace (``kaito.py``): Kaito's own trainer on its preset models, configured by a
  ConfigMap generated from the resolved spec (kaito_run.py follows it).
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Callable

from ... import constants as C
from ...errors import SpecError
from ...spec import TuneJob
from . import pod as P
from .kaito import render_kaito

__all__ = ["FLAVORS", "RenderContext"]

TRAINJOB_PATCH_MANAGER = "kubetune.io/render"  # runtimePatches entry owner


@dataclass(frozen=True)
class RenderContext:
    """Everything a flavour needs, resolved once by :func:`kubetune.backends.kubernetes.render`."""

    job: TuneJob
    flavor: str
    run_id: str | None
    namespace: str | None
    inputs: tuple[P.Input, ...]
    image: str

    def meta(self, name: str, *, workload: bool = False) -> dict:
        """metadata of a top-level object: its name, the namespace, kubetune's labels, the spec's annotations.

        Args:
            name: the object's name.
            workload: the object that runs the job (Job, PyTorchJob, TrainJob); it also carries the Kueue queue label.
        """
        md: dict = {"name": name}
        if self.namespace:
            md["namespace"] = self.namespace
        md["labels"] = P.object_labels(self.job, self.flavor, self.run_id, workload=workload)
        if self.job.kubernetes.annotations:
            md["annotations"] = dict(self.job.kubernetes.annotations)
        return md

    def pod_meta(self) -> dict:
        """metadata of the pod template: the pod labels (how logs and diagnosis find the pods) and the annotations."""
        md: dict = {"labels": P.pod_labels(self.job, self.flavor, self.run_id)}
        if self.job.kubernetes.annotations:
            md["annotations"] = dict(self.job.kubernetes.annotations)
        return md


def _main_container(ctx: RenderContext, name: str, command: list[str], args: list[str], *, topology: list[dict] | None = None, ports: list[dict] | None = None) -> dict:
    job = ctx.job
    c: dict = {"name": name, "image": ctx.image}
    if job.kubernetes.image_pull_policy:
        c["imagePullPolicy"] = job.kubernetes.image_pull_policy
    c["command"] = command
    if args:
        c["args"] = args
    c["workingDir"] = C.K8S_WORKSPACE
    c["env"] = P.env_vars(job, topology=topology)
    if P.env_from(job):
        c["envFrom"] = P.env_from(job)
    res = P.resources(job)
    if res:
        c["resources"] = res
    if ports:
        c["ports"] = ports
    c["volumeMounts"] = P.volume_mounts(job)
    sc = P.container_security_context(job)
    if sc:
        c["securityContext"] = sc
    return c


def _pod_spec(ctx: RenderContext, container: dict, *, restart: str = "Never", **extra) -> dict:
    job = ctx.job
    spec: dict = {"restartPolicy": restart, **extra}
    # On eviction or preemption the kubelet sends SIGTERM, then SIGKILL after this grace: the worker saves a
    # checkpoint at its next step boundary in between (kubetune.preemption); Kubernetes' default of 30 s is too short.
    spec["terminationGracePeriodSeconds"] = C.K8S_TERMINATION_GRACE_SECONDS
    spec.update(P.pod_scheduling(job))
    psc = P.pod_security_context(job)
    if psc:
        spec["securityContext"] = psc
    spec["enableServiceLinks"] = False  # no service env vars: they bloat the env and can shadow MASTER_PORT-like names
    inits = P.init_containers(job, list(ctx.inputs), ctx.image)
    if inits:
        spec["initContainers"] = inits
    spec["containers"] = [container]
    spec["volumes"] = P.volumes(job)
    return spec


# --- job: batch/v1 -------------------------------------------------------------------------------
def render_job(ctx: RenderContext) -> list[dict]:
    """The ``job`` flavour: a batch/v1 Job (Indexed, with a headless Service for the rendezvous, when nodes > 1).

    Returns:
        The objects to apply, the Service first.
    """
    job = ctx.job
    r, k = job.resources, job.kubernetes
    names = P.names(job)
    multi = r.nodes > 1
    topology, ports, extra = [], None, {}
    if multi:
        topology = [
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{C.ANNOTATION_COMPLETION_INDEX}']"}}},
            {"name": "MASTER_ADDR", "value": f"{names['workload']}-0.{names['service']}"},
            {"name": "MASTER_PORT", "value": str(C.K8S_RDZV_PORT)},
        ]
        ports = [{"name": "rdzv", "containerPort": C.K8S_RDZV_PORT}]
        extra = {"subdomain": names["service"]}
    command, args = P.worker_command(job, list(ctx.inputs), launcher="static")
    container = _main_container(ctx, C.K8S_MAIN_CONTAINER["job"], command, args, topology=topology, ports=ports)
    spec: dict = {}
    if multi:
        spec.update(completionMode="Indexed", completions=r.nodes, parallelism=r.nodes)
    spec["backoffLimit"] = k.backoff_limit
    if k.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = k.active_deadline_seconds
    if k.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    spec["template"] = {"metadata": ctx.pod_meta(), "spec": _pod_spec(ctx, container, **extra)}
    objects = []
    if multi:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": ctx.meta(names["service"]),
                "spec": {
                    "clusterIP": "None",  # headless: one DNS record per pod, <name>-<index>.<service>
                    "publishNotReadyAddresses": True,  # rank 0 must resolve before any readiness
                    "selector": {C.LABEL_JOB: job.name, C.LABEL_FLAVOR: ctx.flavor},
                    "ports": [{"name": "rdzv", "port": C.K8S_RDZV_PORT, "targetPort": C.K8S_RDZV_PORT}],
                },
            }
        )
    objects.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": ctx.meta(names["workload"], workload=True), "spec": spec})
    return objects


# --- pytorchjob: kubeflow.org/v1 -----------------------------------------------------------------
def render_pytorchjob(ctx: RenderContext) -> list[dict]:
    """The ``pytorchjob`` flavour: one kubeflow.org/v1 PyTorchJob (a Master, and nodes - 1 Workers); the training
    operator injects the rendezvous variables."""
    job = ctx.job
    r, k = job.resources, job.kubernetes
    command, args = P.worker_command(job, list(ctx.inputs), launcher="operator")
    ports = [{"name": "pytorchjob-port", "containerPort": C.K8S_PYTORCHJOB_PORT}]
    restart = "Never" if k.backoff_limit == 0 else "OnFailure"

    def replica(n: int) -> dict:
        container = _main_container(ctx, C.K8S_MAIN_CONTAINER["pytorchjob"], command, args, ports=ports)
        return {"replicas": n, "restartPolicy": restart, "template": {"metadata": ctx.pod_meta(), "spec": _pod_spec(ctx, container, restart=restart)}}

    replicas = {"Master": replica(1)}
    if r.nodes > 1:
        replicas["Worker"] = replica(r.nodes - 1)
    run_policy: dict = {"cleanPodPolicy": "None", "backoffLimit": k.backoff_limit}  # keep pods: their logs are the job's record
    if k.active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = k.active_deadline_seconds
    if k.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    spec: dict = {}
    if r.world_size > 1:
        spec["nprocPerNode"] = str(r.processes_per_node)
    spec["pytorchReplicaSpecs"] = replicas
    spec["runPolicy"] = run_policy
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": ctx.meta(P.names(job)["workload"], workload=True), "spec": spec}]


# --- trainjob: trainer.kubeflow.org/v1alpha1 -----------------------------------------------------
# Kubeflow's initializers write here, on the runtime's own volume mounted at /workspace.
_KUBEFLOW_INITIALIZER_DEST = {"model": f"{C.K8S_WORKSPACE}/model", "data": f"{C.K8S_WORKSPACE}/dataset"}


def _trainjob_unsupported(job: TuneJob) -> list[str]:
    k = job.kubernetes
    bad = [f"kubernetes.{f}" for f in ("priority_class", "image_pull_policy") if getattr(k, f) is not None]
    bad += [f"kubernetes.{f}" for f in ("backoff_limit", "ttl_seconds_after_finished") if f in k.model_fields_set]
    if k.secrets.env_from:
        bad.append("kubernetes.secrets.env_from")
    return bad


def render_trainjob(ctx: RenderContext) -> list[dict]:
    """The ``trainjob`` flavour: a trainer.kubeflow.org/v1alpha1 TrainJob on the torch-distributed runtime, the pod
    settings as runtime patches.

    Raises:
        SpecError: a kubernetes setting a TrainJob has no field for (priority_class, env_from, ...).
    """
    job = ctx.job
    r, k = job.resources, job.kubernetes
    bad = _trainjob_unsupported(job)
    if bad:
        raise SpecError(
            f"the trainjob flavour cannot set {', '.join(bad)}: a TrainJob has no such field",
            hint="set it in the TrainingRuntime, list Secret keys under kubernetes.secrets.env, or use --flavor job or pytorchjob",
        )
    inputs, initializer = _trainjob_inputs(ctx)
    command, args = P.worker_command(job, inputs, launcher="operator")
    fetches = P.fetch_commands(inputs)
    if fetches:  # no init containers in a runtime patch: fetch first, then exec the worker (same commands)
        lines = ["set -e"] + [shlex.join(cmd) for _, cmd in fetches] + ["exec " + shlex.join(command + args)]
        command, args = ["sh", "-c", "\n".join(lines)], []
    trainer: dict = {"image": ctx.image, "command": command}
    if args:
        trainer["args"] = args
    trainer["env"] = P.env_vars(job)
    trainer["numNodes"] = r.nodes
    trainer["numProcPerNode"] = r.processes_per_node
    res = P.resources(job)
    if res:
        trainer["resourcesPerNode"] = res
    spec: dict = {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": k.trainjob.runtime_kind, "name": k.trainjob.runtime}}
    if initializer:
        spec["initializer"] = initializer
    spec["trainer"] = trainer
    if k.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = k.active_deadline_seconds
    spec["runtimePatches"] = [{"manager": TRAINJOB_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [_trainjob_patch(ctx)]}}}}]
    return [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": ctx.meta(P.names(job)["workload"], workload=True), "spec": spec}]


def _trainjob_inputs(ctx: RenderContext) -> tuple[list[P.Input], dict]:
    """Route hf:// and s3:// inputs to Kubeflow's initializers when the runtime has them."""
    k = ctx.job.kubernetes
    if not k.trainjob.initializers:
        return list(ctx.inputs), {}
    initializer: dict = {}
    out = []
    for inp in ctx.inputs:
        scheme = inp.uri.split("://", 1)[0]
        if inp.role in _KUBEFLOW_INITIALIZER_DEST and inp.dest is not None and scheme in ("hf", "s3"):
            entry: dict = {"storageUri": inp.uri}
            secret = k.secrets.hf_token.secret if scheme == "hf" and k.secrets.hf_token else (k.secrets.s3.secret if scheme == "s3" and k.secrets.s3 else None)
            if secret:
                entry["secretRef"] = {"name": secret}
            initializer["model" if inp.role == "model" else "dataset"] = entry
            inp = dataclasses.replace(inp, dest=_KUBEFLOW_INITIALIZER_DEST[inp.role], initializer=True)
        out.append(inp)
    return out, initializer


def _trainjob_patch(ctx: RenderContext) -> dict:
    job = ctx.job
    vols, mounts = P.volumes(job), P.volume_mounts(job)
    if job.kubernetes.trainjob.initializers:  # the runtime mounts its initializer volume at /workspace already
        vols = [v for v in vols if v["name"] not in ("workspace", "inputs")]
        mounts = [m for m in mounts if m["name"] not in ("workspace", "inputs")]
    container: dict = {"name": C.K8S_TRAINJOB_STEP, "volumeMounts": mounts}
    sc = P.container_security_context(job)
    if sc:
        container["securityContext"] = sc
    pod_spec: dict = {"terminationGracePeriodSeconds": C.K8S_TERMINATION_GRACE_SECONDS}  # room for the preemption save
    pod_spec.update(P.pod_scheduling(job))
    psc = P.pod_security_context(job)
    if psc:
        pod_spec["securityContext"] = psc
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = vols
    return {
        "name": C.K8S_TRAINJOB_STEP,
        "template": {"metadata": ctx.pod_meta(), "spec": {"template": {"metadata": ctx.pod_meta(), "spec": pod_spec}}},
    }


# name -> renderer; `kubetune render --flavor NAME` and kubernetes.flavor pick one.
FLAVORS: dict[str, Callable[[RenderContext], list[dict]]] = {
    "job": render_job,
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
    "kaito": render_kaito,  # a Kaito tuning Workspace (kaito.py), followed by kaito_run.py
}
