"""Rendering: a TuneJob in, the cluster objects out. Pure and deterministic, like ``helm template``.

Nothing here talks to a cluster or imports the ``kubernetes`` client or torch; the same objects are what
``kubetune run --backend kubernetes`` submits (plus a run-id label) and what the golden files hold.
"""

from __future__ import annotations

import copy
import json

import yaml

from ... import constants as C
from ...errors import SpecError
from ...spec import TuneJob, spec_to_dict
from . import pod as P
from .flavors import FLAVORS, RenderContext

__all__ = ["render", "render_text", "cluster_spec", "FLAVORS", "WORKLOAD_KINDS"]

# flavour -> (apiVersion, kind, plural) of its workload object
WORKLOAD_KINDS = {
    "job": ("batch/v1", "Job", "jobs"),
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs"),
    "kaito": (C.K8S_KAITO_API_VERSION, "Workspace", "workspaces"),  # Kaito runs its own trainer (kaito_run.py follows it)
}


def render(job: TuneJob, flavor: str | None = None, *, run_id: str | None = None, namespace: str | None = None) -> list[dict]:
    """The objects that run ``job`` on a cluster.

    Args:
        job: the validated job.
        flavor: ``job``, ``pytorchjob``, ``trainjob`` or ``kaito`` (default: ``kubernetes.flavor``).
        run_id: a submission id added as a label (``kubetune run`` sets it; renders leave it out).
        namespace: overrides ``kubernetes.namespace``; with neither, objects carry no namespace.

    Returns:
        ConfigMap (the spec, and an entrypoint job's function source), PersistentVolumeClaim (when one is created), Service (multi-node ``job``),
        then the workload, as plain dicts. ``kaito``: the ConfigMap of Kaito's training config, then the Workspace.

    Raises:
        SpecError: the spec cannot run on a cluster as written (the message names the field), e.g. a URI
            with credentials (they must come from a Secret).
    """
    flavor = flavor or job.kubernetes.flavor
    if flavor not in FLAVORS:
        raise SpecError(f"unknown flavor '{flavor}'; choose one of: {', '.join(FLAVORS)}")
    P.refuse_credentials(job)  # the spec goes into a ConfigMap and the pods' args: no credential may ride along
    if flavor == "kaito":  # what Kaito cannot run is said first, in Kaito's terms
        from .kaito import check as kaito_check

        kaito_check(job)
    else:
        from ...preflight import volume_problems

        if volume_problems(job):
            raise SpecError(volume_problems(job)[0], hint="or run it with --flavor kaito (docs/kubernetes.md, Kaito)")
    P.resources(job)  # resource names and quantities first: they explain an image error too
    ctx = RenderContext(
        job=job,
        flavor=flavor,
        run_id=run_id,
        namespace=namespace or job.kubernetes.namespace,
        inputs=tuple(P.cluster_inputs(job)),
        image=P.default_image(job),
    )
    if flavor == "kaito":  # Kaito builds the pod itself: no spec ConfigMap, no PVC
        return copy.deepcopy(FLAVORS[flavor](ctx))
    names = P.names(job)
    data = {C.K8S_SPEC_KEY: yaml.safe_dump(cluster_spec(job, flavor), sort_keys=False, allow_unicode=True)}
    code = P.entrypoint_code(job)
    if code is not None:  # the user's function travels beside the spec, mounted with it: no image build
        data[P.entrypoint_file_name(job)] = code
    objects = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": ctx.meta(names["configmap"]), "data": data}]
    ws = job.kubernetes.workspace
    if ws.volume == "pvc" and not ws.claim_name:
        pvc_spec: dict = {"accessModes": list(ws.access_modes), "resources": {"requests": {"storage": ws.size}}}
        if ws.storage_class:
            pvc_spec["storageClassName"] = ws.storage_class
        if job.resources.nodes > 1 and "ReadWriteMany" not in ws.access_modes:
            raise SpecError(
                f"kubernetes.workspace.access_modes: {job.resources.nodes} nodes mount one PVC, which needs ReadWriteMany",
                hint="add ReadWriteMany (and a storage class that supports it), or use volume: emptyDir with output.uri",
            )
        objects.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": ctx.meta(names["pvc"]), "spec": pvc_spec})
    objects += FLAVORS[flavor](ctx)
    return copy.deepcopy(objects)  # no shared sub-objects: callers may edit one object without touching another


def cluster_spec(job: TuneJob, flavor: str) -> dict:
    """The spec the pod reads: local inputs replaced by their staged URIs, the flavour it runs as.

    Sources inside lists (``dataset.mix[i].source``), which ``--set`` cannot address, carry their pod
    directory here instead.
    """
    data = spec_to_dict(job)
    for inp in P.cluster_inputs(job):
        value = inp.dest if inp.in_spec and inp.dest else (inp.uri if inp.local is not None else None)
        if value is not None:
            *path, key = [int(p) if p.isdigit() else p for p in inp.field.split(".")]
            node = data
            for part in path:
                node = node[part]
            node[key] = value
    data["kubernetes"]["flavor"] = flavor
    if job.entrypoint is not None and job.entrypoint.module is None:  # the code is the ConfigMap's entrypoint.py
        data["entrypoint"].update(file=P.entrypoint_file_name(job), source=None)  # the worker's --set names its mount path
    return data


def render_text(objects: list[dict], output: str = "yaml") -> str:
    """Objects as multi-document YAML (``---`` between) or as a JSON ``List`` like kubectl prints.

    Raises:
        SpecError: an unknown output format.
    """
    if output == "yaml":
        return "---\n".join(yaml.dump(o, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000) for o in objects)
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    raise SpecError(f"unknown output format '{output}'; use yaml or json")


class _Dumper(yaml.SafeDumper):
    """YAML for people: no anchors, multi-line strings (the spec, shell scripts) as literal blocks."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
