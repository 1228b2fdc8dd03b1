"""Load a trained result (run directory, model directory or model URI) and generate chat replies."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from ..errors import SourceError

__all__ = ["ChatModel", "load_chat_model"]


@dataclass
class ChatModel:
    """A causal LM and its tokenizer, ready to answer chat messages."""

    model: Any
    tokenizer: Any
    source: str

    def reply(self, messages: list[dict], *, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> str:
        """Generate the assistant's next message (greedy unless temperature > 0)."""
        return "".join(self.stream(messages, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed))

    def stream(self, messages: list[dict], *, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> Iterator[str]:
        """Yield the reply piece by piece as it is generated."""
        import threading

        import torch
        from transformers import TextIteratorStreamer

        tok = self.tokenizer
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        if seed is not None:
            torch.manual_seed(seed)
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(**enc, max_new_tokens=max_new_tokens, streamer=streamer, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            kwargs.update(do_sample=False)
        t = threading.Thread(target=self.model.generate, kwargs=kwargs, daemon=True)
        t.start()
        yield from streamer
        t.join()


def load_chat_model(source: str | os.PathLike) -> ChatModel:
    """Load a run directory (merged/, model/ or base+adapter/), a model directory, or a model URI.

    Raises:
        SourceError: nothing loadable at ``source``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(source).expanduser()
    trust = False
    if (path / C.SPEC_FILE).is_file():  # a run directory
        from ..spec import load_spec
        from ..storage import fetch

        job = load_spec(path / C.SPEC_FILE)
        trust = job.model.trust_remote_code
        if (path / C.MERGED_DIR / "config.json").is_file():
            path = path / C.MERGED_DIR
        elif (path / C.MODEL_DIR / "config.json").is_file():
            path = path / C.MODEL_DIR
        elif (path / C.ADAPTER_DIR / "adapter_config.json").is_file():
            from peft import PeftModel

            base_dir = fetch(job.model.source, revision=job.model.revision)
            base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, trust_remote_code=trust)
            model = PeftModel.from_pretrained(base, path / C.ADAPTER_DIR).eval()
            tok = AutoTokenizer.from_pretrained(path / C.ADAPTER_DIR)
            return ChatModel(model=_to_device(model), tokenizer=tok, source=str(source))
        else:
            raise SourceError(f"{source}: the run has no trained model yet (no merged/, model/ or adapter/)", hint="kubetune status shows whether it finished")
    elif not path.exists():
        from ..storage import fetch

        path = fetch(str(source))
    if not (path / "config.json").is_file():
        raise SourceError(f"{source}: not a model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust).eval()
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    return ChatModel(model=_to_device(model), tokenizer=tok, source=str(source))


def _to_device(model):
    import torch

    return model.to("cuda") if torch.cuda.is_available() else model
