"""Where a job runs on a cluster: the ``kubernetes`` and ``kfp`` sections."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .. import constants as C
from .base import _Section


# --- kubernetes ------------------------------------------------------------------------------
# Rules the API server would enforce; checked here so a bad value fails at load, naming its field.
_K8S_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label (namespace)
_K8S_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_K8S_QUALIFIED_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")  # label key name, label value
# A resource quantity (cpu, memory, storage): the API server's grammar, without the sign it would refuse anyway.
# The one copy: the Kubernetes renderer checks quantities with it too.
K8S_QUANTITY_RE = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
_K8S_ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_K8S_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
# Plain env values land in the rendered objects; these names must come from a Secret instead.
_K8S_SECRET_NAME_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_KEY|PRIVATE_KEY", re.I)
# Names that often hold a credential but also name harmless things (CACHE_KEY, NUM_PASS): warned about, not
# refused (spec_warnings), and their values are masked wherever the spec is shown or saved.
_K8S_SECRETISH_WORDS = frozenset({"PASS", "PASSWD", "PWD", "PW", "PAT", "KEY", "KEYS", "AUTH", "CRED", "CREDS", "SIG",
                                  "SIGNATURE", "SESSION", "COOKIE", "DSN", "PASSPHRASE", "SALT"})
# Values shaped like well-known credentials: GitHub/GitLab/Hugging Face/OpenAI/Slack/Google tokens, AWS key
# ids, JWTs, PEM private keys.
_SECRET_VALUE_RE = re.compile(
    r"^(gh[pousr]_|github_pat_|glpat-|hf_[A-Za-z0-9]{20}|sk-[A-Za-z0-9_-]{16}|xox[abposr]-|(AKIA|ASIA)[A-Z0-9]{16}$|AIza[0-9A-Za-z_-]{30}|"
    r"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.)|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)


def _secretish_env_name(name: str) -> bool:
    """Whether an environment variable named ``name`` probably holds a credential (refused or warned names)."""
    if _K8S_SECRET_NAME_RE.search(name):
        return True
    words = [w for w in re.split(r"[_.\-]+", name.upper()) if w]
    return any(w in _K8S_SECRETISH_WORDS or w.endswith(("PASS", "PWD", "KEY", "TOKEN")) for w in words)


def _k8s_name(value: str, what: str = "name") -> str:
    if len(value) > 253 or not _K8S_SUBDOMAIN_RE.match(value):
        raise ValueError(f"'{value}' is not a valid Kubernetes {what}: lowercase letters, digits, '-' and '.'")
    return value


def check_quantity(value: Any) -> str | None:
    """``value`` as a Kubernetes quantity string (``8``, ``500m``, ``32Gi``, ``1.5G``); None stays None.

    A plain number (YAML ``cpu: 8``) is taken as its text, as Kubernetes does.

    Raises:
        ValueError: anything else, e.g. ``32GB`` or ``-1`` (pydantic reports it under the field's path).
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not K8S_QUANTITY_RE.match(value):
        shown = str(value).lower() if isinstance(value, bool) else value
        raise ValueError(
            f"expected a Kubernetes quantity, got '{shown}': a number with an optional suffix, e.g. 8 or 500m (millicores) for "
            "cpu, 32Gi or 1.5G for memory (Ki, Mi, Gi, Ti: powers of 1024; k, M, G, T: of 1000)"
        )
    return value


def _k8s_labels(values: dict[str, str], *, labels: bool) -> dict[str, str]:
    for key, val in values.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _K8S_SUBDOMAIN_RE.match(prefix))) or len(name) > 63 or not _K8S_QUALIFIED_RE.match(name):
            raise ValueError(f"'{key}' is not a valid label/annotation key ([prefix/]name, name at most 63 characters)")
        if prefix == "kubetune.io" or prefix.endswith(".kubetune.io"):
            raise ValueError(f"'{key}': the kubetune.io/ prefix is reserved for labels kubetune sets itself")
        if labels and val and (len(val) > 63 or not _K8S_QUALIFIED_RE.match(val)):
            raise ValueError(f"label '{key}': value '{val}' must be at most 63 letters, digits, '-', '_' or '.'")
    return values


class K8sTolerationSpec(_Section):
    """A toleration, as in a pod spec (snake_case keys)."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists tolerates every taint.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: match value; Exists: any value.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Taint effect; empty matches all.")
    toleration_seconds: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="How long a NoExecute taint is tolerated.")

    @model_validator(mode="after")
    def _consistent(self) -> "K8sTolerationSpec":
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key (or use operator Exists)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds only applies to effect NoExecute")
        return self


class K8sSecurityContextSpec(_Section):
    """Who the containers run as (pod securityContext) and what they may do (container securityContext)."""

    run_as_non_root: bool | None = Field(None, description="Refuse to start a container whose user is root.")
    run_as_user: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="UID of every container process.")
    run_as_group: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="GID of every container process.")
    fs_group: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="Group that owns mounted volumes (so a non-root user can write the PVC).")
    allow_privilege_escalation: bool | None = Field(None, description="Container may gain more privileges than its parent.")
    capabilities_add: list[str] = Field(default_factory=list, description="Linux capabilities to add, e.g. [SYS_NICE] (Gaudi).")
    capabilities_drop: list[str] = Field(default_factory=list, description="Linux capabilities to drop, e.g. [ALL].")

    @model_validator(mode="after")
    def _not_root(self) -> "K8sSecurityContextSpec":
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("run_as_non_root is true but run_as_user is 0 (root); pick another uid")
        return self


class K8sWorkspaceSpec(_Section):
    """The volume at /workspace holding fetched inputs, caches and the run directory."""

    volume: Literal["emptyDir", "pvc"] = Field("emptyDir", description="emptyDir (lives with the pod) or pvc (outlives it).")
    size: str | None = Field(None, description="emptyDir size limit, or the PVC's requested storage, e.g. 100Gi.")
    storage_class: str | None = Field(None, description="PVC storage class (default: the cluster's default class).")
    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteOnce"], description="PVC access modes; several nodes need ReadWriteMany."
    )
    claim_name: str | None = Field(None, description="Use this existing PVC instead of creating '<name>-workspace'.")

    _check_size = field_validator("size", mode="before")(lambda cls, v: check_quantity(v))

    @field_validator("storage_class", "claim_name")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)

    @model_validator(mode="after")
    def _consistent(self) -> "K8sWorkspaceSpec":
        if self.volume == "emptyDir" and (self.claim_name or self.storage_class):
            raise ValueError("claim_name and storage_class need volume: pvc")
        if self.volume == "pvc" and not self.claim_name and not self.size:
            raise ValueError("a new PVC needs a size (e.g. size: 100Gi), or name an existing one with claim_name")
        if not self.access_modes:
            raise ValueError("access_modes must not be empty")
        return self


class K8sHugePagesSpec(_Section):
    """Hugepages per node (Gaudi needs them): requested as hugepages-<page_size>, mounted at /hugepages."""

    page_size: Literal["2Mi", "1Gi"] = Field("2Mi", description="Page size the nodes provide.")
    amount: str = Field(description="Hugepage memory per node, e.g. 9800Mi.")

    _check_amount = field_validator("amount", mode="before")(lambda cls, v: check_quantity(v))


class K8sSecretKeySpec(_Section):
    """One key of a Secret."""

    secret: str = Field(description="Secret name (in the job's namespace).")
    key: str = Field("token", description="Key inside the Secret.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))


class K8sS3SecretSpec(_Section):
    """A Secret holding S3 credentials; its keys become AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""

    secret: str = Field(description="Secret name (in the job's namespace).")
    access_key_id_key: str = Field("AWS_ACCESS_KEY_ID", description="Key holding the access key id.")
    secret_access_key_key: str = Field("AWS_SECRET_ACCESS_KEY", description="Key holding the secret access key.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))


class K8sSecretEnvSpec(_Section):
    """An environment variable whose value comes from a Secret key."""

    var: str = Field(description="Environment variable name, e.g. WANDB_API_KEY.")
    secret: str = Field(description="Secret name.")
    key: str = Field(description="Key inside the Secret.")
    optional: bool = Field(False, description="Start even when the Secret or key is missing.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))

    @field_validator("var")
    @classmethod
    def _var(cls, v: str) -> str:
        if not _K8S_ENV_NAME_RE.match(v):
            raise ValueError(f"'{v}' is not a valid environment variable name")
        return v


class K8sSecretsSpec(_Section):
    """Secrets the containers read, by reference only: no secret value is ever part of a spec or a render."""

    hf_token: K8sSecretKeySpec | None = Field(None, description="Secret key holding a Hugging Face token (env HF_TOKEN).")
    s3: K8sS3SecretSpec | None = Field(None, description="Secret holding S3 credentials (env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY).")
    env: list[K8sSecretEnvSpec] = Field(default_factory=list, description="More variables from Secret keys.")
    env_from: list[str] = Field(default_factory=list, description="Secrets whose every key becomes a variable (not for trainjob).")

    @field_validator("env_from")
    @classmethod
    def _env_from(cls, v: list[str]) -> list[str]:
        return [_k8s_name(s, "Secret name") for s in v]

    @field_validator("hf_token", "s3", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"secret": v} if isinstance(v, str) else v  # `hf_token: my-secret` names the Secret


class K8sTrainJobSpec(_Section):
    """Options of the trainjob flavour (Kubeflow Trainer v2)."""

    runtime: str = Field("torch-distributed", description="The (Cluster)TrainingRuntime the TrainJob references.")
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime", description="Kind of the runtime (a TrainingRuntime lives in the job's namespace)."
    )
    initializers: bool = Field(
        False,
        description="The runtime has Kubeflow's dataset/model initializers: hf:// and s3:// inputs go to "
        "spec.initializer.*.storageUri instead of being fetched by the trainer container.",
    )

    _check_runtime = field_validator("runtime")(lambda cls, v: _k8s_name(v, "runtime name"))


class K8sKaitoSpec(_Section):
    """Options of the kaito flavour (a Kaito tuning Workspace, kaito.sh/v1beta1)."""

    instance_type: str | None = Field(
        None,
        description="GPU node SKU Kaito provisions (resource.instanceType), e.g. Standard_NC24ads_A100_v4; unset when Kaito's "
        "node auto-provisioning is off (then kubernetes.node_selector selects your GPU nodes).",
    )
    preset: str | None = Field(
        None,
        description="Kaito model preset to tune (tuning.preset.name); default: the hf:// model's name lowercased, "
        "e.g. hf://microsoft/Phi-3-mini-4k-instruct -> phi-3-mini-4k-instruct (a guess: set it when Kaito names the model otherwise).",
    )
    push_secret: str | None = Field(
        None, description="Secret with registry credentials Kaito pushes the adapter image (output.uri) with (tuning.output.imagePushSecret)."
    )

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]*", v):
            raise ValueError(f"'{v}' is not an instance type (a cloud SKU name such as Standard_NC24ads_A100_v4)")
        return v

    @field_validator("preset", "push_secret")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)


class KubernetesSpec(_Section):
    """How the job runs on Kubernetes (used by the kubernetes backend and `kubetune render`)."""

    flavor: Literal["job", "pytorchjob", "trainjob", "kaito"] = Field(
        "job",
        description="job: batch/v1 Job (no operator); pytorchjob: Kubeflow training operator; trainjob: Kubeflow Trainer v2; "
        "kaito: a Kaito tuning Workspace (lora/qlora on Kaito's preset models, run by Kaito's own trainer).",
    )
    namespace: str | None = Field(None, description="Namespace (default: the kubeconfig context's, else 'default').")
    image: str | None = Field(
        None, description="Worker image (default: the kubetune image for this version; its -cuda tag for nvidia.com resources)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, description="Image pull policy.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets with registry credentials.")
    service_account: str | None = Field(None, description="Service account the pods run as.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: list[K8sTolerationSpec] = Field(default_factory=list, description="Taints the pods tolerate.")
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="Pod affinity exactly as Kubernetes writes it (nodeAffinity, podAffinity, podAntiAffinity)."
    )
    priority_class: str | None = Field(None, description="PriorityClass of the pods.")
    queue: str | None = Field(None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every object and pod.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations on every object and pod.")
    security_context: K8sSecurityContextSpec = Field(default_factory=K8sSecurityContextSpec, description="User, group and privileges.")
    workspace: K8sWorkspaceSpec = Field(default_factory=K8sWorkspaceSpec, description="The /workspace volume.")
    shm_size: str | None = Field(None, description="Size limit of /dev/shm (memory-backed), e.g. 16Gi.")
    hugepages: K8sHugePagesSpec | None = Field(None, description="Hugepages per node (needs resources.memory).")
    env: dict[str, str] = Field(default_factory=dict, description="Plain environment variables (no secrets: use secrets.env).")
    secrets: K8sSecretsSpec = Field(default_factory=K8sSecretsSpec, description="Secrets by reference.")
    ttl_seconds_after_finished: int | None = Field(
        604800, ge=0, le=C.SPEC_MAX_INT32, description="Delete the finished job (and its pods' logs) after this many seconds; null keeps it."
    )
    backoff_limit: int = Field(0, ge=0, le=C.SPEC_MAX_INT32, description="Retries of failed pods (use with training.resume: auto).")
    active_deadline_seconds: int | None = Field(None, ge=1, le=C.SPEC_MAX_INT32, description="Stop the job after this many seconds.")
    staging_uri: str | None = Field(None, description="s3:// prefix where `kubetune run` uploads local model/dataset files.")
    trainjob: K8sTrainJobSpec = Field(default_factory=K8sTrainJobSpec, description="Options of the trainjob flavour.")
    kaito: K8sKaitoSpec = Field(default_factory=K8sKaitoSpec, description="Options of the kaito flavour.")

    _check_shm = field_validator("shm_size", mode="before")(lambda cls, v: check_quantity(v))

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 63 or not _K8S_LABEL_RE.match(v)):
            raise ValueError(f"'{v}' is not a valid namespace: lowercase letters, digits and '-', at most 63 characters")
        return v

    @field_validator("service_account", "priority_class", "queue")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, v: list[str]) -> list[str]:
        return [_k8s_name(s, "Secret name") for s in v]

    _check_labels = field_validator("labels", "node_selector")(lambda cls, v: _k8s_labels(v, labels=True))
    _check_annotations = field_validator("annotations")(lambda cls, v: _k8s_labels(v, labels=False))

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = set(v) - {"nodeAffinity", "podAffinity", "podAntiAffinity"}
        if unknown:
            raise ValueError(f"unknown affinity keys {sorted(unknown)}; use nodeAffinity, podAffinity, podAntiAffinity")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _K8S_ENV_NAME_RE.match(name):
                raise ValueError(f"'{name}' is not a valid environment variable name")
            if _K8S_SECRET_NAME_RE.search(name):
                raise ValueError(
                    f"'{name}' looks like a secret: its value would be visible in the rendered objects; "
                    f"put it in a Secret and list it under kubernetes.secrets.env ({{var: {name}, secret: NAME, key: KEY}})"
                )
        return {k: str(val) for k, val in v.items()}

    @field_validator("staging_uri")
    @classmethod
    def _staging(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("s3://"):
            raise ValueError(f"staging_uri must be an s3:// prefix, got '{v}'")
        return v.rstrip("/") if v else v


# --- kubeflow pipelines ----------------------------------------------------------------------
class KfpSpec(_Section):
    """How the job runs as a Kubeflow Pipelines run (kfp backend and `kubetune render --backend kfp`).

    The pods of a remote run also take kubernetes.env, kubernetes.secrets (hf_token, s3, env), node_selector,
    tolerations, image_pull_secrets, image_pull_policy, labels, annotations, shm_size and
    active_deadline_seconds from the kubernetes section.
    """

    mode: Literal["local", "remote"] = Field(
        "local", description="local: the KFP local runner runs the pipeline on this machine; remote: a run on a KFP server. "
        "`kubetune run --mode` overrides it."
    )
    host: str | None = Field(
        None, description="KFP API endpoint, e.g. https://ds-pipeline-dspa-team.apps.example.com or http://localhost:8888 "
        "(default: $KF_PIPELINES_ENDPOINT, else the kubeconfig's cluster through the ml-pipeline service proxy)."
    )
    ui_host: str | None = Field(None, description="Base URL of the KFP UI for run links (default: host).")
    namespace: str | None = Field(None, description="Profile namespace of a multi-user KFP (default: the client's context).")
    experiment: str = Field("kubetune", description="Experiment the runs are filed under (created when missing).")
    token_from_kubeconfig: bool = Field(
        False, description="Send the kubeconfig's bearer token (e.g. after `oc login`) when $KUBETUNE_KFP_TOKEN is not set."
    )
    kube_context: str | None = Field(None, description="kubeconfig context for kube credentials and pod logs (default: current).")
    verify_ssl: bool = Field(True, description="Verify the KFP API's TLS certificate.")
    base_image: str | None = Field(
        None, description="Image of every component (default: kubernetes.image, else the kubetune image of this version; "
        "its -cuda, -rocm or -gaudi tag for nvidia.com, amd.com or habana.ai accelerators)."
    )
    package: str | None = Field(
        None, description="pip requirement installed when each component starts, e.g. kubetune==0.1.0 or "
        "'kubetune @ git+https://github.com/ORG/kubetune@main'; '' installs nothing (default: nothing with the kubetune "
        "image, kubetune==<this version> with any other image)."
    )
    pip_index_urls: list[str] = Field(default_factory=list, description="Package indexes for kfp.package (default: pip's).")
    bucket: str | None = Field(
        None, description="s3://BUCKET[/PREFIX] where remote runs put local model/dataset files (default: s3://$KFP_S3_BUCKET)."
    )
    pipeline_root: str | None = Field(None, description="Where the KFP server keeps the run's artifacts (default: the server's).")
    cpu_limit: str | None = Field(None, description="CPU limit of the train task (requests come from resources.cpu).")
    memory_limit: str | None = Field(None, description="Memory limit of the train task (requests come from resources.memory).")
    caching: bool = Field(False, description="Let KFP reuse cached task results (off: every run trains again).")

    _check_limits = field_validator("cpu_limit", "memory_limit", mode="before")(lambda cls, v: check_quantity(v))

    @field_validator("host", "ui_host")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"'{v}' must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v if v.startswith("s3://") else f"s3://{v}"
        if not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", v):
            raise ValueError(f"'{v}' is not an s3://BUCKET[/PREFIX]")
        return v.rstrip("/")


