"""Job specs the Kubernetes tests render: the matrix of issue 6 and a few more."""

from __future__ import annotations

import copy

BASE = {
    "name": "tune-demo",
    "model": {"source": "builtin://tiny-chat"},
    "dataset": {"source": "s3://datasets/capitals/capitals.jsonl"},
    "training": {"max_steps": 5, "batch_size": 2, "max_seq_length": 64},
}

VARIANTS: dict[str, dict] = {
    # CPU only: the smallest job, runs on any node.
    "cpu": {"resources": {"cpu": "2", "memory": "4Gi"}},
    # One NVIDIA GPU, a PVC workspace, secrets by reference, a Kueue queue.
    "gpu-pvc": {
        "model": {"source": "hf://Qwen/Qwen2.5-0.5B-Instruct", "revision": "main"},
        "resources": {"accelerators": 1, "accelerator_type": "nvidia.com/gpu", "cpu": "8", "memory": "32Gi"},
        "output": {"uri": "s3://results/tune-demo"},
        "kubernetes": {
            "namespace": "team-a",
            "queue": "team-a-gpu",
            "workspace": {"volume": "pvc", "size": "100Gi", "storage_class": "fast-ssd"},
            "shm_size": "8Gi",
            "env": {"AWS_ENDPOINT_URL": "http://minio.storage:9000"},
            "secrets": {
                "hf_token": {"secret": "hf-token", "key": "token"},
                "s3": {"secret": "s3-credentials"},
                "env": [{"var": "WANDB_API_KEY", "secret": "wandb", "key": "api-key", "optional": True}],
            },
            "service_account": "trainer",
            "image_pull_secrets": ["regcred"],
            "labels": {"team": "a"},
            "annotations": {"example.com/owner": "ml-platform"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    },
    # Two nodes, four AMD GPUs each: torchrun across nodes.
    "amd-2x4": {
        "resources": {"nodes": 2, "processes_per_node": 4, "accelerators": 4, "accelerator_type": "amd.com/gpu", "memory": "64Gi"},
        "kubernetes": {
            "image": "registry.example.com/kubetune-rocm:0.1.0",
            "node_selector": {"amd.com/gpu.product-name": "Instinct-MI300X"},
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"kubetune.io/job": "tune-demo"}}, "topologyKey": "kubernetes.io/hostname"}
                    ]
                }
            },
        },
    },
    # Eight Gaudi cards with hugepages and a non-root security context (seed 003).
    "gaudi-8": {
        "resources": {"processes_per_node": 8, "accelerators": 8, "accelerator_type": "habana.ai/gaudi", "cpu": "40", "memory": "400Gi"},
        "kubernetes": {
            "image": "registry.example.com/kubetune-gaudi:0.1.0",
            "hugepages": {"page_size": "2Mi", "amount": "9800Mi"},
            "security_context": {
                "run_as_non_root": True,
                "run_as_user": 1000,
                "run_as_group": 1000,
                "fs_group": 1000,
                "allow_privilege_escalation": False,
                "capabilities_add": ["SYS_NICE"],
            },
            "shm_size": "64Gi",
            "active_deadline_seconds": 86400,
        },
    },
    # A MIG slice of an A100/H100.
    "mig": {
        "resources": {"accelerators": 1, "accelerator_type": "nvidia.com/mig-1g.10gb", "memory": "8Gi"},
        "kubernetes": {"node_selector": {"nvidia.com/mig.strategy": "mixed"}},
    },
}

FLAVORS = ("job", "pytorchjob", "trainjob")


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def spec(variant: str, **extra: dict) -> dict:
    """The spec dict of one variant (plus extra top-level sections merged in)."""
    return merge(merge(BASE, VARIANTS[variant]), extra)
