"""Small helpers for the storage tests (a unique module name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Write {relative path: content} under root and return root."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    """{relative path: content} of every file under root."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def sample_files(n_small: int = 20, big: int = 0) -> dict[str, bytes]:
    """A model-like folder: config, tokenizer, nested small files and optionally one big random shard."""
    files = {
        "config.json": b'{"model_type": "tiny"}',
        "tokenizer.json": b'{"version": "1.0"}' * 50,
        "sub/dir/notes.txt": b"hello\n",
    }
    for i in range(n_small):
        files[f"shards/small-{i:03d}.bin"] = os.urandom(1000 + i * 37)
    if big:
        files["model.safetensors"] = os.urandom(big)
    return files
