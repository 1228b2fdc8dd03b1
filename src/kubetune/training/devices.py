"""What a job trains on: NVIDIA (CUDA), AMD (ROCm), Intel Gaudi (HPU), Intel GPUs (XPU), Apple (MPS) or the CPU.

:func:`device_info` is the one entry. It asks torch (and ``habana_frameworks`` for Gaudi) which accelerator this
process sees, in that order: Gaudi, CUDA/ROCm, XPU, MPS, else the CPU. The answer is a plain dict that the rest
of training reads::

    {"type": "cuda", "platform": "nvidia", "name": "NVIDIA H200", "count": 1, "bf16": True, "fp16": True}

``type`` is torch's device type (ROCm builds of torch call AMD GPUs ``cuda`` too); ``platform`` tells the
vendors apart. :func:`check_accelerators` compares it with the spec's ``resources`` so that a pod without the
GPUs it asked for fails at once instead of training for hours on its CPU.

Each ``_probe_*`` function is the seam tests fake to select a device type without its hardware.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .. import constants as C
from ..errors import TrainError

__all__ = ["device_info", "check_accelerators", "describe", "is_accelerator", "PLATFORMS"]

# platform -> (torch device type, words for people, the resource names that ask for it)
PLATFORMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nvidia": ("cuda", "NVIDIA GPU (CUDA)", ("nvidia.com/",)),
    "rocm": ("cuda", "AMD GPU (ROCm)", ("amd.com/",)),
    "gaudi": ("hpu", "Intel Gaudi (HPU)", ("habana.ai/",)),
    "xpu": ("xpu", "Intel GPU (XPU)", ("gpu.intel.com/",)),
    "mps": ("mps", "Apple GPU (MPS)", ()),
    "cpu": ("cpu", "CPU", ()),
}


def device_info() -> dict:
    """The device this process trains on (see the module docstring for the dict's keys).

    Gaudi's PyTorch bridge is imported when installed (it registers the ``hpu`` device with torch); the
    other platforms are built into torch.
    """
    for probe in (_probe_hpu, _probe_cuda, _probe_xpu, _probe_mps):
        found = probe()
        if found:
            return found
    return {"type": "cpu", "platform": "cpu", "name": "cpu", "count": 0, "bf16": False, "fp16": False}


def is_accelerator(device: dict) -> bool:
    """Whether ``device`` is anything but the CPU."""
    return device["type"] != "cpu"


def describe(device: dict) -> str:
    """``NVIDIA H200 x8 (cuda, bf16)``: the device in one phrase for events and logs."""
    if not is_accelerator(device):
        return "CPU"
    count = f" x{device['count']}" if device.get("count", 1) > 1 else ""
    dtype = "bf16" if device.get("bf16") else ("fp16" if device.get("fp16") else "fp32")
    return f"{device['name']}{count} ({PLATFORMS[device['platform']][0]}, {PLATFORMS[device['platform']][1]}, {dtype})"


def check_accelerators(resources: Any, device: dict, *, in_pod: bool | None = None) -> list[str]:
    """Compare the spec's ``resources`` with what this process sees.

    Args:
        in_pod: whether this runs in a Kubernetes pod (default: ``KUBERNETES_SERVICE_HOST`` is set, as the
            kubelet sets it in every pod). There, missing accelerators are an error; on a laptop the same spec
            trains on the CPU with a warning, so that one spec runs unchanged in both places.

    Returns:
        Warnings for people (no accelerator outside a pod, an accelerator type that names another vendor,
        more processes than devices).

    Raises:
        TrainError: in a pod, the spec asks for accelerators and the pod sees none: it would train on the CPU,
            many times slower, without saying so.
    """
    asked = resources.accelerators
    kind = resources.accelerator_type
    in_pod = bool(os.environ.get(C.ENV_KUBERNETES_SERVICE_HOST)) if in_pod is None else in_pod
    if asked and not is_accelerator(device) and not in_pod:
        return [f"resources.accelerators={asked} ({kind}) but this machine sees no accelerator: training on the CPU"]
    if asked and not is_accelerator(device):
        visible = {k: os.environ[k] for k in C.ACCELERATOR_VISIBILITY_ENV if k in os.environ}
        seen = f" ({', '.join(f'{k}={v}' for k, v in visible.items())})" if visible else ""
        raise TrainError(
            f"resources.accelerators={asked} ({kind}) but this process sees no accelerator{seen}: torch found no CUDA, "
            "ROCm, Gaudi (HPU), XPU or MPS device, and training would run on the CPU",
            hint="check that the node has the device and its driver, that the image has the matching torch build "
            "(the -cuda image for NVIDIA, -rocm for AMD, -gaudi for Gaudi), and that the device plugin gave the pod "
            "the devices; or set resources.accelerators: 0 to train on the CPU",
        )
    warnings = []
    if asked and is_accelerator(device):
        platform = device["platform"]
        prefixes = PLATFORMS[platform][2]
        if prefixes and not kind.startswith(prefixes) and any(kind.startswith(p) for v in PLATFORMS.values() for p in v[2]):
            warnings.append(f"resources.accelerator_type is {kind} but this process trains on {describe(device)}")
    procs = resources.processes_per_node
    if is_accelerator(device) and device.get("count") and procs > device["count"]:
        warnings.append(
            f"resources.processes_per_node={procs} but this node sees {device['count']} {PLATFORMS[device['platform']][1]} "
            "device(s): several processes share one device"
        )
    return warnings


# --- probes: one per platform, each the seam tests fake ----------------------------------------
def _probe_hpu() -> dict | None:
    try:
        import habana_frameworks.torch.core  # noqa: F401 - registers the hpu device type with torch
        import habana_frameworks.torch.hpu as hthpu
    except Exception:  # not installed, or installed without its driver
        return None
    if not hthpu.is_available():
        return None
    # Gaudi computes in bf16 natively (the precision "auto" picks); fp16 is there from Gaudi2 on.
    name = _safe(hthpu.get_device_name, "Gaudi")
    return {"type": "hpu", "platform": "gaudi", "name": name, "count": _safe(hthpu.device_count, 1), "bf16": True, "fp16": True}


def _probe_cuda() -> dict | None:
    import torch

    if not torch.cuda.is_available():
        return None
    rocm = bool(getattr(torch.version, "hip", None))
    return {
        "type": "cuda",
        "platform": "rocm" if rocm else "nvidia",
        "name": _safe(lambda: torch.cuda.get_device_name(0), "GPU"),
        "count": torch.cuda.device_count(),
        "bf16": bool(_safe(torch.cuda.is_bf16_supported, False)),
        "fp16": True,
    }


def _probe_xpu() -> dict | None:
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None or not _safe(xpu.is_available, False):
        return None
    bf16 = getattr(xpu, "is_bf16_supported", None)
    return {
        "type": "xpu",
        "platform": "xpu",
        "name": _safe(lambda: xpu.get_device_name(0), "Intel GPU"),
        "count": _safe(xpu.device_count, 1),
        "bf16": bool(_safe(bf16, True)) if bf16 else True,
        "fp16": True,
    }


def _probe_mps() -> dict | None:
    import torch

    mps = getattr(torch.backends, "mps", None)
    if mps is None or not _safe(mps.is_available, False):
        return None
    # bf16 on MPS needs macOS 14; fp16 autocast in the trainer is not supported there (kubetune refuses it).
    newer = getattr(mps, "is_macos_or_newer", None)
    bf16 = bool(_safe(lambda: newer(14, 0), False)) if newer else False
    return {"type": "mps", "platform": "mps", "name": "Apple MPS", "count": 1, "bf16": bf16, "fp16": False}


def _safe(fn: Callable[[], Any] | None, default: Any) -> Any:
    # A device query that fails (a driver mismatch) must not stop the job from naming its device.
    if fn is None:
        return default
    try:
        return fn()
    except Exception:
        return default
