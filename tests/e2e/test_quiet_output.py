"""What a newcomer sees: a quickstart-like run, its log and its merge print kubetune's lines (stages, steps,
warnings, the summary) and none of the notices of the libraries underneath (bitsandbytes' `kernels` notice,
transformers' deprecations, tqdm bars), nor a vLLM warning that only matters when serving with vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kubetune.quiet import PROGRESS_BAR_ENV

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"

# What the libraries print when nobody stops them (seen in a fresh clone's quickstart).
NOISE = (
    "FutureWarning", "is_gradient_checkpointing", "past_key_values", "kernels-community", "pip install kernels",
    "Loading weights", "Writing model shards", "it/s]", "\r", "Traceback",
    "modules_to_save", "vLLM",  # said by `serve --engine vllm` and `render-serve`, where it matters
)


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PROGRESS_BAR_ENV and k != "KUBETUNE_DEBUG"}
    env["KUBETUNE_HOME"] = str(tmp_path / "home")  # a fresh home: the builtin model is generated in the run
    env["COLUMNS"] = "300"  # rich wraps at 80 columns off a terminal; the assertions look for whole phrases
    return env


def _noise(text: str) -> list[str]:
    return [n for n in NOISE if n in text]


def test_a_quickstart_run_shows_kubetune_lines_and_no_library_notices(tmp_path, kubetune_cli):
    env, run = _env(tmp_path), tmp_path / "run"
    r = subprocess.run(
        [*kubetune_cli, "run", str(QUICKSTART), "--set", f"output.dir={run}", "--set", "training.max_steps=4",
         "--set", "training.save_steps=4", "--set", "training.max_seq_length=32"],  # rows over 32 tokens: a kubetune warning
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "succeeded (train_loss=" in r.stdout and "eval_loss=" in r.stdout and f"results in {run}" in r.stdout, out
    assert "step 4/4" in r.stdout and "\nwarning " in r.stdout and "after cutting to 32 tokens" in r.stdout, out  # kubetune's warning stays
    assert _noise(out) == [], out
    log = (run / "logs" / "worker.log").read_text()
    assert "[kubetune] training" in log and "step 4/4" in log, log
    assert _noise(log) == [], log

    logs = subprocess.run([*kubetune_cli, "logs", str(run)], capture_output=True, text=True, timeout=120, env=env)
    assert logs.returncode == 0 and "[kubetune] training" in logs.stdout and _noise(logs.stdout + logs.stderr) == [], logs.stdout + logs.stderr
    merged = subprocess.run([*kubetune_cli, "merge", str(run)], capture_output=True, text=True, timeout=300, env=env)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.strip() == str(run / "merged") and _noise(merged.stdout + merged.stderr) == [], merged.stderr


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in PROGRESS_BAR_ENV and k != "KUBETUNE_DEBUG"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


_NOTICES = """
    import logging, warnings
    from kubetune.quiet import quiet_library_notices

    logging.basicConfig(format="%(name)s: %(message)s")
    warnings.simplefilter("default")  # every warning shows once per place, as python does when nobody chose
    quiet_library_notices()
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    bnb.warning("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure you already `pip install kernels`")
    bnb.warning("bnb: a real problem")
    warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
    warnings.warn("another library's deprecation", FutureWarning)
    logging.getLogger("kubetune.worker").warning("kubetune's own warning")
    warnings.warn("a kubetune UserWarning")
"""


def test_only_the_named_notices_are_dropped():
    r = _run_python(_NOTICES)
    assert r.returncode == 0, r.stderr
    assert "kernels" not in r.stderr and "is_gradient_checkpointing" not in r.stderr, r.stderr
    for kept in ("bnb: a real problem", "another library's deprecation", "kubetune's own warning", "a kubetune UserWarning"):
        assert kept in r.stderr, (kept, r.stderr)
    debug = _run_python(_NOTICES, KUBETUNE_DEBUG="1")  # --debug shows everything
    assert "kernels-community" in debug.stderr and "is_gradient_checkpointing" in debug.stderr, debug.stderr


_BARS = """
    import os
    from transformers.utils import logging as hf_logging
    from datasets.utils import logging as ds_logging
    from kubetune.quiet import disable_library_progress_bars

    before = (hf_logging.is_progress_bar_enabled(), ds_logging.is_progress_bar_enabled())
    disable_library_progress_bars()
    after = (hf_logging.is_progress_bar_enabled(), ds_logging.is_progress_bar_enabled())
    print(before, after, os.environ["HF_HUB_DISABLE_PROGRESS_BARS"], os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"])
"""


def test_progress_bars_are_switched_off_through_the_libraries_own_switches():
    r = _run_python(_BARS)
    assert r.returncode == 0, r.stderr
    # off in this process, and in the processes it starts (the worker, torchrun's ranks), which read the variables
    assert r.stdout.split(") (") == ["(True, True", "False, False) 1 1\n"], r.stdout
    user = _run_python(_BARS, HF_HUB_DISABLE_PROGRESS_BARS="0")  # a user who asked for bars keeps them
    assert user.returncode == 0, user.stderr
    assert user.stdout.startswith("(True, True) (True, False) 0 1"), user.stdout + user.stderr
