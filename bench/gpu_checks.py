"""The device checks that need a real GPU (run when a GPU machine is lent; never in CI).

    python bench/gpu_checks.py [--write-docs]

1. Device selection (training/devices.py): the worker finds the CUDA device, names it, and picks bf16 where
   the GPU has it.
2. Telemetry (training/telemetry.py) through real NVML: a few seconds of matmuls must show up as utilization,
   memory and power, sampled by the background thread.
3. The CLI's CUDA path end to end: the quickstart with ``resources.accelerators=1`` trains on the GPU, and its
   events, status.json and result.json carry the device and its telemetry (peak memory, utilization, power).
4. A pod whose GPUs are hidden (``CUDA_VISIBLE_DEVICES=`` and ``KUBERNETES_SERVICE_HOST`` set, as in a pod
   the device plugin gave nothing) fails at once with the reason, before fetching anything.

Each check prints PASS/FAIL with what it saw; ``--write-docs`` records them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, write_section  # noqa: E402

SECTION = "## GPU device checks: device selection and telemetry (bench/gpu_checks.py)"


def check_device() -> tuple[bool, str]:
    from kubetune.spec import load_spec
    from kubetune.training.devices import describe, device_info
    from kubetune.training.model import precision

    d = device_info()
    job = load_spec(REPO / "examples" / "quickstart.yaml")
    p = precision(job, d)
    ok = d["type"] == "cuda" and d["platform"] in ("nvidia", "rocm") and (p.amp == "bf16") == d["bf16"]
    return ok, f"{describe(d)}; quickstart precision: weights {p.weights}, autocast {p.amp}"


def check_telemetry() -> tuple[bool, str]:
    import torch

    from kubetune.training.devices import device_info
    from kubetune.training.telemetry import DeviceSampler

    s = DeviceSampler(device_info(), interval=0.2).start()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + 4
    while time.time() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    s.stop()
    first = s.summary()[0]
    ok = s.source == "nvml" and first.get("utilization_max_pct", 0) > 50 and first.get("memory_peak_mb", 0) > 128 and first.get("power_peak_w", 0) > 0
    return ok, f"reader {s.source}; device 0 over {first.get('samples')} samples: {json.dumps(first)}"


def _quickstart_on_one_gpu(out: Path, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """``kubetune run examples/quickstart.yaml --set resources.accelerators=1`` into ``out``: (the process, seconds)."""
    cmd = [sys.executable, "-m", "kubetune.cli", "run", str(REPO / "examples" / "quickstart.yaml"), "--set", "resources.accelerators=1",
           "--set", f"output.dir={out}"]
    t0 = time.time()
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    return done, time.time() - t0


def check_quickstart(work: Path) -> tuple[bool, str]:
    out = work / "run"
    done, took = _quickstart_on_one_gpu(out, {"KUBETUNE_TELEMETRY_INTERVAL": "1", "KUBETUNE_HOME": str(work / "home")}, timeout=400)
    if done.returncode != 0:
        return False, f"exit {done.returncode}: {done.stderr[-1500:]}"
    result = json.loads((out / "result.json").read_text())
    status = json.loads((out / "status.json").read_text())
    devs = result.get("devices") or []
    ok = result.get("device_type") == "cuda" and bool(devs) and devs[0].get("memory_peak_mb", 0) > 0 and "devices" in status.get("extra", {})
    line = next((ln for ln in done.stdout.splitlines() if " | " in ln and "step" in ln), "")
    return ok, (f"{took:.0f} s; device {result.get('device')}; result.json devices: {json.dumps(devs)}; "
                f"status.json devices: {json.dumps(status['extra'].get('devices'))}; a progress line: `{line.strip()}`")


def check_hidden_gpu(work: Path) -> tuple[bool, str]:
    env = {"CUDA_VISIBLE_DEVICES": "", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBETUNE_HOME": str(work / "home2")}
    done, took = _quickstart_on_one_gpu(work / "hidden", env, timeout=120)
    text = done.stdout + done.stderr
    ok = done.returncode == 2 and "sees no accelerator" in text
    reason = next((ln.strip() for ln in text.splitlines() if "sees no accelerator" in ln), text[-400:])
    return ok, f"exit {done.returncode} after {took:.1f} s: {reason}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-docs", action="store_true", help="record the results in docs/benchmarks.md")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: these checks need a GPU machine")
        return 2
    work = Path(tempfile.mkdtemp(prefix="kubetune-gpu-checks-"))
    results = []
    try:
        for name, fn in (("device selection", check_device), ("telemetry (NVML)", check_telemetry),
                         ("quickstart on CUDA", lambda: check_quickstart(work)), ("pod without its GPU", lambda: check_hidden_gpu(work))):
            try:
                ok, what = fn()
            except Exception as e:  # a check that crashes is a failed check, the others still run
                ok, what = False, f"{type(e).__name__}: {e}"
            results.append((name, ok, what))
            print(f"{'PASS' if ok else 'FAIL'} {name}: {what}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.write_docs:
        rows = "\n".join(f"| {name} | {'pass' if ok else 'FAIL'} | {what.replace('|', '/')} |" for name, ok, what in results)
        write_section(SECTION, f"Command: `python bench/gpu_checks.py --write-docs`. Machine: {machine()}.\n\n"
                      "| check | result | what it saw |\n|---|---|---|\n" + rows)
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
