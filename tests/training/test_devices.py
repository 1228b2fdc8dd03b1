"""Which device a job trains on, and in which precision: CUDA, ROCm, Gaudi, XPU, MPS and the CPU.

Each platform's detection point is faked at the smallest seam (torch's own availability queries, and the
``habana_frameworks`` modules for Gaudi); the CPU runs for real, and CUDA runs for real on a GPU machine
(bench/gpu_checks.py).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from kubetune.errors import TrainError
from kubetune.spec import load_spec
from kubetune.training import devices
from kubetune.training.devices import check_accelerators, describe, device_info
from kubetune.training.model import precision

from .conftest import events, small, status


@pytest.fixture
def no_accelerator(monkeypatch):
    """This machine as the tests see it: every accelerator query says no (the real answer on CI, made explicit)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)  # import fails: Gaudi's bridge not installed
    return monkeypatch


def _fake_cuda(mp, *, name, bf16, count=1, hip=None):
    mp.setattr(torch.cuda, "is_available", lambda: True)
    mp.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    mp.setattr(torch.cuda, "device_count", lambda: count)
    mp.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    mp.setattr(torch.version, "hip", hip)


def _fake_habana(mp, *, available=True, name="GAUDI2", count=8):
    pkg = types.ModuleType("habana_frameworks")
    tpkg = types.ModuleType("habana_frameworks.torch")
    core = types.ModuleType("habana_frameworks.torch.core")
    hpu = types.ModuleType("habana_frameworks.torch.hpu")
    hpu.is_available = lambda: available
    hpu.get_device_name = lambda: name
    hpu.device_count = lambda: count
    pkg.torch, tpkg.core, tpkg.hpu = tpkg, core, hpu
    for mod in (pkg, tpkg, core, hpu):
        mp.setitem(sys.modules, mod.__name__, mod)


def test_cpu_when_nothing_else(no_accelerator):
    d = device_info()
    assert d["type"] == d["platform"] == "cpu" and not d["bf16"] and not d["fp16"]
    assert describe(d) == "CPU"


def test_nvidia_gpu(no_accelerator):
    _fake_cuda(no_accelerator, name="NVIDIA H100 80GB HBM3", bf16=True, count=8)
    d = device_info()
    assert (d["type"], d["platform"], d["name"], d["count"], d["bf16"]) == ("cuda", "nvidia", "NVIDIA H100 80GB HBM3", 8, True)
    assert describe(d) == "NVIDIA H100 80GB HBM3 x8 (cuda, NVIDIA GPU (CUDA), bf16)"


def test_rocm_gpu_is_told_apart_from_nvidia(no_accelerator):
    _fake_cuda(no_accelerator, name="AMD Instinct MI300X", bf16=True, hip="6.2.41133")
    d = device_info()
    assert (d["type"], d["platform"]) == ("cuda", "rocm")  # torch's ROCm build calls the device cuda
    assert "AMD GPU (ROCm)" in describe(d)


def test_gaudi_wins_and_its_bridge_is_imported(no_accelerator):
    _fake_cuda(no_accelerator, name="NVIDIA A10", bf16=True)  # a Gaudi node never has both; Gaudi is asked first
    _fake_habana(no_accelerator, name="GAUDI2", count=8)
    d = device_info()
    assert (d["type"], d["platform"], d["name"], d["count"], d["bf16"]) == ("hpu", "gaudi", "GAUDI2", 8, True)


def test_gaudi_bridge_without_a_card_falls_through(no_accelerator):
    _fake_habana(no_accelerator, available=False)
    assert device_info()["type"] == "cpu"


def test_intel_xpu(no_accelerator):
    no_accelerator.setattr(torch.xpu, "is_available", lambda: True)
    no_accelerator.setattr(torch.xpu, "get_device_name", lambda i=0: "Intel(R) Data Center GPU Max 1550")
    no_accelerator.setattr(torch.xpu, "device_count", lambda: 2)
    no_accelerator.setattr(torch.xpu, "is_bf16_supported", lambda *a, **k: True)
    d = device_info()
    assert (d["type"], d["platform"], d["count"], d["bf16"]) == ("xpu", "xpu", 2, True)


@pytest.mark.parametrize("macos14", [True, False])
def test_apple_mps(no_accelerator, macos14):
    no_accelerator.setattr(torch.backends.mps, "is_available", lambda: True)
    no_accelerator.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos14, raising=False)
    d = device_info()
    assert (d["type"], d["platform"], d["bf16"], d["fp16"]) == ("mps", "mps", macos14, False)


def test_a_broken_driver_query_does_not_stop_detection(no_accelerator):
    _fake_cuda(no_accelerator, name="x", bf16=True)

    def broken(*a, **k):
        raise RuntimeError("CUDA driver version is insufficient")

    no_accelerator.setattr(torch.cuda, "get_device_name", broken)
    no_accelerator.setattr(torch.cuda, "is_bf16_supported", broken)
    d = device_info()
    assert d["type"] == "cuda" and d["name"] == "GPU" and d["bf16"] is False


# --- the precision each device trains in ---------------------------------------------------------
_DEVICES = {
    "h100": {"type": "cuda", "platform": "nvidia", "name": "H100", "count": 1, "bf16": True, "fp16": True},
    "v100": {"type": "cuda", "platform": "nvidia", "name": "V100", "count": 1, "bf16": False, "fp16": True},
    "mi300": {"type": "cuda", "platform": "rocm", "name": "MI300X", "count": 1, "bf16": True, "fp16": True},
    "gaudi": {"type": "hpu", "platform": "gaudi", "name": "GAUDI2", "count": 1, "bf16": True, "fp16": True},
    "xpu": {"type": "xpu", "platform": "xpu", "name": "Max 1550", "count": 1, "bf16": True, "fp16": True},
    "mps13": {"type": "mps", "platform": "mps", "name": "Apple MPS", "count": 1, "bf16": False, "fp16": False},
    "mps14": {"type": "mps", "platform": "mps", "name": "Apple MPS", "count": 1, "bf16": True, "fp16": False},
    "cpu": {"type": "cpu", "platform": "cpu", "name": "cpu", "count": 0, "bf16": False, "fp16": False},
}


@pytest.mark.parametrize(
    "device,method,weights,amp",
    [
        ("h100", "lora", "bfloat16", "bf16"),
        ("v100", "lora", "float16", "fp16"),
        ("v100", "full", "float32", "fp16"),  # fp32 master weights under loss scaling
        ("mi300", "lora", "bfloat16", "bf16"),
        ("gaudi", "lora", "bfloat16", "bf16"),
        ("xpu", "full", "bfloat16", "bf16"),
        ("mps14", "lora", "bfloat16", "bf16"),
        ("mps13", "lora", "float32", None),
        ("cpu", "lora", "float32", None),
    ],
)
def test_auto_precision_per_device(tiny_job, device, method, weights, amp):
    job = load_spec(small(tiny_job, method={"type": method}))
    p = precision(job, _DEVICES[device])
    assert (p.weights, p.amp) == (weights, amp)


@pytest.mark.parametrize("device", ["cpu", "mps14"])
def test_float16_refused_where_it_cannot_train(tiny_job, device):
    job = load_spec(small(tiny_job, model={"source": "builtin://tiny-chat", "dtype": "float16"}))
    with pytest.raises(TrainError, match="model.dtype float16 needs a GPU with fp16 training"):
        precision(job, _DEVICES[device])


# --- the spec's accelerators against what the process sees ---------------------------------------
def _resources(tiny_job, **r):
    return load_spec(small(tiny_job, resources=r)).resources


def test_missing_accelerators_fail_in_a_pod(tiny_job, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(TrainError) as e:
        check_accelerators(_resources(tiny_job, accelerators=2, processes_per_node=2), _DEVICES["cpu"], in_pod=True)
    msg = str(e.value)
    assert "resources.accelerators=2 (nvidia.com/gpu)" in msg and "CUDA_VISIBLE_DEVICES=" in msg
    assert "resources.accelerators: 0" in e.value.hint


def test_missing_accelerators_warn_on_a_laptop(tiny_job):
    warnings = check_accelerators(_resources(tiny_job, accelerators=1), _DEVICES["cpu"], in_pod=False)
    assert warnings == ["resources.accelerators=1 (nvidia.com/gpu) but this machine sees no accelerator: training on the CPU"]


def test_pod_is_told_by_the_kubelets_variable(tiny_job, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with pytest.raises(TrainError):
        check_accelerators(_resources(tiny_job, accelerators=1), _DEVICES["cpu"])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert check_accelerators(_resources(tiny_job, accelerators=1), _DEVICES["cpu"])


def test_wrong_vendor_and_too_many_processes_are_warned(tiny_job):
    gaudi = _resources(tiny_job, accelerators=8, processes_per_node=8, accelerator_type="habana.ai/gaudi")
    h100x4 = {**_DEVICES["h100"], "count": 4}
    warnings = check_accelerators(gaudi, h100x4, in_pod=True)
    assert any("accelerator_type is habana.ai/gaudi" in w for w in warnings)
    assert any("processes_per_node=8 but this node sees 4" in w for w in warnings)
    # The right vendor, one process per device: nothing to say. A MIG slice or an unknown name is not second-guessed.
    assert check_accelerators(_resources(tiny_job, accelerators=1, accelerator_type="nvidia.com/mig-1g.10gb"), _DEVICES["h100"], in_pod=True) == []
    assert check_accelerators(_resources(tiny_job, accelerators=1, accelerator_type="example.com/npu"), _DEVICES["h100"], in_pod=True) == []


def test_a_pod_without_its_gpu_fails_the_job_with_the_reason(tiny_job, tmp_path, monkeypatch, no_accelerator):
    from kubetune.worker import run_worker

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    job = load_spec(small(tiny_job, resources={"accelerators": 1}))
    rc = run_worker(job)
    assert rc == 2
    st = status(job.output_dir)
    assert st["state"] == "failed" and "resources.accelerators=1" in st["reason"] and "sees no accelerator" in st["reason"]
    assert not any(e["type"] == "metrics" and (e.get("data") or {}).get("loss") is not None for e in events(job.output_dir))


def test_platform_table_names_every_probe():
    assert set(devices.PLATFORMS) == {"nvidia", "rocm", "gaudi", "xpu", "mps", "cpu"}
