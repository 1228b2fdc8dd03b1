"""Benchmark: `kubetune serve` (transformers engine, continuous batching) vs a sequential `generate` loop.

Model: builtin://tiny-chat (generated locally). Requests: chat prompts from examples/data/capitals.jsonl,
greedy, a fixed number of new tokens each (the untrained model does not say EOS on these prompts, so both
sides generate exactly --max-tokens per request; the bench warns if the token counts disagree).

- baseline: the obvious loop, in this process: ``model.generate(input_ids, max_new_tokens=M)`` for one
  request after another (same chat template, same greedy decoding); its latency is one generate call.
- kubetune: the real server (uvicorn on 127.0.0.1 in this process) and an HTTP client keeping C requests
  in flight (closed loop, C = 1, 8, 32); latency is the client's, request sent to last byte.

The machine is shared and noisy, so the measurements are interleaved: each round runs the baseline, then
the server at every concurrency, and --rounds rounds are made. Reported: the median over rounds of output
tokens/s, p50 and p99 latency (p99 of --requests requests is close to their maximum), and the ratio of the
median tokens/s to the baseline's median.

    .venv/bin/python bench/serve.py                 # 3 rounds of 64 requests, 64 tokens each (~3-5 min)
    .venv/bin/python bench/serve.py --rounds 1 --requests 16   # quick look
    .venv/bin/python bench/serve.py --threads 1     # one torch thread on both sides
    .venv/bin/python bench/serve.py --write-docs    # also record the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Serving: kubetune serve vs a sequential generate loop (bench/serve.py)"
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"


def prompts(n: int) -> list[list[dict]]:
    """The first user turns of the capitals dataset (with their system message), cycled to n."""
    rows = []
    for line in CAPITALS.read_text(encoding="utf-8").splitlines():
        msgs = json.loads(line)["messages"]
        rows.append([m for m in msgs if m["role"] != "assistant"][:2])
    return [rows[i % len(rows)] for i in range(n)]


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class Baseline:
    """Sequential transformers generate(), one request at a time, in this process."""

    def __init__(self, model_dir: Path, requests: list[list[dict]]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.encoded = [self.tok.apply_chat_template(m, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"] for m in requests]
        self._generate(self.encoded[:2], 4)  # warm-up

    def _generate(self, encoded, max_tokens: int) -> tuple[list[float], int]:
        torch = self.torch
        lat, tokens = [], 0
        with torch.inference_mode():
            for ids in encoded:
                t = time.perf_counter()
                out = self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=self.tok.pad_token_id
                )
                lat.append(time.perf_counter() - t)
                tokens += out.shape[1] - ids.shape[1]
        return lat, tokens

    def run(self, max_tokens: int) -> dict:
        start = time.perf_counter()
        lat, tokens = self._generate(self.encoded, max_tokens)
        wall = time.perf_counter() - start
        return {"tokens": tokens, "wall": wall, "tps": tokens / wall, "p50": pct(lat, 50), "p99": pct(lat, 99)}


class Server:
    """`kubetune serve builtin://tiny-chat` in this process (uvicorn in a thread)."""

    def __init__(self, max_batch_size: int) -> None:
        import uvicorn

        from kubetune.serve.app import create_app
        from kubetune.serve.options import ServeOptions
        from kubetune.serve.sources import resolve_sources

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        app = create_app(resolve_sources("builtin://tiny-chat"), ServeOptions(max_batch_size=max_batch_size))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def drive(port: int, requests: list[list[dict]], max_tokens: int, concurrency: int, *, model: str = "tiny-chat") -> dict:
    """Keep `concurrency` requests in flight until all are answered (``model``: the id the server serves)."""
    import httpx

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    queue = list(requests)
    lat: list[float] = []
    tokens = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            nonlocal tokens
            while queue:
                messages = queue.pop(0)
                t = time.perf_counter()
                r = await client.post(url, json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
                r.raise_for_status()
                lat.append(time.perf_counter() - t)
                tokens += r.json()["usage"]["completion_tokens"]

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - start
    return {"tokens": tokens, "wall": wall, "tps": tokens / wall, "p50": pct(lat, 50), "p99": pct(lat, 99)}


def _line(name: str, r: dict) -> str:
    return f"{name}: {r['tps']:.0f} tok/s, p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms ({r['tokens']} tokens in {r['wall']:.1f} s)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=64, help="requests per measurement")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (baseline, then each concurrency)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    p.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md")
    a = p.parse_args()
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    os.environ.setdefault("KUBETUNE_HOME", tempfile.mkdtemp(prefix="kubetune-bench-"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from kubetune.training.builtin import materialize

    model_dir = materialize("tiny-chat")
    requests = prompts(a.requests)
    where = f"{machine()}, {torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f} at start"
    print(f"machine: {where}", flush=True)

    base = Baseline(model_dir, requests)
    server = Server(max_batch_size=max(a.concurrency))
    runs: dict[str, list[dict]] = {"baseline": [], **{f"c{c}": [] for c in a.concurrency}}
    try:
        asyncio.run(drive(server.port, requests[:4], 8, 2))  # warm-up
        for rnd in range(1, a.rounds + 1):
            b = base.run(a.max_tokens)
            runs["baseline"].append(b)
            print(_line(f"round {rnd} baseline (sequential generate)", b), flush=True)
            for c in a.concurrency:
                r = asyncio.run(drive(server.port, requests, a.max_tokens, c))
                if r["tokens"] != b["tokens"]:
                    print(f"warning: the server generated {r['tokens']} tokens, the baseline {b['tokens']}", file=sys.stderr)
                runs[f"c{c}"].append(r)
                print(_line(f"round {rnd} kubetune serve, concurrency {c}", r), flush=True)
    finally:
        server.close()

    def med(key: str, field: str) -> float:
        return median([r[field] for r in runs[key]])

    base_tps = med("baseline", "tps")
    cmd = "python bench/serve.py " + " ".join(x for x in sys.argv[1:] if x != "--write-docs")
    lines = [
        f"Command: `{cmd.strip()}`  ",
        f"Machine: {where}. This is the shared 2-core development machine (other people's tests ran at the same time), "
        "so absolute numbers are noisy; the ratio, measured in the same run, is the result.  ",
        f"Workload: builtin://tiny-chat on CPU, {a.requests} chat requests per measurement, {a.max_tokens} new tokens each (greedy); "
        f"client and server in one process on 127.0.0.1. {a.rounds} interleaved rounds (baseline, then the server at each concurrency); "
        "medians over rounds. The baseline has no concurrency: it answers one request after another.",
        "",
        "| setup | concurrency | output tokens/s | vs baseline | p50 latency | p99 latency |",
        "|---|---:|---:|---:|---:|---:|",
        f"| baseline: sequential transformers `generate` loop | 1 | {base_tps:.0f} | 1.00x | {med('baseline', 'p50') * 1000:.0f} ms | {med('baseline', 'p99') * 1000:.0f} ms |",
    ]
    for c in a.concurrency:
        tps = med(f"c{c}", "tps")
        lines.append(
            f"| kubetune serve (transformers engine) | {c} | {tps:.0f} | {tps / base_tps:.2f}x | {med(f'c{c}', 'p50') * 1000:.0f} ms | {med(f'c{c}', 'p99') * 1000:.0f} ms |"
        )
    lines += [
        "",
        "Concurrency 1 compares one request at a time on both sides (the server's HTTP round trip included). With several "
        "requests in flight the engine decodes all of them in one forward pass per token (continuous batching), which is "
        "where the throughput comes from; a request's latency grows with concurrency because it shares every forward "
        "pass (and here the 2 CPU cores) with the others. The baseline's own speed ranged "
        f"{min(r['tps'] for r in runs['baseline']):.0f}-{max(r['tps'] for r in runs['baseline']):.0f} tokens/s over the rounds "
        "(other people's work on the machine), which is why only medians and ratios of interleaved runs are reported.",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if a.write_docs:
        write_section(SECTION, text)
        print("\nwrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
