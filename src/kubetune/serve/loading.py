"""Loading models to talk to: a trained result to chat with in process, and the server's engine.

- :func:`load_chat_model` loads a run directory, a model directory or a model URI as a :class:`ChatModel`
  that generates chat replies (``kubetune chat RUN``).
- :func:`load_engine` loads a :class:`~kubetune.serve.sources.ServePlan`'s model and its adapters (as one
  PEFT model), finds its end-of-turn tokens, context length and sampling defaults, and builds the
  :class:`~kubetune.serve.engine.TransformersEngine` that ``kubetune serve`` runs (:class:`LoadedModels`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import constants as C
from ..errors import SourceError
from .engine import TransformersEngine

__all__ = ["ChatModel", "load_chat_model", "LoadedModels", "load_engine", "set_inference_threads"]


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
        """Yield the reply piece by piece as it is generated.

        Generation runs in a thread; closing the generator early (the reader went away: a closed pipe, Ctrl-C)
        stops it at the next token and waits for it, so no thread is left inside torch when the process exits.
        """
        import threading

        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        stop = threading.Event()

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

        tok = self.tokenizer
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        if seed is not None:
            torch.manual_seed(seed)
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(**enc, max_new_tokens=max_new_tokens, streamer=streamer, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      stopping_criteria=StoppingCriteriaList([_Stop()]))
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            kwargs.update(do_sample=False)
        t = threading.Thread(target=self.model.generate, kwargs=kwargs, daemon=True)
        t.start()
        try:
            yield from streamer
        finally:
            stop.set()
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
        if job.entrypoint is not None:
            raise SourceError(f"{source}: the run ran a custom training function ({job.entrypoint.describe()}); kubetune does "
                              "not know which model it saved", hint="serve the model directory your function saved (a folder with config.json), e.g. kubetune chat RUN/model")
        trust = job.model.trust_remote_code
        if (path / C.MERGED_DIR / "config.json").is_file():
            path = path / C.MERGED_DIR
        elif (path / C.MODEL_DIR / "config.json").is_file():
            path = path / C.MODEL_DIR
        elif (path / C.ADAPTER_DIR / "adapter_config.json").is_file():
            from peft import PeftModel

            base_dir = fetch(job.model.pinned_source)
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


def set_inference_threads(device: str | None = None) -> str | None:
    """For a model answering on the CPU (``kubetune chat``, ``kubetune serve``): give torch the threads
    :mod:`kubetune.cpu` chooses (``OMP_NUM_THREADS``, else the cores that are free) and return the line that
    says so; on a GPU (``device``, else CUDA when available) change nothing and return None."""
    import torch

    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).split(":")[0] != "cpu":
        return None
    from ..cpu import apply_threads, cpu_threads

    choice = cpu_threads()
    apply_threads(choice)
    return choice.describe("OMP_NUM_THREADS")


def _to_device(model):
    import torch

    return model.to("cuda") if torch.cuda.is_available() else model


# --- the server's engine -------------------------------------------------------------------------
@dataclass
class LoadedModels:
    """What the server needs from a loaded plan: the engine, the tokenizer, chat templates per model id."""

    engine: TransformersEngine
    tokenizer: Any
    chat_tokenizers: dict[str, Any]  # model id -> tokenizer whose chat template renders its prompts
    context_length: int
    default_temperature: float
    default_top_p: float


def load_engine(plan: Any, options: Any, *, on_step: Callable[[int], None] | None = None) -> LoadedModels:
    """Load the plan's model (and its adapters, as one PEFT model) and build a started-later engine.

    Args:
        plan: a :class:`~kubetune.serve.sources.ServePlan`.
        options: the :class:`~kubetune.serve.options.ServeOptions`.
        on_step: metrics hook called with the rows of every forward pass.

    Raises:
        SourceError: the model or an adapter cannot be loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if options.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = getattr(torch, options.dtype)
    trust = plan.trust_remote_code
    try:
        model = AutoModelForCausalLM.from_pretrained(plan.model_dir, dtype=dtype, trust_remote_code=trust)
        tokenizer = AutoTokenizer.from_pretrained(plan.model_dir, trust_remote_code=trust)
    except (OSError, ValueError) as e:
        raise SourceError(f"{plan.source}: cannot load the model from {plan.model_dir}: {e}") from None
    chat_tokenizers = {plan.model_name: tokenizer}
    if plan.adapters:
        from peft import PeftModel

        first, *rest = plan.adapters
        try:
            model = PeftModel.from_pretrained(model, first.path, adapter_name=first.name)
            for a in rest:
                model.load_adapter(a.path, adapter_name=a.name)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            raise SourceError(f"cannot load adapter onto {plan.model_name}: {e}", hint="an adapter must be trained on the served base model") from None
        for a in plan.adapters:
            chat_tokenizers[a.name] = _adapter_tokenizer(a.path, tokenizer, trust)
        _share_base_modules(model, [a.name for a in plan.adapters])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device).eval()
    gen = getattr(model, "generation_config", None)
    eos = _eos_ids(tokenizer, gen)
    context = int(getattr(_base_config(model), "max_position_embeddings", 0) or 0) or 2048
    if options.max_model_len:
        context = min(context, options.max_model_len)
    sampled = bool(getattr(gen, "do_sample", False))
    engine = TransformersEngine(model, tokenizer, eos_token_ids=eos, max_batch_size=options.max_batch_size, peft=bool(plan.adapters), on_step=on_step)
    return LoadedModels(
        engine=engine,
        tokenizer=tokenizer,
        chat_tokenizers=chat_tokenizers,
        context_length=context,
        default_temperature=float(getattr(gen, "temperature", 1.0) or 1.0) if sampled else 0.0,
        default_top_p=float(getattr(gen, "top_p", 1.0) or 1.0) if sampled else 1.0,
    )


def _share_base_modules(model: Any, names: list[str]) -> None:
    """Let adapters without a module another adapter saved (modules_to_save) share mixed-adapter batches.

    PEFT's mixed-adapter forward looks every row's adapter up in each ModulesToSaveWrapper and fails
    (KeyError) for an adapter that did not save that module, e.g. a plain LoRA adapter next to one trained
    with ``modules_to_save: [embed_tokens]``. Such an adapter computes that module with the base weights
    (what a forward with only that adapter active does), so the base module itself is registered under the
    adapter's name: no copy, and forwards with one adapter are unchanged.
    """
    try:
        from peft.utils.other import ModulesToSaveWrapper
    except ImportError:  # a peft without it has no such modules
        return
    wrappers = [m for m in model.modules() if isinstance(m, ModulesToSaveWrapper)]
    for w in wrappers:
        for name in names:
            if name not in w.modules_to_save:
                w.modules_to_save[name] = w.original_module


def _base_config(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config


def _adapter_tokenizer(path, fallback: Any, trust: bool) -> Any:
    """kubetune saves the tokenizer (with the chat template used in training) next to each adapter."""
    if not (path / "tokenizer_config.json").is_file():
        return fallback
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    except (OSError, ValueError):
        return fallback


# End-of-turn markers of common chat templates: a reply ends at any of them, even when the model's
# config names only the end-of-text token as EOS.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|end_of_text|>")


def _eos_ids(tokenizer: Any, gen: Any) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in _END_OF_TURN if t in vocab)
    return ids
