"""Device telemetry: each platform's reader with its library or tool faked at the boundary (NVML, amdsmi,
rocm-smi, hl-smi), the sampler's peaks and means, and a real CPU run whose events, status and result carry it.
On a GPU machine bench/gpu_checks.py reads NVML for real."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import types

import pytest

from kubetune.cli._output import status_rows, step_text
from kubetune.training import telemetry
from kubetune.training.telemetry import DeviceSampler, device_text

from .conftest import events, small, status

NVIDIA = {"type": "cuda", "platform": "nvidia", "name": "NVIDIA H200", "count": 2, "bf16": True, "fp16": True}
MiB = 2**20


class _FakeNvml:
    """The pynvml calls kubetune makes, over a table of GPUs whose readings tests change between samples."""

    def __init__(self, gpus):
        self.gpus = gpus  # [{"uuid", "name", "util", "used", "total", "mw"}]
        self.inits = 0

    def module(self):
        m = types.ModuleType("pynvml")
        m.nvmlInit = self._init
        m.nvmlDeviceGetCount = lambda: len(self.gpus)
        m.nvmlDeviceGetHandleByIndex = lambda i: self.gpus[i]
        m.nvmlDeviceGetHandleByUUID = lambda u: next(g for g in self.gpus if g["uuid"] == (u.decode() if isinstance(u, bytes) else u))
        m.nvmlDeviceGetName = lambda h: h["name"].encode()  # older bindings return bytes
        m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h["util"], memory=0)
        m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=h["used"] * MiB, total=h["total"] * MiB, free=0)

        def power(h):
            if h["mw"] is None:
                raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # MIG slices and some boards have no power reading
            return h["mw"]

        m.nvmlDeviceGetPowerUsage = power
        return m

    def _init(self):
        self.inits += 1


@pytest.fixture
def nvml(monkeypatch):
    fake = _FakeNvml([
        {"uuid": "GPU-aaa", "name": "NVIDIA H200", "util": 10, "used": 1000, "total": 143771, "mw": 100_000},
        {"uuid": "GPU-bbb", "name": "NVIDIA H200", "util": 50, "used": 2000, "total": 143771, "mw": 300_000},
        {"uuid": "GPU-ccc", "name": "NVIDIA H200", "util": 90, "used": 3000, "total": 143771, "mw": None},
    ])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.setattr(telemetry, "_nvml_ready", False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_nvml_reads_every_visible_gpu(nvml, monkeypatch):
    s = DeviceSampler(NVIDIA, interval=0)
    got = s.sample()
    assert [g["utilization_pct"] for g in got] == [10.0, 50.0, 90.0]
    assert got[0] == {"index": 0, "name": "NVIDIA H200", "utilization_pct": 10.0, "memory_used_mb": 1000.0, "memory_total_mb": 143771.0, "power_w": 100.0}
    assert "power_w" not in got[2]  # a reading the board lacks is left out, the others kept
    assert s.source == "nvml"
    # CUDA_VISIBLE_DEVICES by index and by UUID: the GPUs this job may use, in CUDA's order.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaa")
    got = DeviceSampler(NVIDIA, interval=0).sample()
    assert [(g["index"], g["utilization_pct"]) for g in got] == [(0, 90.0), (1, 10.0)]
    assert nvml.inits == 1  # NVML is initialised once per process


def test_summary_keeps_peaks_and_means(nvml):
    s = DeviceSampler(NVIDIA, interval=0)
    s.sample()
    nvml.gpus[0].update(util=30, used=5000, mw=200_000)
    s.sample()
    nvml.gpus[0].update(util=20, used=4000, mw=150_000)
    s.sample()
    first = s.summary()[0]
    assert first == {"index": 0, "name": "NVIDIA H200", "samples": 3, "memory_total_mb": 143771.0, "memory_peak_mb": 5000.0,
                     "utilization_mean_pct": 20.0, "utilization_max_pct": 30.0, "power_mean_w": 150.0, "power_peak_w": 200.0}
    assert "power_mean_w" not in s.summary()[2]
    assert s.latest[0]["memory_used_mb"] == 4000.0  # the newest sample, not the peak


def test_sampling_thread_samples_until_stopped(nvml):
    s = DeviceSampler(NVIDIA, interval=0.02).start()
    time.sleep(0.3)
    s.stop()
    n = s.summary()[0]["samples"]
    assert n >= 5
    time.sleep(0.1)
    assert s.summary()[0]["samples"] == n  # stopped means stopped


def test_a_failing_reader_is_dropped_and_training_goes_on():
    calls = []

    def broken():
        calls.append(1)
        raise OSError("NVML: driver/library version mismatch")

    s = DeviceSampler(NVIDIA, interval=0, readers=[broken])
    assert s.sample() == [] and s.sample() == []  # no torch allocator on this machine's CPU build either
    assert len(calls) == 1 and s.summary() == []


def test_amdsmi(monkeypatch):
    m = types.ModuleType("amdsmi")
    m.amdsmi_init = lambda: None
    m.amdsmi_get_processor_handles = lambda: ["h0", "h1"]
    m.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI300X"}
    m.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": 77 if h == "h0" else 3, "umc_activity": 1}
    m.amdsmi_get_gpu_vram_usage = lambda h: {"vram_used": 1234, "vram_total": 196592}
    m.amdsmi_get_power_info = lambda h: {"current_socket_power": "N/A", "average_socket_power": 640}
    monkeypatch.setitem(sys.modules, "amdsmi", m)
    monkeypatch.setattr(telemetry, "_amdsmi_ready", False)
    got = DeviceSampler({"type": "cuda", "platform": "rocm", "name": "MI300X"}, interval=0).sample()
    assert got[0] == {"index": 0, "name": "AMD Instinct MI300X", "utilization_pct": 77.0, "memory_used_mb": 1234.0, "memory_total_mb": 196592.0, "power_w": 640.0}
    assert got[1]["utilization_pct"] == 3.0


def _tool(tmp_path, monkeypatch, name, out):
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_rocm_smi_when_amdsmi_is_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    out = {
        "card0": {"Card Series": "AMD Instinct MI250X", "GPU use (%)": "41", "VRAM Total Memory (B)": str(64 * 2**30),
                  "VRAM Total Used Memory (B)": str(10 * 2**30), "Average Graphics Package Power (W)": "380.0"},
        "card1": {"Card Series": "AMD Instinct MI250X", "GPU use (%)": "0", "VRAM Total Memory (B)": str(64 * 2**30),
                  "VRAM Total Used Memory (B)": "0", "Average Graphics Package Power (W)": "90.0"},
        "system": {"Driver version": "6.8"},
    }
    _tool(tmp_path, monkeypatch, "rocm-smi", json.dumps(out))
    s = DeviceSampler({"type": "cuda", "platform": "rocm", "name": "MI250X"}, interval=0)
    got = s.sample()
    assert got[0] == {"index": 0, "name": "AMD Instinct MI250X", "utilization_pct": 41.0, "memory_total_mb": 65536.0, "memory_used_mb": 10240.0, "power_w": 380.0}
    assert len(got) == 2 and s.source == "rocm_smi"


def test_hl_smi_for_gaudi(tmp_path, monkeypatch):
    _tool(tmp_path, monkeypatch, "hl-smi", "0, HL-225, 87, 40960, 98304, 412\n1, HL-225, N/A, 512, 98304, 95")
    got = DeviceSampler({"type": "hpu", "platform": "gaudi", "name": "GAUDI2"}, interval=0).sample()
    assert got[0] == {"index": 0, "name": "HL-225", "utilization_pct": 87.0, "memory_used_mb": 40960.0, "memory_total_mb": 98304.0, "power_w": 412.0}
    assert "utilization_pct" not in got[1] and got[1]["power_w"] == 95.0
    assert device_text(got[0]) == "HL-225 87% 40.0/96.0 GiB 412 W"


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv("KUBETUNE_TELEMETRY_INTERVAL", "0.5")
    assert telemetry.telemetry_interval() == 0.5
    monkeypatch.setenv("KUBETUNE_TELEMETRY_INTERVAL", "off")
    assert telemetry.telemetry_interval() == 5.0  # a bad value keeps the default, training is not stopped for it
    monkeypatch.setenv("KUBETUNE_TELEMETRY_INTERVAL", "0")
    s = DeviceSampler({"type": "cpu", "platform": "cpu", "name": "cpu"}).start()
    assert s._thread is None  # 0: no sampling thread
    s.stop()


def test_a_cpu_run_reports_its_device_in_events_status_and_result(tiny_job, run_inprocess, monkeypatch, capsys):
    monkeypatch.setenv("KUBETUNE_TELEMETRY_INTERVAL", "0.05")
    rc, run_dir, result = run_inprocess(small(tiny_job, training={"max_steps": 6}))
    assert rc == 0
    evs = events(run_dir)
    dev = next(e for e in evs if e["type"] == "metrics" and (e.get("data") or {}).get("device"))
    assert dev["message"] == "device: CPU" and dev["data"]["device_type"] == "cpu" and dev["data"]["telemetry"] == "process"
    steps = [e for e in evs if e["type"] == "metrics" and (e.get("data") or {}).get("loss") is not None]
    for e in steps:
        (d,) = e["data"]["devices"]
        assert d["name"] == "cpu" and d["memory_used_mb"] > 10 and d["memory_peak_mb"] >= d["memory_used_mb"]
    assert any(e["data"]["devices"][0].get("utilization_pct", 0) > 0 for e in steps)  # training keeps a core busy
    # status.json keeps the device and its newest sample; `kubetune status` shows them as rows.
    st = status(run_dir)
    assert st["extra"]["device"] == "CPU" and st["extra"]["devices"][0]["name"] == "cpu"
    rows = dict(status_rows(st, time.time()))
    assert rows["device"] == "CPU" and rows["devices[0]"].startswith("cpu ") and "GiB" in rows["devices[0]"]
    assert " | cpu " in step_text(steps[-1])  # the progress line of `kubetune run` outside a terminal
    assert " | cpu " in capsys.readouterr().out  # and the worker's own log line
    # result.json: per device, the peak memory and utilization over the run.
    (summary,) = result["devices"]
    assert summary["name"] == "cpu" and summary["samples"] >= 3 and summary["memory_peak_mb"] >= max(e["data"]["devices"][0]["memory_used_mb"] for e in steps)
    assert result["device_type"] == "cpu"
