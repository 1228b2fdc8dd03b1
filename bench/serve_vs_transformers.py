"""Benchmark: `kubetune serve` vs `transformers serve --continuous-batching`, the server a transformers user would
really pick, on the same model, at the same concurrency.

Model: builtin://tiny-chat (generated locally), float32 on CPU on both sides. Requests: chat prompts from
examples/data/capitals.jsonl, greedy, a fixed number of new tokens each (the untrained model does not say EOS on
these prompts, so both sides generate exactly --max-tokens per request; the bench warns if the counts disagree).
Both servers run as their own processes on 127.0.0.1, started from their CLIs as a user would:

- baseline: ``transformers serve --continuous-batching MODEL_DIR`` (paged attention, its default batch settings);
- kubetune: ``kubetune serve builtin://tiny-chat --max-batch-size 32`` (transformers engine, continuous batching).

An HTTP client keeps C requests in flight (closed loop, C = 1, 8, 32); latency is request sent to last byte. The
machine is shared and noisy, so the measurements are interleaved: each round measures both servers at every
concurrency, alternating which goes first, and --rounds rounds are made. Reported: the median over rounds of
output tokens/s and p99 latency per side, and their ratios (kubetune / transformers serve for tokens/s; higher is
better; transformers / kubetune for p99, so higher is better there too).

    .venv/bin/python bench/serve_vs_transformers.py                 # 3 rounds of 64 requests, 64 tokens each
    .venv/bin/python bench/serve_vs_transformers.py --rounds 1 --requests 16   # quick look
    .venv/bin/python bench/serve_vs_transformers.py --write-docs    # also record the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402
from serve import drive, prompts  # noqa: E402  (the same requests and client as bench/serve.py)

SECTION = "## Serving: kubetune serve vs transformers serve --continuous-batching (bench/serve_vs_transformers.py)"
SECTION_CUDA = SECTION.replace("(bench/", "on a GPU (bench/")
# `transformers ...` with this interpreter (the console script may not be on PATH where transformers came with the image)
_TRANSFORMERS_CLI = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server started from its CLI; ``model`` is the id its requests name."""

    def __init__(self, name: str, cmd: list[str], port: int, model: str, log: Path) -> None:
        self.name, self.port, self.model = name, port, model
        self.proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:  # both servers have it
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{name} did not start:\n{log.read_text()[-3000:]}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=64, help="requests per measurement")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both servers run (cuda: the first GPU)")
    p.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md")
    a = p.parse_args()
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # both servers on the CPU even where a GPU is present
    home = tempfile.mkdtemp(prefix="kubetune-bench-")
    os.environ.setdefault("KUBETUNE_HOME", home)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_CACHE", str(Path(home) / "hf-cache"))  # transformers serve lists the Hub cache; it must exist
    (Path(os.environ["HF_HUB_CACHE"])).mkdir(parents=True, exist_ok=True)
    from kubetune.training.builtin import materialize

    model_dir = materialize("tiny-chat")
    requests = prompts(a.requests)
    where = f"{machine()}, load average {os.getloadavg()[0]:.1f} at start"
    print(f"machine: {where}", flush=True)
    kt_port, hf_port = _port(), _port()
    servers = {
        "transformers": Proc("transformers serve", [sys.executable, "-c", _TRANSFORMERS_CLI, "serve", "--continuous-batching", "--host", "127.0.0.1",
                                                    "--port", str(hf_port), "--dtype", "float32", *(["--device", "cuda"] if a.device == "cuda" else []), str(model_dir)],
                             hf_port, str(model_dir), Path(home) / "transformers-serve.log"),
        "kubetune": Proc("kubetune serve", [sys.executable, "-m", "kubetune.cli", "serve", "builtin://tiny-chat", "--port", str(kt_port), "--dtype", "float32",
                                            "--max-batch-size", str(max(a.concurrency)), "--served-model-name", "tiny-chat"],
                         kt_port, "tiny-chat", Path(home) / "kubetune-serve.log"),
    }
    runs: dict[str, list[dict]] = {f"{s} c{c}": [] for s in servers for c in a.concurrency}
    try:
        for s in servers.values():  # warm-up: first requests compile kernels, allocate caches
            asyncio.run(drive(s.port, requests[:8], 8, 4, model=s.model))
        for rnd in range(1, a.rounds + 1):
            order = list(servers) if rnd % 2 else list(reversed(servers))
            for c in a.concurrency:
                tokens = {}
                for side in order:
                    s = servers[side]
                    r = asyncio.run(drive(s.port, requests, a.max_tokens, c, model=s.model))
                    runs[f"{side} c{c}"].append(r)
                    tokens[side] = r["tokens"]
                    print(f"round {rnd} {s.name:18s} c={c:2d}: {r['tps']:6.0f} tok/s, p50 {r['p50'] * 1000:5.0f} ms, "
                          f"p99 {r['p99'] * 1000:5.0f} ms", flush=True)
                if len(set(tokens.values())) > 1:
                    print(f"warning: token counts differ: {tokens}", file=sys.stderr)
    finally:
        for s in servers.values():
            s.close()
        shutil.rmtree(home, ignore_errors=True)

    def med(key: str, field: str) -> float:
        return median([r[field] for r in runs[key]])

    import transformers

    cmd = "python bench/serve_vs_transformers.py " + " ".join(x for x in sys.argv[1:] if x != "--write-docs")
    lines = [
        f"Command: `{cmd.strip()}`  ",
        f"Machine: {where}; transformers {transformers.__version__}. The shared 2-core development machine: absolute numbers "
        "are noisy, the ratios of interleaved runs are the result.  ",
        f"Workload: builtin://tiny-chat, float32 on {'the GPU' if a.device == 'cuda' else 'CPU'}, {a.requests} chat requests per measurement, {a.max_tokens} new tokens each "
        f"(greedy); each server in its own process on 127.0.0.1, started from its CLI; {a.rounds} interleaved rounds, medians.",
        "",
        "| concurrency | transformers serve --continuous-batching: tokens/s | kubetune serve: tokens/s | tokens/s ratio | "
        "p99 transformers serve | p99 kubetune | p99 ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in a.concurrency:
        hf, kt = med(f"transformers c{c}", "tps"), med(f"kubetune c{c}", "tps")
        hp, kp = med(f"transformers c{c}", "p99"), med(f"kubetune c{c}", "p99")
        lines.append(f"| {c} | {hf:.0f} | {kt:.0f} | **{kt / hf:.2f}x** | {hp * 1000:.0f} ms | {kp * 1000:.0f} ms | {hp / kp:.2f}x |")
    lines += ["", "Ratios above 1.00x favour kubetune (p99 ratio: transformers' p99 / kubetune's, so lower latency is above 1 too)."]
    text = "\n".join(lines)
    print("\n" + text)
    if a.write_docs:
        write_section(SECTION_CUDA if a.device == "cuda" else SECTION, text)
        print("\nwrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
