"""Every name other code and clusters agree on: env vars, file names in the run directory, labels."""

from __future__ import annotations

from enum import Enum

# --- environment variables -------------------------------------------------------------------
ENV_HOME = "KUBETUNE_HOME"  # where builtin models, caches and the local job registry live
ENV_DEBUG = "KUBETUNE_DEBUG"  # "1": show tracebacks for user errors too
ENV_EVENT_STDOUT = "KUBETUNE_EVENTS_STDOUT"  # "1": the worker also prints events to stdout (clusters)
ENV_JOB_ID = "KUBETUNE_JOB_ID"  # the job id a backend gave the worker
ENV_RUN_LOCK_FD = "KUBETUNE_RUN_LOCK_FD"  # the run directory lock's descriptor a local submitter hands its worker
# The resolved spec (JSON, credentials included) a local backend hands its worker in memory: spec.yaml in the
# run directory is redacted, so the worker cannot read its URIs from there (kubetune/redact.py, worker.py).
ENV_WORKER_SPEC = "KUBETUNE_WORKER_SPEC"
REDACTED = "***"  # what a credential is replaced with wherever kubetune shows, logs or saves it
ENV_PREEMPT_FILE = "KUBETUNE_PREEMPT_FILE"  # set by kubetune's launcher: this file exists once the launcher was preempted

# A command whose stdout was closed by its reader (`kubetune chat ... | head`) ends quietly with this code, what a
# shell reports for a process ended by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141

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
RUN_LOCK_FILE = ".kubetune.lock"  # flock held by the one process tree writing the run directory; holds its pid
WORKSPACE_DIR = "workspace"  # fetched model/data inside the run directory when no cache is used

# Prefix of event lines on stdout, so that cluster logs alone rebuild the status.
EVENT_LINE_PREFIX = "KUBETUNE_EVENT "
# Start of the line a local backend writes into logs/worker.log before each job's worker starts (the log is
# appended per submission): "===== kubetune job ID started TIME =====".
LOG_JOB_HEADER_PREFIX = "===== kubetune job "

# --- states ----------------------------------------------------------------------------------
class JobState(str, Enum):
    """A job's state: ``pending -> running -> succeeded | failed | cancelled | preempted`` (status.json's ``state``).

    A ``str`` enum: a member equals and hashes like its value, so it compares with what status.json holds.
    """

    PENDING = "pending"  # recorded, the worker not started yet
    RUNNING = "running"  # the worker is running (some stage)
    SUCCEEDED = "succeeded"  # ended well: artifacts and result.json complete, DONE written
    FAILED = "failed"  # ended with an error (status.json's reason says why)
    CANCELLED = "cancelled"  # stopped by the user
    # Stopped by a SIGTERM that was not a user's cancel (Kubernetes eviction, spot preemption, `kubetune run`
    # killed): the worker saved a checkpoint at a step boundary first. Terminal for followers; a rerun resumes it.
    PREEMPTED = "preempted"

    def __str__(self) -> str:  # f"{JobState.RUNNING}" is "running" on every Python version
        return self.value

    __format__ = str.__format__

    @property
    def terminal(self) -> bool:
        """Whether a job in this state has ended."""
        return self in TERMINAL_STATES


# The same values as plain strings: what most code compares with, and what it writes into files.
STATE_PENDING = JobState.PENDING.value
STATE_RUNNING = JobState.RUNNING.value
STATE_SUCCEEDED = JobState.SUCCEEDED.value
STATE_FAILED = JobState.FAILED.value
STATE_CANCELLED = JobState.CANCELLED.value
STATE_PREEMPTED = JobState.PREEMPTED.value
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
# pvc://CLAIM: a PersistentVolumeClaim, the kaito flavour's volume input and output (Kaito mounts it; nothing fetches it)
PVC_SCHEME = "pvc"
BUILTIN_TINY_CHAT = "tiny-chat"

# --- job spec limits (spec/, spec/reader.py) -------------------------------------------------
# A spec is short, hand-written data; values far past these are mistakes or attacks, refused at load.
SPEC_MAX_BYTES = 1 << 20  # a spec file (or text) larger than 1 MiB is refused before it is parsed
SPEC_MAX_VALUES = 10_000  # values in a spec once YAML aliases are expanded (the alias-bomb guard); real specs hold < 1,000
SPEC_MAX_DEPTH = 64  # nesting of mappings and lists
SPEC_MAX_EPOCHS = 1000  # training.epochs
SPEC_MAX_STEPS = 10_000_000  # any step count or interval (max_steps, warmup_steps, save_steps, ...)
SPEC_MAX_BATCH = 65_536  # training.batch_size, gradient_accumulation_steps
SPEC_MAX_GLOBAL_BATCH = 1 << 24  # training.global_batch_size
SPEC_MAX_SEQ_LENGTH = 1 << 20  # training.max_seq_length (the model's own limit is checked where its config is known)
SPEC_MAX_SEED = 2**32 - 1  # seeds: numpy's are 32-bit
SPEC_MAX_ROWS = 10**12  # dataset.max_rows
SPEC_MAX_PROCS = 1024  # dataset.num_proc
SPEC_MAX_CPU_THREADS = 1024  # training.cpu_threads
SPEC_MAX_MIX = 256  # dataset.mix entries
SPEC_MAX_WEIGHT = 1e6  # dataset weights (relative to each other)
SPEC_MAX_LORA_ALPHA = 1e5  # method.lora.alpha
SPEC_MAX_WEIGHT_DECAY = 10.0  # training.weight_decay
SPEC_MAX_GRAD_NORM = 1e6  # training.max_grad_norm
SPEC_MAX_KEEP = 10_000  # training.save_total_limit
SPEC_MAX_NODES = 4096  # resources.nodes
SPEC_MAX_PROCESSES = 256  # resources.processes_per_node, resources.accelerators
SPEC_MAX_TIMEOUT_S = 7 * 24 * 3600  # collective and rendezvous timeouts
SPEC_MAX_INT32 = 2**31 - 1  # Kubernetes int32 fields (ttlSecondsAfterFinished, backoffLimit, ids, ...)
SPEC_MAX_TRIALS = 10_000  # a sweep's trials: random draws, or grid combinations
SPEC_MAX_PARALLEL = 1024  # sweep.parallel
OUTPUT_FORBIDDEN_ROOTS = ("/proc", "/sys")  # kernel filesystems: output.dir may not be in them (preflight.py)

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
ENV_MAX_UNPACK_BYTES = "KUBETUNE_MAX_UNPACK_BYTES"  # archive bomb guard: most bytes one archive may unpack to (replaces the default below)
ENV_MAX_UNPACK_FILES = "KUBETUNE_MAX_UNPACK_FILES"  # archive bomb guard: most members one archive may hold
ENV_TRANSFER_CONCURRENCY = "KUBETUNE_TRANSFER_CONCURRENCY"  # parallel streams per transfer (default below)
ENV_S3_TRANSFER_CLIENT = "KUBETUNE_S3_TRANSFER_CLIENT"  # S3 uploads: auto (the AWS CRT client when awscrt is installed), crt, classic
S3_TRANSFER_CLIENTS = ("auto", "crt", "classic")
STORAGE_PART_SUFFIX = ".kubetune-part"  # a download in progress; renamed to its real name once verified
# `kubetune deliver`: written last into a destination folder or S3 prefix, once every file was verified (a
# record of the source and each file's size and sha256); a destination without it is incomplete
DELIVER_MARKER = ".kubetune-delivered.json"
STORAGE_SYNC_DIR = ".kubetune-sync"  # in the run directory: hard-linked snapshots of checkpoints being uploaded
STORAGE_UNPACK_RATIO = 100  # an archive may unpack to this many times its own (compressed) size by default...
STORAGE_UNPACK_MIN_BYTES = 64 * 1024 * 1024  # ...or to this many bytes, whichever is more (so tiny archives work)
STORAGE_MAX_UNPACK_FILES = 100_000  # members one archive may hold by default (models hold tens, datasets hundreds)
STORAGE_MAX_LINK_TARGET = 4096  # bytes: a symlink target longer than PATH_MAX is refused, not read into memory
STORAGE_MAX_TAR_HEADER = 1 << 20  # bytes: a tar long-name or pax header bigger than this is refused, not read
STORAGE_UNPACK_PREFIX = ".kubetune-unpack-"  # private folder inside the destination an archive is unpacked into first
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
# Resource-name prefix -> tag suffix of the image kubetune ships for it (deploy/Dockerfile.cuda, .rocm, .gaudi).
K8S_ACCELERATOR_TAG_SUFFIXES = {"nvidia.com/": K8S_CUDA_TAG_SUFFIX, "amd.com/": "-rocm", "habana.ai/": "-gaudi"}
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
K8S_KAITO_PRESIGN_SECONDS = 7 * 24 * 3600  # a staged dataset's presigned URL for Kaito's data-downloader: SigV4's longest
K8S_KAITO_OUTPUT_DIR = "/mnt/output"  # TrainingArguments.output_dir: Kaito's results volume, pushed as the output image
# `kubetune deliver --backend kubernetes`: the copy as a batch/v1 Job
LABEL_DELIVER = f"{LABEL_PREFIX}/deliver"  # on the Job and its pods: the delivery's name
K8S_DELIVER_CONTAINER = "deliver"  # the Job's one container (runs `kubetune deliver SRC DEST`)
K8S_DELIVER_RETRIES = 3  # default backoffLimit: pods started again after a failed attempt
K8S_DELIVER_TTL_S = 24 * 3600  # ttlSecondsAfterFinished: a finished delivery Job (and its logs) is removed after a day
# `kubetune cluster check`: where a standalone or multi-user Kubeflow Pipelines install puts its API Service
K8S_KFP_NAMESPACE = "kubeflow"
K8S_KFP_SERVICE = "ml-pipeline"
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
SWEEP_SAMPLER_GRID = "grid"  # sweep.sampler: every combination of the grid
SWEEP_SAMPLER_RANDOM = "random"  # sweep.sampler: sweep.trials draws, all planned up front
SWEEP_SAMPLER_TPE = "tpe"  # sweep.sampler: sweep.trials chosen one by one by Optuna's TPESampler (ask-and-tell)
SWEEP_RULE_MEDIAN = "median"  # sweep.early_stopping.rule: kubetune's own median stopping rule
SWEEP_RULE_HYPERBAND = "hyperband"  # sweep.early_stopping.rule: Optuna's HyperbandPruner
SWEEP_RULE_HALVING = "successive_halving"  # sweep.early_stopping.rule: Optuna's SuccessiveHalvingPruner
SWEEP_OPTUNA_DB = "optuna.db"  # in the sweep directory: the Optuna study (SQLite) of a tpe sweep or of hyperband/successive_halving pruning
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
# Fair sharing of the transformers engine's batch between requests (serve/engine.py):
SERVE_PREEMPT_MIN_STEPS = 32  # a request holding no row may preempt a row that has decoded this many steps since it joined
SERVE_PREFILL_TOKENS_PER_STEP = 8192  # most tokens prefilled in one step (at least one row joins): long joins spread out
# Admission control (serve/admission.py). A request occupies, per sequence (prompts x n), prompt + max_tokens tokens.
SERVE_MAX_REQUEST_TOKENS = 65536  # default --max-request-tokens (or the context length when that is larger)
SERVE_MAX_QUEUED_TOKENS = 262144  # default --max-queued-tokens: at least this ...
SERVE_QUEUED_PER_REQUEST = 4  # ... and at least this many of the largest requests at once
SERVE_BUDGET_RESERVE_FRACTION = 8  # the last 1/8 of the queued-token budget is kept for small requests ...
SERVE_BUDGET_SMALL_FRACTION = 64  # ... those occupying at most 1/64 of it
SERVE_CHARS_PER_TOKEN_MARGIN = 4  # text longer than context x longest token x this cannot fit: refused before tokenizing
SERVE_RETRY_AFTER_MIN_S = 1  # Retry-After of a 429: an estimate from the engine's pace, within these bounds
SERVE_RETRY_AFTER_MAX_S = 60  # (the openai client honours Retry-After up to 60 s)
SERVE_MAX_REQUEST_BYTES = 16 * 1024 * 1024  # default --max-request-bytes: larger bodies are a 413, never parsed

# --- data preparation ---
DATA_CACHE_SUBDIR = "data"  # under CACHE_DIR: prepared (tokenized) datasets, keyed by data + tokenizer + settings
DATA_CACHE_KEEP = 16  # prepared datasets kept in the cache (least recently used go first)
PREPROCESS_CACHE_SUBDIR = "preprocessed"  # under CACHE_DIR: rows after dataset.preprocess, keyed by data + the code's content
PREPROCESS_ROWS_FILE = "rows.jsonl"  # in a preprocessed entry: the function's rows, one JSON object a line
ENV_MAX_ROW_BYTES = "KUBETUNE_MAX_ROW_BYTES"  # most bytes one dataset row may take (a bigger row stops the job)
DATA_MAX_ROW_BYTES = 16 * 1024 * 1024  # default of the above: one row is read whole, then parsed and tokenized

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
ENV_RANK = "RANK"  # set by torchrun: this process's global rank (read through kubetune.ranks)
ENV_LOCAL_RANK = "LOCAL_RANK"  # set by torchrun: this process's rank on its node (its accelerator index)
ENV_WORLD_SIZE = "WORLD_SIZE"  # set by torchrun: processes in the job
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"  # set by torchrun: processes on this node (they share its CPU cores)
# Set ("1") by kubetune's launcher when the user set no OMP_NUM_THREADS: the 1 torchrun then puts there is its
# default, not the user's choice, so each rank chooses its CPU threads itself (kubetune/cpu.py).
ENV_THREADS_AUTO = "KUBETUNE_CPU_THREADS_AUTO"
ENV_LAUNCHER_PID = "KUBETUNE_LAUNCHER_PID"  # pid of `python -m kubetune.launch`; rank 0 records it, that launcher records the job's end

# Preference tuning (method.objective dpo, orpo): TRL's log keys -> kubetune's names in events, status and result.json.
PREFERENCE_LOG_KEYS = {
    "rewards/accuracies": "reward_accuracy",  # share of pairs whose chosen answer out-scores the rejected one
    "rewards/margins": "reward_margin",  # mean reward(chosen) - reward(rejected)
    "rewards/chosen": "rewards_chosen",
    "rewards/rejected": "rewards_rejected",
    "logps/chosen": "logps_chosen",  # mean log-probability of the chosen answers under the policy
    "logps/rejected": "logps_rejected",
    "nll_loss": "nll_loss",  # ORPO's SFT term
    "log_odds_ratio": "log_odds_ratio",  # ORPO's preference term
}
# The preference metrics status.json carries (under its extra fields) and `kubetune status` shows.
PREFERENCE_STATUS_KEYS = ("reward_accuracy", "reward_margin", "eval_reward_accuracy", "eval_reward_margin")

# --- accelerators and device telemetry (training/devices.py, training/telemetry.py) ---
# Environment variables that narrow which accelerators a process sees; an error naming them helps when a pod
# asked for devices and sees none.
ACCELERATOR_VISIBILITY_ENV = (
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
)
ENV_KUBERNETES_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every pod: the worker runs in a cluster
TELEMETRY_INTERVAL_S = 5.0  # seconds between two device samples (utilization, memory, power) during training
ENV_TELEMETRY_INTERVAL = "KUBETUNE_TELEMETRY_INTERVAL"  # overrides it; 0 turns sampling off
HL_SMI = "hl-smi"  # Intel Gaudi's management tool (device telemetry)
ROCM_SMI = "rocm-smi"  # AMD's management tool, used when the amdsmi library is not installed

# --- custom training functions (spec.entrypoint, kubetune.train(func=...), training/custom.py) ---
ENTRYPOINT_MAX_SOURCE_CHARS = 32 * 1024  # entrypoint.source: one function's text; the local worker gets the spec in an env var
ENTRYPOINT_MAX_FILE_BYTES = 512 * 1024  # entrypoint.file shipped in a ConfigMap (Kubernetes caps one at 1 MiB)
ENTRYPOINT_MAX_PACKAGES = 64  # entrypoint.packages: requirement lines
ENTRYPOINT_MODULE_NAME = "kubetune_entrypoint"  # the module name a file or source entrypoint is loaded under
ENTRYPOINT_SOURCE_FILENAME = "<kubetune entrypoint {function}>"  # the traceback's file name of a source entrypoint
# The spec ConfigMap's key (and KFP task's file name) holding the function's source, mounted beside spec.yaml: the
# entrypoint.file's own name where it is a plain *.py name, so tracebacks and reasons name the same file everywhere.
K8S_ENTRYPOINT_KEY = "entrypoint.py"  # ... else (entrypoint.source, an odd file name) this one
# pip in the pod before the worker (entrypoint.packages): quiet, no cache, no upgrade nag; "$@" runs the worker.
K8S_PIP_INSTALL = "python -m pip install --no-cache-dir --disable-pip-version-check -q"
