"""Device telemetry during training: utilization, memory used and peak, and power, per device.

A :class:`DeviceSampler` samples in a background thread every :data:`~kubetune.constants.TELEMETRY_INTERVAL_S`
seconds (``KUBETUNE_TELEMETRY_INTERVAL`` overrides it; 0 turns sampling off) from what the platform offers:

==========  =====================================================  =====================================
platform    reader                                                 what it reports
==========  =====================================================  =====================================
nvidia      NVML (``nvidia-ml-py``, the ``pynvml`` module)         utilization, memory used/total, power
rocm        the ``amdsmi`` library, else ``rocm-smi --json``       utilization, VRAM used/total, power
gaudi       ``hl-smi -Q ... -f csv``                               AIP utilization, memory, power
any         torch's allocator for this process's own device        memory allocated and its peak
cpu         this process's CPU time and resident memory            CPU % (of one core), RSS and its peak
==========  =====================================================  =====================================

The latest sample goes into every ``metrics`` event as ``devices`` (so status.json, ``kubetune status`` and
the progress line show it), and :meth:`DeviceSampler.summary` into result.json: per device the peak memory,
the mean and highest utilization and the mean and peak power. The sampler runs on rank 0 and reads every
device its node shows it (NVML, amdsmi and hl-smi see the node's devices; torch's allocator only rank 0's).

Telemetry never stops training: a reader that fails is dropped for the rest of the run.
The ``_read_*`` functions are the library boundary tests fake.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import threading
import time
from typing import Callable

from .. import constants as C
from .. import ranks

__all__ = ["DeviceSampler", "telemetry_interval", "device_text"]

MiB = 2**20


def telemetry_interval() -> float:
    """Seconds between samples: ``KUBETUNE_TELEMETRY_INTERVAL`` if set (0: off), else the default."""
    raw = os.environ.get(C.ENV_TELEMETRY_INTERVAL)
    if raw is None or not raw.strip():
        return C.TELEMETRY_INTERVAL_S
    try:
        return max(0.0, float(raw))
    except ValueError:
        return C.TELEMETRY_INTERVAL_S


def device_text(sample: dict) -> str:
    """``NVIDIA H200 87% 20.1/139.0 GiB 412 W``: one device's sample in a phrase (missing parts left out)."""
    bits = [str(sample.get("name") or f"device {sample.get('index', 0)}")]
    if isinstance(sample.get("utilization_pct"), (int, float)):
        bits.append(f"{sample['utilization_pct']:.0f}%")
    used = sample.get("memory_used_mb")
    if isinstance(used, (int, float)):
        total = sample.get("memory_total_mb")
        bits.append(f"{used / 1024:.1f}/{total / 1024:.1f} GiB" if isinstance(total, (int, float)) and total else f"{used / 1024:.1f} GiB")
    if isinstance(sample.get("power_w"), (int, float)):
        bits.append(f"{sample['power_w']:.0f} W")
    return " ".join(bits)


class DeviceSampler:
    """Samples the job's devices in a background thread and keeps their peaks and means.

    Args:
        device: from :func:`kubetune.training.devices.device_info`.
        interval: seconds between samples (default: :func:`telemetry_interval`); 0 samples only when asked.
        readers: the platform readers to try, in order (default: those of ``device["platform"]``).
    """

    def __init__(self, device: dict, *, interval: float | None = None, readers: list[Callable[[], list[dict] | None]] | None = None) -> None:
        self.device = device
        self.interval = telemetry_interval() if interval is None else interval
        self._readers = list(readers) if readers is not None else _platform_readers(device)
        self._cpu = _CpuReader() if device["type"] == "cpu" else None
        self._lock = threading.Lock()
        self._latest: list[dict] = []
        self._stats: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source: str | None = None  # the reader that answered last

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "DeviceSampler":
        """Take a first sample and start sampling every ``interval`` seconds (no thread when it is 0)."""
        self.sample()
        if self.interval > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="kubetune-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sampling thread after one last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    # -- samples ----------------------------------------------------------------------------------
    def sample(self) -> list[dict]:
        """Read every device now, fold the readings into the peaks and means, and return them."""
        try:
            samples = self._read()
        except Exception:  # telemetry never stops training
            samples = []
        with self._lock:
            self._latest = samples
            for s in samples:
                self._fold(s)
        return samples

    @property
    def latest(self) -> list[dict]:
        """The newest sample of each device (a copy)."""
        with self._lock:
            return [dict(s) for s in self._latest]

    def summary(self) -> list[dict]:
        """Per device over the run: name, memory total and peak, utilization mean and max, power mean and peak."""
        with self._lock:
            out = []
            for index in sorted(self._stats):
                st = self._stats[index]
                rec = {"index": index, "name": st["name"], "samples": st["n"], "memory_total_mb": st["memory_total_mb"], "memory_peak_mb": st["memory_peak_mb"]}
                for key in ("utilization", "power"):
                    n = st[f"{key}_n"]
                    rec[f"{key}_{'mean_pct' if key == 'utilization' else 'mean_w'}"] = round(st[f"{key}_sum"] / n, 1) if n else None
                    rec[f"{key}_{'max_pct' if key == 'utilization' else 'peak_w'}"] = st[f"{key}_max"]
                if st.get("allocated_peak_mb") is not None:
                    rec["allocated_peak_mb"] = st["allocated_peak_mb"]
                out.append({k: v for k, v in rec.items() if v is not None})
            return out

    def _read(self) -> list[dict]:
        samples: list[dict] | None = None
        for reader in list(self._readers):
            try:
                samples = reader()
            except Exception:
                samples = None
            if samples:
                self.source = getattr(reader, "__name__", "reader").lstrip("_").replace("read_", "")
                break
            self._readers.remove(reader)  # not on this machine: do not ask again every few seconds
        if self._cpu is not None:
            self.source = "process"
            return [self._cpu.read()]
        own = _read_allocator(self.device)
        if not samples:
            if own is None:
                return []
            self.source = "torch"
            return [{"index": ranks.local_rank(), "name": self.device.get("name"), **own}]
        if own is not None:  # this process's own device gets torch's view beside the platform's
            for s in samples:
                if s.get("index") == ranks.local_rank():
                    s.update({k: v for k, v in own.items() if k.startswith("allocated")})
        return samples

    def _fold(self, s: dict) -> None:
        index = int(s.get("index") or 0)
        st = self._stats.setdefault(index, {"name": s.get("name"), "n": 0, "memory_total_mb": None, "memory_peak_mb": None,
                                            "utilization_sum": 0.0, "utilization_n": 0, "utilization_max": None,
                                            "power_sum": 0.0, "power_n": 0, "power_max": None, "allocated_peak_mb": None})
        st["n"] += 1
        if s.get("memory_total_mb") is not None:
            st["memory_total_mb"] = s["memory_total_mb"]
        for key, value in (("memory_peak_mb", s.get("memory_peak_mb")), ("memory_peak_mb", s.get("memory_used_mb")), ("allocated_peak_mb", s.get("allocated_peak_mb"))):
            if isinstance(value, (int, float)):
                st[key] = value if st[key] is None else max(st[key], value)
        for key, value in (("utilization", s.get("utilization_pct")), ("power", s.get("power_w"))):
            if isinstance(value, (int, float)):
                st[f"{key}_sum"] += value
                st[f"{key}_n"] += 1
                st[f"{key}_max"] = value if st[f"{key}_max"] is None else max(st[f"{key}_max"], value)


def _platform_readers(device: dict) -> list[Callable[[], list[dict] | None]]:
    return {"nvidia": [_read_nvml], "rocm": [_read_amdsmi, _read_rocm_smi], "gaudi": [_read_hl_smi]}.get(device.get("platform", ""), [])


# --- NVIDIA: NVML ----------------------------------------------------------------------------------
_nvml_ready = False


def _read_nvml() -> list[dict] | None:
    """Every GPU this process may use (``CUDA_VISIBLE_DEVICES``, by index or UUID), through NVML."""
    global _nvml_ready
    try:
        import pynvml
    except ImportError:
        return None
    if not _nvml_ready:
        pynvml.nvmlInit()
        _nvml_ready = True
    handles = _nvml_handles(pynvml)
    out = []
    for index, h in enumerate(handles):
        rec: dict = {"index": index}
        rec["name"] = _try(lambda: _text(pynvml.nvmlDeviceGetName(h)))
        rec["utilization_pct"] = _try(lambda: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            rec["memory_used_mb"] = round(mem.used / MiB, 1)
            rec["memory_total_mb"] = round(mem.total / MiB, 1)
        power = _try(lambda: pynvml.nvmlDeviceGetPowerUsage(h))  # milliwatts
        rec["power_w"] = round(power / 1000, 1) if power is not None else None
        out.append({k: v for k, v in rec.items() if v is not None})
    return out


def _nvml_handles(pynvml) -> list:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles = []
    for item in (v.strip() for v in visible.split(",")):
        if not item or item == "-1":
            break  # CUDA stops at the first invalid entry
        if item.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)))
        else:  # GPU-<uuid> or MIG-<uuid>
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(item))
    return handles


# --- AMD: amdsmi, else rocm-smi -----------------------------------------------------------------------
_amdsmi_ready = False


def _read_amdsmi() -> list[dict] | None:
    """Every AMD GPU through the ``amdsmi`` library (ROCm 6+)."""
    global _amdsmi_ready
    try:
        import amdsmi
    except ImportError:
        return None
    if not _amdsmi_ready:
        amdsmi.amdsmi_init()
        _amdsmi_ready = True
    out = []
    for index, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
        rec: dict = {"index": index}
        rec["name"] = _try(lambda: amdsmi.amdsmi_get_gpu_asic_info(h).get("market_name"))
        rec["utilization_pct"] = _try(lambda: float(amdsmi.amdsmi_get_gpu_activity(h)["gfx_activity"]))
        vram = _try(lambda: amdsmi.amdsmi_get_gpu_vram_usage(h))  # MB
        if vram:
            rec["memory_used_mb"] = float(vram["vram_used"])
            rec["memory_total_mb"] = float(vram["vram_total"])
        power = _try(lambda: amdsmi.amdsmi_get_power_info(h))
        if power:
            watts = next((power[k] for k in ("current_socket_power", "average_socket_power") if _number(power.get(k)) is not None), None)
            rec["power_w"] = _number(watts)
        out.append({k: v for k, v in rec.items() if v is not None})
    return out


def _read_rocm_smi() -> list[dict] | None:
    """Every AMD GPU through ``rocm-smi --json`` (older ROCm without the amdsmi library)."""
    text = _run([C.ROCM_SMI, "--showproductname", "--showuse", "--showmeminfo", "vram", "--showpower", "--json"])
    if text is None:
        return None
    cards = json.loads(text)
    out = []
    for key in sorted((k for k in cards if k.startswith("card")), key=lambda k: int(k[4:]) if k[4:].isdigit() else 0):
        card = cards[key]
        rec: dict = {"index": int(key[4:]) if key[4:].isdigit() else len(out)}
        rec["name"] = card.get("Card Series") or card.get("Card series") or card.get("Card Model")
        for field, value in card.items():
            low = field.lower()
            if "gpu use" in low:
                rec["utilization_pct"] = _number(value)
            elif "vram total used memory" in low:
                rec["memory_used_mb"] = _mb(value)
            elif "vram total memory" in low:
                rec["memory_total_mb"] = _mb(value)
            elif "power" in low and "(w)" in low and rec.get("power_w") is None:
                rec["power_w"] = _number(value)
        out.append({k: v for k, v in rec.items() if v is not None})
    return out


# --- Intel Gaudi: hl-smi ------------------------------------------------------------------------------
def _read_hl_smi() -> list[dict] | None:
    """Every Gaudi card through ``hl-smi -Q ... -f csv,noheader,nounits`` (memory in MiB, power in W)."""
    text = _run([C.HL_SMI, "-Q", "index,name,utilization.aip,memory.used,memory.total,power.draw", "-f", "csv,noheader,nounits"])
    if text is None:
        return None
    out = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) < 6 or not cells[0].isdigit():
            continue
        rec = {"index": int(cells[0]), "name": cells[1] or None, "utilization_pct": _number(cells[2]),
               "memory_used_mb": _number(cells[3]), "memory_total_mb": _number(cells[4]), "power_w": _number(cells[5])}
        out.append({k: v for k, v in rec.items() if v is not None})
    return out


# --- torch's allocator: this process's own device -------------------------------------------------------
def _read_allocator(device: dict) -> dict | None:
    """``allocated_mb``/``allocated_peak_mb`` (and the device's total) from torch, for this process's device."""
    kind = device["type"]
    if kind == "cpu":
        return None
    try:
        import torch

        if kind == "mps":
            return {"allocated_mb": round(torch.mps.current_allocated_memory() / MiB, 1),
                    "memory_used_mb": round(torch.mps.driver_allocated_memory() / MiB, 1)}
        mod = getattr(torch, kind)  # torch.cuda (also ROCm), torch.xpu, torch.hpu (with habana_frameworks)
        index = mod.current_device()
        rec = {"allocated_mb": round(mod.memory_allocated(index) / MiB, 1), "allocated_peak_mb": round(mod.max_memory_allocated(index) / MiB, 1)}
        total = _try(lambda: mod.get_device_properties(index).total_memory)
        if total:
            rec["memory_total_mb"] = round(total / MiB, 1)
        rec["memory_peak_mb"] = rec["allocated_peak_mb"]
        return rec
    except Exception:
        return None


class _CpuReader:
    """This process's CPU use (percent of one core, as ``top`` shows it) and resident memory."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), _cpu_seconds())

    def read(self) -> dict:
        now, cpu = time.monotonic(), _cpu_seconds()
        wall = now - self._last[0]
        util = round(100.0 * (cpu - self._last[1]) / wall, 1) if wall > 0.05 else None
        if wall > 0.05:
            self._last = (now, cpu)
        rss, peak = _rss_mb(), _maxrss_mb()
        if rss is not None and peak is not None:
            peak = max(peak, rss)  # the kernel's peak and the current size are counted apart: never show peak < now
        rec = {"index": 0, "name": "cpu", "utilization_pct": util, "memory_used_mb": rss, "memory_peak_mb": peak}
        return {k: v for k, v in rec.items() if v is not None}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / MiB, 1)
    except (OSError, ValueError, IndexError):
        return _maxrss_mb()


def _maxrss_mb() -> float | None:
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    except Exception:  # pragma: no cover - not on a Unix
        return None


# --- helpers ----------------------------------------------------------------------------------------
def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def _try(fn: Callable):
    try:
        return fn()
    except Exception:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().split()[0])
        except (ValueError, IndexError):
            return None
    return None


def _mb(value) -> float | None:
    n = _number(value)  # rocm-smi reports bytes
    return round(n / MiB, 1) if n is not None else None
