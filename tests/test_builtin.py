"""builtin://tiny-chat is generated deterministically and behaves like a chat model."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from kubetune.errors import SourceError


def _digest(path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_same_bytes_in_two_fresh_homes(tmp_path):
    code = "from kubetune.training.builtin import materialize; print(materialize('tiny-chat'))"
    digests = []
    for i in range(2):
        env = {**__import__("os").environ, "KUBETUNE_HOME": str(tmp_path / f"home{i}")}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        from pathlib import Path

        digests.append(_digest(Path(out.stdout.strip().splitlines()[-1])))
    assert digests[0] == digests[1]


def test_is_a_llama_chat_model_with_eos(tiny_model):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 4 and cfg.hidden_size == 128
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], tokenize=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    assert tok.eos_token == "<|im_end|>" and cfg.eos_token_id == tok.eos_token_id
    ids = tok("The capital of France is Paris.")["input_ids"]
    assert tok.decode(ids) == "The capital of France is Paris."
    assert len(ids) < 15  # real BPE merges, not one token per byte


def test_unknown_builtin_is_a_clear_error():
    from kubetune.training.builtin import materialize

    with pytest.raises(SourceError, match="no such builtin model; available: builtin://tiny-chat"):
        materialize("huge-chat")
