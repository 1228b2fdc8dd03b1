"""Every name other code and clusters agree on: env vars, file names in the run directory, labels."""

from __future__ import annotations

# --- environment variables -------------------------------------------------------------------
ENV_HOME = "KUBETUNE_HOME"  # where builtin models, caches and the local job registry live
ENV_DEBUG = "KUBETUNE_DEBUG"  # "1": show tracebacks for user errors too
ENV_EVENT_STDOUT = "KUBETUNE_EVENTS_STDOUT"  # "1": the worker also prints events to stdout (clusters)
ENV_JOB_ID = "KUBETUNE_JOB_ID"  # the job id a backend gave the worker
ENV_PREEMPT_FILE = "KUBETUNE_PREEMPT_FILE"  # set by kubetune's launcher: this file exists once the launcher was preempted

# --- the run directory (DESIGN.md section 3) -------------------------------------------------
SPEC_FILE = "spec.yaml"  # resolved spec, secrets redacted
STATUS_FILE = "status.json"  # current state, stage, progress
EVENTS_FILE = "events.jsonl"  # one JSON event a line
LOGS_DIR = "logs"  # worker and stage logs
WORKER_LOG = "worker.log"  # stdout+stderr of the worker process, under LOGS_DIR
CHECKPOINTS_DIR = "checkpoints"  # complete checkpoints only
CHECKPOINT_COMPLETE = "KUBETUNE_COMPLETE"  # marker written last inside a checkpoint directory
# Files up to this size get a sha256 in the completion marker (every file gets its size): hashing runs in the
# training loop at about 0.8 GB/s on one core, so a LoRA checkpoint is fully hashed in well under a second while
# a full fine-tune's multi-GB weight and optimizer files are checked by size only.
CHECKPOINT_DIGEST_MAX_BYTES = 256 * 1024 * 1024
CHECKPOINT_QUARANTINE_PREFIX = "corrupt-"  # a checkpoint that fails verification is moved aside to corrupt-checkpoint-N
CANCEL_REQUEST_FILE = "CANCEL_REQUESTED"  # written by `kubetune cancel` before it signals: a user's cancel, not a preemption
ADAPTER_DIR = "adapter"  # LoRA/QLoRA/DoRA adapter (PEFT format)
MODEL_DIR = "model"  # full fine-tune result
MERGED_DIR = "merged"  # base + adapter merged
RESULT_FILE = "result.json"  # final metrics
DONE_FILE = "DONE"  # sentinel written last
WORKSPACE_DIR = "workspace"  # fetched model/data inside the run directory when no cache is used

# Prefix of event lines on stdout, so that cluster logs alone rebuild the status.
EVENT_LINE_PREFIX = "KUBETUNE_EVENT "

# --- states ----------------------------------------------------------------------------------
STATE_PENDING = "pending"
STATE_RUNNING = "running"
STATE_SUCCEEDED = "succeeded"
STATE_FAILED = "failed"
STATE_CANCELLED = "cancelled"
# Stopped by a SIGTERM that was not a user's cancel (Kubernetes eviction, spot preemption, `kubetune run` killed):
# the worker saved a checkpoint at a step boundary first. Terminal for followers; rerunning the spec resumes it.
STATE_PREEMPTED = "preempted"
# A local job still pending without a worker pid this long after its last update was never started: the
# process that submitted it ended between recording the job and starting its worker.
LOCAL_START_GRACE_S = 30.0
REASON_NEVER_STARTED = "the job was never started: the process that submitted it ended before starting its worker"
TERMINAL_STATES = frozenset({STATE_SUCCEEDED, STATE_FAILED, STATE_CANCELLED, STATE_PREEMPTED})
# Seconds a preempted job has to finish its current step and save a checkpoint: kubetune's launcher waits this
# long for its ranks before killing them, and `kubetune run` in the foreground as long for its worker.
PREEMPT_SAVE_TIMEOUT_S = 270
# Pods' terminationGracePeriodSeconds: the save above plus time to upload to output.uri's queue and record the end.
K8S_TERMINATION_GRACE_SECONDS = PREEMPT_SAVE_TIMEOUT_S + 30

# --- stages of the worker --------------------------------------------------------------------
STAGE_FETCH = "fetch"
STAGE_PREPARE = "prepare"
STAGE_TRAIN = "train"
STAGE_PUBLISH = "publish"

# --- builtin models --------------------------------------------------------------------------
BUILTIN_SCHEME = "builtin"
BUILTIN_TINY_CHAT = "tiny-chat"

# --- Kubernetes labels and annotations -------------------------------------------------------
LABEL_PREFIX = "kubetune.io"
LABEL_JOB = f"{LABEL_PREFIX}/job"  # the job's name
LABEL_RUN_ID = f"{LABEL_PREFIX}/run-id"  # unique id of one submission
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "kubetune"

# --- storage ---
CACHE_DIR = "cache"  # under the kubetune home: fetched models/datasets, keyed by URI + revision/ETag
ENV_AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # S3-protocol endpoint (MinIO, moto, Ceph); boto3 honours it too
ENV_AWS_ENDPOINT_URL_S3 = "AWS_ENDPOINT_URL_S3"  # S3-only endpoint; wins over AWS_ENDPOINT_URL
ENV_HF_TOKEN = "HF_TOKEN"  # Hugging Face Hub token (read by huggingface_hub itself)
ENV_REGISTRY_USERNAME = "KUBETUNE_REGISTRY_USERNAME"  # OCI registry user (else the docker config is read)
ENV_REGISTRY_PASSWORD = "KUBETUNE_REGISTRY_PASSWORD"  # OCI registry password or token
ENV_REGISTRY_PLAIN_HTTP = "KUBETUNE_REGISTRY_PLAIN_HTTP"  # "1" or comma-separated hosts: talk plain http
ENV_DOCKER_CONFIG = "DOCKER_CONFIG"  # directory of config.json with registry credentials (docker's own)
ENV_MAX_UNPACK_BYTES = "KUBETUNE_MAX_UNPACK_BYTES"  # archive bomb guard: most bytes one archive may unpack to
ENV_MAX_UNPACK_FILES = "KUBETUNE_MAX_UNPACK_FILES"  # archive bomb guard: most members one archive may hold
ENV_TRANSFER_CONCURRENCY = "KUBETUNE_TRANSFER_CONCURRENCY"  # parallel streams per transfer (default below)
STORAGE_PART_SUFFIX = ".kubetune-part"  # a download in progress; renamed to its real name once verified
STORAGE_SYNC_DIR = ".kubetune-sync"  # in the run directory: hard-linked snapshots of checkpoints being uploaded
STORAGE_MAX_UNPACK_BYTES = 1 << 40  # 1 TiB
STORAGE_MAX_UNPACK_FILES = 1_000_000
STORAGE_CONCURRENCY = 10  # parallel requests per transfer
STORAGE_MULTIPART_THRESHOLD = 16 * 1024 * 1024  # S3: files at least this big go multipart
STORAGE_MULTIPART_CHUNKSIZE = 16 * 1024 * 1024  # S3: part size
STORAGE_RETRY_ATTEMPTS = 8  # tries per request on transient errors (5xx, resets, throttling)
STORAGE_RETRY_BASE_DELAY = 0.5  # seconds; doubled each retry, with jitter
STORAGE_RETRY_MAX_DELAY = 20.0  # seconds; cap of one backoff
S3_META_PART_SIZE = "kubetune-part-size"  # object metadata: part size of a multipart upload (ETag checks)
OCI_DATA_DIR = "data"  # Kaito's data images keep their files under /data
OCI_ANNOTATION_TITLE = "org.opencontainers.image.title"  # file name of a layer (ORAS convention)
OCI_ANNOTATION_CREATED = "org.opencontainers.image.created"
OCI_ANNOTATION_UNPACK = "io.deis.oras.content.unpack"  # ORAS: this tar+gzip layer is a directory
OCI_ANNOTATION_BASE_MODEL = f"{LABEL_PREFIX}/base-model"  # manifest annotation: the adapter's base model
OCI_ANNOTATION_METHOD = f"{LABEL_PREFIX}/method"  # manifest annotation: lora, qlora, dora, full
OCI_ANNOTATION_KIND = f"{LABEL_PREFIX}/kind"  # adapter, model, merged, checkpoint, files
OCI_ARTIFACT_ADAPTER = "application/vnd.kubetune.adapter.v1"  # artifactType / config media type family
OCI_MEDIA_ADAPTER_CONFIG = "application/vnd.kubetune.adapter.config.v1+json"  # adapter_config.json layer
OCI_MEDIA_ADAPTER_WEIGHTS = "application/vnd.kubetune.adapter.weights.v1.safetensors"  # adapter_model.safetensors
OCI_MEDIA_RUN_CONFIG = "application/vnd.kubetune.run.config.v1+json"  # manifest config: base model, method, metrics
OCI_MEDIA_FILE = "application/vnd.oci.image.layer.v1.tar"  # a plain file (what `oras push` uses)
OCI_MEDIA_TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"  # a packed directory / image layer
OCI_MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MEDIA_EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"

# --- kubernetes ---
K8S_IMAGE_REPO = "ghcr.io/kubetune/kubetune"  # default worker image (deploy/Dockerfile), tagged with the package version
K8S_CUDA_TAG_SUFFIX = "-cuda"  # tag suffix of the CUDA image (deploy/Dockerfile.cuda)
K8S_SPEC_DIR = "/etc/kubetune"  # where the spec ConfigMap is mounted
K8S_SPEC_KEY = "spec.yaml"  # the ConfigMap key holding the resolved spec
K8S_SPEC_PATH = f"{K8S_SPEC_DIR}/{K8S_SPEC_KEY}"  # the worker's --spec inside every container
K8S_WORKSPACE = "/workspace"  # the workspace volume (emptyDir or PVC)
K8S_MODEL_DIR = f"{K8S_WORKSPACE}/model"  # the model fetched by an init container
K8S_DATA_DIR = f"{K8S_WORKSPACE}/data"  # the training data fetched by an init container
K8S_EVAL_DIR = f"{K8S_WORKSPACE}/eval"  # the evaluation data fetched by an init container
K8S_OUTPUT_DIR = f"{K8S_WORKSPACE}/output"  # the worker's run directory (output.dir)
K8S_HOME_DIR = f"{K8S_WORKSPACE}/.kubetune"  # KUBETUNE_HOME inside the pod (builtin models, caches)
K8S_HF_HOME = f"{K8S_WORKSPACE}/.cache/huggingface"  # HF_HOME inside the pod
K8S_SHM_DIR = "/dev/shm"  # shared memory for dataloaders and NCCL
K8S_HUGEPAGES_DIR = "/hugepages"  # hugepages volume (Gaudi)
K8S_RDZV_PORT = 29500  # torchrun master port of the plain Job flavour (headless Service)
K8S_PYTORCHJOB_PORT = 23456  # the training operator's default port, named pytorchjob-port
K8S_MAIN_CONTAINER = {"job": "worker", "pytorchjob": "pytorch", "trainjob": "node"}  # main container per flavour
K8S_TRAINJOB_RUNTIME = "torch-distributed"  # Kubeflow Trainer's ClusterTrainingRuntime for torchrun
K8S_TRAINJOB_STEP = "node"  # the runtime's replicated job that runs the trainer
K8S_KAITO_API_VERSION = "kaito.sh/v1beta1"  # the kaito flavour's Workspace (v1beta1 is the CRD's storage version)
K8S_KAITO_CONFIG_SUFFIX = "kaito-config"  # <job>-kaito-config: the ConfigMap of Kaito's training config
K8S_KAITO_CONFIG_KEY = "training_config.yaml"  # the key Kaito reads from that ConfigMap
K8S_KAITO_OUTPUT_DIR = "/mnt/output"  # TrainingArguments.output_dir: Kaito's results volume, pushed as the output image
LABEL_FLAVOR = f"{LABEL_PREFIX}/flavor"  # job | pytorchjob | trainjob
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"  # Kueue LocalQueue admitting the workload
ANNOTATION_CANCELLED = f"{LABEL_PREFIX}/cancelled"  # set by `kubetune cancel` before deleting
ANNOTATION_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # index of an Indexed Job's pod
ENV_HF_TOKEN = "HF_TOKEN"  # Hugging Face token (from a Secret)
ENV_AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"  # S3 credentials (from a Secret)
ENV_AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
ENV_KUBEFLOW_STATUS_URL = "KUBEFLOW_TRAINER_STATUS_URL"  # Kubeflow Trainer progress endpoint (KEP-2779), when enabled
ENV_KUBEFLOW_STATUS_CA = "KUBEFLOW_TRAINER_STATUS_CA_CERT"
ENV_KUBEFLOW_STATUS_TOKEN = "KUBEFLOW_TRAINER_STATUS_TOKEN"

# --- sweeps ---
SWEEP_FILE = "sweep.json"  # in the sweep directory: plan, trials, their job refs and results (written atomically)
SWEEP_LOCK_FILE = ".lock"  # in the sweep directory: flock held by the one process running the sweep
SWEEP_TRIALS_DIR = "trials"  # in the sweep directory: one run directory per trial
SWEEP_LOG = "sweep.log"  # in the sweep directory: output of a detached sweep (kubetune sweep --detach)
SWEEP_RESULTS_CSV = "results.csv"  # reports written into the sweep directory when a sweep ends
SWEEP_RESULTS_JSON = "results.json"
SWEEP_PLOT = "loss.png"  # loss curves of all trials (needs matplotlib: the sweep extra)
SWEEP_REPORT = "report.html"  # table + plot in one self-contained page
SWEEP_REGISTRY_DIR = "sweeps"  # under the kubetune home: <sweep id>.json -> sweep directory
SWEEP_CORES_PER_TRIAL = 4  # default local CPU parallelism: one trial per this many cores
SWEEP_CLUSTER_PARALLEL = 4  # default trials at once on kubernetes/kfp (the cluster's queue does the rest)
SWEEP_POLL_SECONDS = 1.0  # how often a running sweep looks at its trials
TRIAL_PRUNED = "pruned"  # sweep-level trial state: stopped early by the median rule (not rerun)
TRIAL_INTERRUPTED = "interrupted"  # sweep-level trial state: the sweep stopped before the trial ended (rerun resumes it)
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"  # CPU threads of one local trial (cores shared between parallel trials)
ENV_MKL_NUM_THREADS = "MKL_NUM_THREADS"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # the accelerators one local trial may use (honoured by ROCm too)

# --- serving (kubetune serve, kubetune render-serve) ---
ENV_SERVE_API_KEY = "KUBETUNE_API_KEY"  # the server's bearer key (keeps it out of `ps`); also what `kubetune chat URL` sends
SERVE_HOST = "127.0.0.1"  # default bind: loopback; exposing the server is a deliberate --host choice
SERVE_PORT = 8000  # the port vLLM and most OpenAI-compatible servers use
SERVE_BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch
SERVE_METRIC_PREFIX = "kubetune_serve"  # Prometheus metric names start with this
SERVE_VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"  # the vLLM OpenAI server image of rendered Deployments
SERVE_VLLM_MODULE = "vllm.entrypoints.openai.api_server"  # `python -m` entry point of vLLM's server (every version)
SERVE_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # values vLLM accepts for --max-lora-rank
SERVE_MODELS_DIR = "/models"  # in the serving pod: the fetched base model and adapters
SERVE_BASE_DIR = f"{SERVE_MODELS_DIR}/base"  # the base (or merged/full) model inside the serving pod
SERVE_ADAPTERS_DIR = f"{SERVE_MODELS_DIR}/adapters"  # one sub-folder per adapter inside the serving pod
SERVE_CONTAINER = "vllm"  # main container of the serving Deployment
LABEL_COMPONENT = "app.kubernetes.io/component"  # "serve" on serving objects, so they never match a training job's pods
COMPONENT_SERVE = "serve"

# --- data preparation ---
DATA_CACHE_SUBDIR = "data"  # under CACHE_DIR: prepared (tokenized) datasets, keyed by data + tokenizer + settings
DATA_CACHE_KEEP = 16  # prepared datasets kept in the cache (least recently used go first)

# --- kubeflow pipelines ---
ENV_KFP_ENDPOINT = "KF_PIPELINES_ENDPOINT"  # KFP API endpoint (the kfp SDK reads it too)
ENV_KFP_TOKEN = "KUBETUNE_KFP_TOKEN"  # bearer token for the KFP API (e.g. `oc whoami -t` on OpenShift AI)
ENV_KFP_S3_BUCKET = "KFP_S3_BUCKET"  # bucket where remote runs get local model/dataset files (seed 000's variable)
KFP_JOBS_DIR = "kfp-jobs"  # under the kubetune home: one JSON file per KFP submission (local and remote)
KFP_LOCAL_ROOT = "kfp"  # in the run directory: the local runner's pipeline root (every task's KFP artifacts)
KFP_STAGING_PREFIX = "kubetune-staging"  # under the bucket: <job>/<id>/{model,dataset,eval}/ uploaded inputs
KFP_API_PREFIX = "/apis/v2beta1"  # the KFP v2 REST API (healthz, experiments, runs)
KFP_RUN_URL = "{ui}/#/runs/details/{run_id}"  # a run's page in the KFP UI
KFP_MAIN_CONTAINER = "main"  # the container of a KFP task pod that runs the component

# --- distributed training ---
ENV_LAUNCHER_PID = "KUBETUNE_LAUNCHER_PID"  # pid of `python -m kubetune.distributed`; rank 0 records it, that launcher records the job's end
