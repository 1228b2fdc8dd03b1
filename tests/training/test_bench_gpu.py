"""bench/gpu_lora.py stays out of CI: without CUDA it refuses with a clear message; its FLOPs count is right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script would run the benchmark")
def test_gpu_bench_refuses_without_cuda():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_lora.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr and "not part of CI" in out.stderr and "Traceback" not in out.stderr


def test_gpu_bench_flops_formula_for_llama_3_2_1b(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from gpu_lora import LLAMA_3_2_1B, flops_per_token, matmul_params

    # Llama-3.2-1B: 1.236 B parameters, the tied 128256 x 2048 embedding counted once (as the output head).
    assert matmul_params(LLAMA_3_2_1B) == 1_235_746_816
    # 4N for LoRA plus causal attention 6 L s d at s = 2048.
    assert flops_per_token(LLAMA_3_2_1B, 2048) == 4 * 1_235_746_816 + 6 * 16 * 2048 * 2048
