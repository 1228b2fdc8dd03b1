"""The job as a Kubeflow pipeline: fetch -> train -> [merge ->] publish, built with the kfp SDK.

Pure: building and compiling talk to no server and import neither torch nor the worker. The same
builder serves the local runner (``local=True``: the components use this machine's Python environment,
so nothing is installed) and a KFP server (the components start from ``kfp.base_image`` and install
``kfp.package``; the train task asks for the spec's accelerators, cpu and memory; the kubernetes
section's secrets, env and placement go on the pods through kfp-kubernetes).
"""

# No `from __future__ import annotations`: the kfp SDK reads the pipeline function's annotations as types.
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from kfp import compiler, dsl

from ..._version import __version__
from ... import constants as C
from ...errors import BackendError, SpecError
from ...spec import TuneJob, spec_to_dict
from . import components

__all__ = ["build_pipeline", "render_pipeline", "compile_pipeline", "pipeline_arguments", "pipeline_name", "base_image"]

# Task display names: what the KFP UI shows and what status() reports as stages.
TASK_STAGES = {"fetch": C.STAGE_FETCH, "train": C.STAGE_TRAIN, "merge": C.STAGE_PUBLISH, "publish": C.STAGE_PUBLISH}


def build_pipeline(job: TuneJob, *, local: bool = False) -> Callable[..., Any]:
    """The pipeline function for ``job``; its parameters default to the job's values (see :func:`pipeline_arguments`).

    Args:
        job: the validated job.
        local: build for the KFP local runner (no packages installed, no pod settings).

    Raises:
        SpecError: a setting KFP cannot express (several nodes, a resource quantity it rejects, no image), or
            credentials in the spec (the spec is a pipeline parameter: compiled into the pipeline, and on the
            command line of every task, also under the local runner).
    """
    from ..kubernetes.pod import refuse_credentials

    refuse_credentials(job, staging="kfp.bucket")
    _check_topology(job)
    image = base_image(job)
    packages = [] if local else _packages(job, image)
    if job.entrypoint is not None:
        return _custom_pipeline(job, image, local=local, packages=packages)

    def component(func: Callable) -> Any:
        return dsl.component(
            func,
            base_image=image,
            packages_to_install=packages or None,
            pip_index_urls=(job.kfp.pip_index_urls or None) if packages else None,
            install_kfp_package=not local,
        )

    fetch_op, train_op = component(components.fetch), component(components.train)
    merge_op = component(components.merge)
    publish_op, publish_merged_op = component(components.publish), component(components.publish_merged)
    defaults = pipeline_arguments(job)
    with_merge = job.output.merge and job.method.type != "full"

    @dsl.pipeline(name=pipeline_name(job), description=f"kubetune fine-tune '{job.name}': {job.method.type} of {job.model.source}")
    def kubetune_pipeline(
        spec: str = defaults["spec"],
        model_uri: str = defaults["model_uri"],
        dataset_uri: str = defaults["dataset_uri"],
        eval_dataset_uri: str = defaults["eval_dataset_uri"],
        run_dir: str = "",
    ):
        fetch_task = fetch_op(spec=spec, model_uri=model_uri, dataset_uri=dataset_uri, eval_dataset_uri=eval_dataset_uri,
                              run_dir=run_dir).set_display_name("fetch")
        train_task = train_op(spec=spec, run_dir=run_dir, model=fetch_task.outputs["model"],
                              dataset=fetch_task.outputs["dataset"], eval_dataset=fetch_task.outputs["eval_dataset"])
        train_task.set_display_name("train")
        tasks = [fetch_task, train_task]
        heavy = [train_task]
        if with_merge:
            merge_task = merge_op(spec=spec, run_dir=run_dir, model=fetch_task.outputs["model"],
                                  trained=train_task.outputs["trained"]).set_display_name("merge")
            publish_task = publish_merged_op(spec=spec, run_dir=run_dir, metrics_json=train_task.outputs["Output"],
                                             trained=train_task.outputs["trained"], merged=merge_task.outputs["merged"])
            tasks.append(merge_task)
            heavy.append(merge_task)
        else:
            publish_task = publish_op(spec=spec, run_dir=run_dir, metrics_json=train_task.outputs["Output"],
                                      trained=train_task.outputs["trained"])
        publish_task.set_display_name("publish")
        tasks.append(publish_task)
        for task in tasks:
            task.set_caching_options(job.kfp.caching)
        _set_resources(train_task, job, accelerators=True)
        if with_merge:
            _set_resources(merge_task, job, accelerators=False)
        if not local:
            _set_pod_settings(tasks, heavy, job)

    return kubetune_pipeline


def _custom_pipeline(job: TuneJob, image: str, *, local: bool, packages: list[str]) -> Callable[..., Any]:
    """An entrypoint job's pipeline: one ``custom`` task runs the user's function on ``processes_per_node`` processes.

    Its code is a pipeline parameter of its own (``entrypoint_code``, like the ConfigMap key on Kubernetes); a server's
    task pip-installs ``entrypoint.packages`` with kubetune, the local runner installs nothing and refuses missing ones.
    """
    if local:
        from ...preflight import entrypoint_problems

        problems = [p for p in entrypoint_problems(job.entrypoint) if p.startswith("entrypoint.packages")]
        if problems:
            raise SpecError("; ".join(problems), hint="the KFP local runner uses this environment and installs nothing: pip install them here")
    else:
        packages = [*packages, *job.entrypoint.packages]
    op = dsl.component(components.custom, base_image=image, packages_to_install=packages or None,
                       pip_index_urls=(job.kfp.pip_index_urls or None) if packages else None, install_kfp_package=not local)
    defaults = pipeline_arguments(job)

    @dsl.pipeline(name=pipeline_name(job), description=f"kubetune custom training '{job.name}': {job.entrypoint.describe()}")
    def kubetune_pipeline(spec: str = defaults["spec"], entrypoint_code: str = defaults["entrypoint_code"], run_dir: str = ""):
        task = op(spec=spec, entrypoint_code=entrypoint_code, run_dir=run_dir).set_display_name("train")
        task.set_caching_options(job.kfp.caching)
        _set_resources(task, job, accelerators=True)
        if not local:
            _set_pod_settings([task], [task], job)

    return kubetune_pipeline


def pipeline_arguments(job: TuneJob, run_dir: str | Path = "") -> dict[str, str]:
    """The pipeline's parameters for ``job``: the resolved spec, the input URIs and the run directory.

    The URIs are parameters of their own so that a compiled pipeline can be rerun from the KFP UI with
    another model or dataset; ``run_dir`` is set for the local runner only. The spec travels as one line of
    JSON (YAML to its readers): the compiler copies defaults into a comment header, one line each. An entrypoint
    job has no URIs: its function's code is the parameter ``entrypoint_code``, a JSON string (``module`` entrypoints: empty).
    """
    if job.entrypoint is not None:
        from ..kubernetes.pod import entrypoint_code, entrypoint_file_name

        spec = spec_to_dict(job)
        if job.entrypoint.module is None:  # the task writes the code to a file of its own and points the spec there
            spec["entrypoint"].update(file=entrypoint_file_name(job), source=None)
        code = entrypoint_code(job)  # one line too: a JSON string
        return {"spec": json.dumps(spec, separators=(",", ":")), "entrypoint_code": json.dumps(code) if code is not None else "",
                "run_dir": str(run_dir)}
    return {
        "spec": json.dumps(spec_to_dict(job), separators=(",", ":")),
        "model_uri": job.model.source,
        "dataset_uri": job.dataset.source,
        "eval_dataset_uri": job.dataset.eval_source or "",
        "run_dir": str(run_dir),
    }


def pipeline_name(job: TuneJob) -> str:
    """The pipeline's name: ``kubetune-<job name>``."""
    return f"kubetune-{job.name}"


def compile_pipeline(job: TuneJob, path: str | Path) -> Path:
    """Compile the job's pipeline (for a KFP server) to IR YAML at ``path``."""
    func = build_pipeline(job)
    try:
        compiler.Compiler().compile(func, str(path))
    except ValueError as e:  # the kfp SDK rejects a value; name it rather than show its traceback
        raise SpecError(f"the KFP compiler rejected the pipeline: {e}") from e
    return Path(path)


def render_pipeline(job: TuneJob) -> str:
    """The compiled pipeline IR YAML for a KFP server (what ``kubetune render --backend kfp`` prints)."""
    with tempfile.TemporaryDirectory(prefix="kubetune-kfp-") as tmp:
        return compile_pipeline(job, Path(tmp) / "pipeline.yaml").read_text(encoding="utf-8")


def base_image(job: TuneJob) -> str:
    """The components' image: kfp.base_image, else kubernetes.image, else the kubetune image of this version.

    Raises:
        SpecError: accelerators other than NVIDIA's and no image named (kubetune ships none for them).
    """
    from ..kubernetes.pod import shipped_image

    image = job.kfp.base_image or job.kubernetes.image or shipped_image(job)
    if image is None:
        raise SpecError(
            f"kfp.base_image: kubetune ships no image for {job.resources.accelerator_type}",
            hint="build one from deploy/Dockerfile with your vendor's PyTorch base image and set kfp.base_image "
            "(or set kfp.package to install kubetune into a vendor image)",
        )
    return image


def _packages(job: TuneJob, image: str) -> list[str]:
    """pip requirements each component installs when it starts."""
    if job.kfp.package is not None:
        return [job.kfp.package] if job.kfp.package.strip() else []
    if image.startswith(f"{C.K8S_IMAGE_REPO}:"):
        return []  # the kubetune image has kubetune
    return [f"kubetune=={__version__}"]


def _check_topology(job: TuneJob) -> None:
    if job.resources.nodes > 1:
        raise SpecError(
            f"resources.nodes={job.resources.nodes}: a KFP task is one pod, so the kfp backend trains on one node",
            hint="use resources.processes_per_node for several accelerators of one node, or --backend kubernetes "
            "(flavor pytorchjob or trainjob) for several nodes",
        )


def _set_resources(task: Any, job: TuneJob, *, accelerators: bool) -> None:
    """Requests (resources.cpu/memory), limits (kfp.cpu_limit/memory_limit) and accelerators of any resource name."""
    r, k = job.resources, job.kfp
    settings = [
        ("resources.cpu", r.cpu, task.set_cpu_request),
        ("resources.memory", r.memory, task.set_memory_request),
        ("kfp.cpu_limit", k.cpu_limit, task.set_cpu_limit),
        ("kfp.memory_limit", k.memory_limit, task.set_memory_limit),
    ]
    for field, value, setter in settings:
        if value is None:
            continue
        try:
            setter(str(value))
        except ValueError as e:
            raise SpecError(f"{field}: KFP does not accept '{value}': {e}", hint="e.g. cpu '8' or '500m', memory '32Gi'") from None
    if accelerators and r.accelerators:
        task.set_accelerator_type(r.accelerator_type)
        task.set_accelerator_limit(r.accelerators)


def _set_pod_settings(tasks: list, heavy: list, job: TuneJob) -> None:
    """The kubernetes section on the pods: env and secrets on every task, placement on the heavy ones."""
    k = job.kubernetes
    try:
        from kfp import kubernetes as kfpk
    except ImportError as e:
        raise BackendError("the kfp backend needs the kfp-kubernetes package", hint="pip install 'kubetune[kfp]'") from e
    for task in tasks:
        for name, value in sorted(k.env.items()):
            task.set_env_variable(name, value)
        s = k.secrets
        if s.hf_token is not None:
            kfpk.use_secret_as_env(task, s.hf_token.secret, {s.hf_token.key: C.ENV_HF_TOKEN})
        if s.s3 is not None:
            kfpk.use_secret_as_env(task, s.s3.secret, {s.s3.access_key_id_key: C.ENV_AWS_ACCESS_KEY_ID,
                                                       s.s3.secret_access_key_key: C.ENV_AWS_SECRET_ACCESS_KEY})
        for item in s.env:
            kfpk.use_secret_as_env(task, item.secret, {item.key: item.var}, optional=item.optional)
        if k.image_pull_secrets:
            kfpk.set_image_pull_secrets(task, list(k.image_pull_secrets))
        if k.image_pull_policy:
            kfpk.set_image_pull_policy(task, k.image_pull_policy)
        kfpk.add_pod_label(task, C.LABEL_JOB, job.name)
        kfpk.add_pod_label(task, C.LABEL_MANAGED_BY, C.MANAGED_BY_VALUE)
        for key, value in sorted(k.labels.items()):
            kfpk.add_pod_label(task, key, value)
        for key, value in sorted(k.annotations.items()):
            kfpk.add_pod_annotation(task, key, value)
    for task in heavy:
        for key, value in sorted(k.node_selector.items()):
            kfpk.add_node_selector(task, key, value)
        for t in k.tolerations:
            kfpk.add_toleration(task, key=t.key, operator=t.operator, value=t.value, effect=t.effect,
                                toleration_seconds=t.toleration_seconds)
        if k.shm_size:
            kfpk.empty_dir_mount(task, volume_name="dshm", mount_path=C.K8S_SHM_DIR, medium="Memory", size_limit=k.shm_size)
        if k.active_deadline_seconds:
            kfpk.set_timeout(task, k.active_deadline_seconds)
