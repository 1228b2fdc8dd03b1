"""Every name other code and clusters agree on: env vars, file names in the run directory, labels."""

from __future__ import annotations

# --- environment variables -------------------------------------------------------------------
ENV_HOME = "KUBETUNE_HOME"  # where builtin models, caches and the local job registry live
ENV_DEBUG = "KUBETUNE_DEBUG"  # "1": show tracebacks for user errors too
ENV_EVENT_STDOUT = "KUBETUNE_EVENTS_STDOUT"  # "1": the worker also prints events to stdout (clusters)
ENV_JOB_ID = "KUBETUNE_JOB_ID"  # the job id a backend gave the worker

# --- the run directory (DESIGN.md section 3) -------------------------------------------------
SPEC_FILE = "spec.yaml"  # resolved spec, secrets redacted
STATUS_FILE = "status.json"  # current state, stage, progress
EVENTS_FILE = "events.jsonl"  # one JSON event a line
LOGS_DIR = "logs"  # worker and stage logs
WORKER_LOG = "worker.log"  # stdout+stderr of the worker process, under LOGS_DIR
CHECKPOINTS_DIR = "checkpoints"  # complete checkpoints only
CHECKPOINT_COMPLETE = "KUBETUNE_COMPLETE"  # marker written last inside a checkpoint directory
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
TERMINAL_STATES = frozenset({STATE_SUCCEEDED, STATE_FAILED, STATE_CANCELLED})

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
