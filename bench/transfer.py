"""Benchmark: upload + download of a model-like folder to a loopback S3 server, kubetune vs two baselines.

The folder (256 MiB, 516 files by default) has a few large shards and many small files, like a model with
its tokenizer plus a sharded dataset. The S3 server is moto's standalone server in its own process on
127.0.0.1. The baselines:

* **managed transfer** (the one to beat): boto3's managed transfer as ``aws s3 cp --recursive`` uses it,
  ``boto3.s3.transfer.create_transfer_manager`` with the default ``TransferConfig`` (10 concurrent requests,
  8 MiB multipart threshold and parts), every file submitted at once, then waited for;
* **single-stream loop**: one ``put_object`` / ``get_object`` per file, one after the other.

kubetune is ``storage.push`` and ``storage.fetch`` as shipped: concurrent multipart transfers, temp names +
rename, size and ETag verification of every downloaded file. It is measured twice when ``awscrt`` is installed:
uploading through s3transfer's classic thread pool (``KUBETUNE_S3_TRANSFER_CLIENT=classic``) and through the AWS
CRT client (``=crt``, what ``auto`` picks then); downloads are kubetune's own in both. Each run measures the sides
in a rotating order (the machine may be shared and noisy); medians and their ratios are reported.

    .venv/bin/python bench/transfer.py                  # 256 MiB, 516 files, 3 runs
    .venv/bin/python bench/transfer.py --size-mb 64 --runs 1   # quick look
    .venv/bin/python bench/transfer.py --write-docs     # also record the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median, write_section  # noqa: E402

SECTION = "## Storage transfer (bench/transfer.py)"
MiB = 1024 * 1024


def make_folder(root: Path, size_mb: int) -> tuple[int, int]:
    """3/4 of the bytes in 4 large shards, 1/4 in 128 KiB files; returns (files, bytes)."""
    total = size_mb * MiB
    shard = (total * 3 // 4) // 4
    small = 128 * 1024
    n_small = max(1, (total // 4) // small)
    root.mkdir(parents=True)
    block = os.urandom(MiB)
    for i in range(4):
        with open(root / f"model-{i + 1:05d}-of-00004.safetensors", "wb") as f:
            left = shard
            while left > 0:
                f.write(block[: min(left, MiB)] if left >= MiB else os.urandom(left))
                left -= MiB
            f.write(os.urandom(17 + i))  # no two shards identical
    for i in range(n_small):
        d = root / "data" / f"part-{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.bin").write_bytes(os.urandom(small))
    files = list(p for p in root.rglob("*") if p.is_file())
    return len(files), sum(p.stat().st_size for p in files)


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


# --- the two sides -----------------------------------------------------------------------------------
def baseline_upload(client, bucket: str, prefix: str, src: Path) -> None:
    for p in sorted(src.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(src).as_posix()}", Body=f)


def baseline_download(client, bucket: str, prefix: str, dest: Path) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out = dest / o["Key"][len(prefix) + 1:]
            out.parent.mkdir(parents=True, exist_ok=True)
            body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"]
            with open(out, "wb") as f:
                for chunk in iter(lambda: body.read(MiB), b""):
                    f.write(chunk)


def managed_upload(client, bucket: str, prefix: str, src: Path) -> None:
    """``aws s3 cp --recursive SRC s3://...``: every file submitted to one transfer manager, default config."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = [manager.upload(str(p), bucket, f"{prefix}/{p.relative_to(src).as_posix()}")
                   for p in sorted(src.rglob("*")) if p.is_file()]
        for f in futures:
            f.result()


def managed_download(client, bucket: str, prefix: str, dest: Path) -> None:
    """``aws s3 cp --recursive s3://... DEST``: list, then every object submitted at once."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            for o in page.get("Contents", [])]
    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = []
        for key in keys:
            out = dest / key[len(prefix) + 1:]
            out.parent.mkdir(parents=True, exist_ok=True)
            futures.append(manager.download(bucket, key, str(out)))
        for f in futures:
            f.result()


def kubetune_upload(bucket: str, prefix: str, src: Path, engine: str) -> None:
    from kubetune.storage import push

    os.environ["KUBETUNE_S3_TRANSFER_CLIENT"] = engine
    push(src, f"s3://{bucket}/{prefix}")


def kubetune_download(bucket: str, prefix: str, dest: Path) -> None:
    from kubetune.storage import fetch

    fetch(f"s3://{bucket}/{prefix}", dest, use_cache=False)


def clear(client, bucket: str, prefix: str) -> None:
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def same_tree(a: Path, b: Path, *, contents: bool) -> bool:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    if fa != fb or any((a / r).stat().st_size != (b / r).stat().st_size for r in fa):
        return False
    return not contents or all(filecmp.cmp(a / r, b / r, shallow=False) for r in fa)


# --- main --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=256, help="total size of the folder (default 256: 516 files)")
    ap.add_argument("--runs", type=int, default=3, help="runs per side; the median is reported (default 3)")
    ap.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md (this section only)")
    args = ap.parse_args(argv)

    import boto3
    from botocore.config import Config

    proc, endpoint = start_moto()
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-"))
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              config=Config(retries={"max_attempts": 8, "mode": "standard"}))
        bucket = "bench"
        client.create_bucket(Bucket=bucket)
        n_files, n_bytes = make_folder(work / "src", args.size_mb)
        print(f"folder: {n_files} files, {n_bytes / MiB:.0f} MiB; S3: moto server at {endpoint} (own process)")
        sides = ("single", "managed", "kubetune") + (("crt",) if _has_crt() else ())
        if "crt" not in sides:
            print("awscrt is not installed: measuring kubetune's classic uploads only (pip install 'kubetune[crt]' for the CRT side)")
        up = {"single": lambda p, src: baseline_upload(client, bucket, p, src), "managed": lambda p, src: managed_upload(client, bucket, p, src),
              "kubetune": lambda p, src: kubetune_upload(bucket, p, src, "classic"), "crt": lambda p, src: kubetune_upload(bucket, p, src, "crt")}
        down = {"single": lambda p, d: baseline_download(client, bucket, p, d), "managed": lambda p, d: managed_download(client, bucket, p, d),
                "kubetune": lambda p, d: kubetune_download(bucket, p, d), "crt": lambda p, d: kubetune_download(bucket, p, d)}
        times: dict[str, list[float]] = {f"{side} {way}": [] for side in sides for way in ("up", "down")}
        for run in range(args.runs):
            order = sides[run % len(sides):] + sides[:run % len(sides)]  # each side goes first in turn
            for side in order:
                prefix, dest = f"{side}-{run}", work / f"{side}-{run}"
                t = time.perf_counter()
                up[side](prefix, work / "src")
                times[f"{side} up"].append(time.perf_counter() - t)
                t = time.perf_counter()
                down[side](prefix, dest)
                times[f"{side} down"].append(time.perf_counter() - t)
                if not same_tree(work / "src", dest, contents=run == 0):  # byte-compared in the first run
                    raise SystemExit(f"{side}: downloaded folder differs from the source")
                shutil.rmtree(dest)
                clear(client, bucket, prefix)
                print(f"run {run + 1} {side:8s}: up {times[f'{side} up'][-1]:6.1f}s  down {times[f'{side} down'][-1]:6.1f}s", flush=True)
        med = {k: median(v) for k, v in times.items()}
        table = render(med, n_files, n_bytes, args, sides)
        print()
        print(table)
        if args.write_docs:
            write_section(SECTION, table)
            print("\nrecorded in docs/benchmarks.md")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _has_crt() -> bool:
    try:
        import awscrt.s3  # noqa: F401
    except ImportError:
        return False
    return True


def render(med: dict[str, float], n_files: int, n_bytes: int, args, sides: tuple[str, ...]) -> str:
    mb = n_bytes / MiB
    crt = "crt" in sides

    def cell(t: float, moved: float) -> str:
        return f"{t:.1f} s ({moved / t:.0f} MiB/s)"

    def row(name: str, way: str | None, moved: float = mb) -> str:
        t = {side: (med[f"{side} {way}"] if way else med[f"{side} up"] + med[f"{side} down"]) for side in sides}
        out = f"| {name} | {cell(t['single'], moved)} | {cell(t['managed'], moved)} | {cell(t['kubetune'], moved)} "
        if crt:
            out += f"| {cell(t['crt'], moved)} "
        out += f"| **{t['managed'] / t['kubetune']:.2f}x** "
        if crt:
            out += f"| **{t['managed'] / t['crt']:.2f}x** "
        return out + f"| {t['single'] / min(t[s] for s in sides if s in ('kubetune', 'crt')):.2f}x |"

    head = "| transfer | single-stream boto3 loop | boto3 managed transfer | kubetune, classic uploads "
    head += "| kubetune, CRT uploads | classic vs managed | CRT vs managed " if crt else "| vs managed "
    head += "| best kubetune vs single-stream |"
    cols = head.count("|") - 1
    engines = ("kubetune's downloads are the same code in both kubetune columns; its uploads go through s3transfer's "
               f"thread pool (classic) or the AWS CRT client (`awscrt` {_crt_version()}, what "
               "`KUBETUNE_S3_TRANSFER_CLIENT=auto` uses when it is installed)." if crt else
               "awscrt was not installed: kubetune's classic uploads only.")

    cmd = ".venv/bin/python bench/transfer.py" + (f" --size-mb {args.size_mb}" if args.size_mb != 256 else "") + \
          (f" --runs {args.runs}" if args.runs != 3 else "") + " --write-docs"
    return "\n".join([
        f"Folder: {n_files} files, {mb:.0f} MiB (4 shards of {mb * 0.75 / 4:.0f} MiB, the rest 128 KiB files); "
        f"server: moto's S3 server in its own process on 127.0.0.1. {args.runs} runs, each side in a rotating order; "
        "medians; speed-up = baseline time / kubetune time. The baseline to beat is boto3's managed transfer as "
        "`aws s3 cp --recursive` runs it (`create_transfer_manager`, default `TransferConfig`: 10 concurrent requests, "
        "8 MiB parts; every file submitted at once). " + engines,
        "",
        head,
        "|" + " --- |" * cols,
        row("upload", "up"),
        row("download (kubetune verifies size + ETag)", "down"),
        row("both (the folder up, then down)", None, 2 * mb),
        "",
        f"Command: `{cmd}`. Machine: {machine()}; {_mem_gib()} GiB RAM; {time.strftime('%Y-%m-%d')}. "
        "Measured on the shared 2-core dev machine: the client and the server share the same cores, so this "
        "measures request overlap and per-request overhead more than bandwidth, and absolute times are noisy; "
        "the ratio of medians is the number to read.",
    ])


def _crt_version() -> str:
    from importlib.metadata import version

    return version("awscrt")


def _mem_gib() -> int:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3)
    except (ValueError, OSError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
