"""Checks of a job against this machine, before it runs here: its local inputs, its output directory, its model.

Validating a spec (:mod:`kubetune.spec`) is pure: the same spec is valid for a cluster where its local
paths mean nothing (``kubetune render`` must keep working there). These checks look at the machine, so
they run where the job is about to run on it:

* :func:`check_local`: ``kubetune validate`` (unless ``--no-check-local``) and the local backend's
  submit. Local ``model.source``, ``dataset.source``, ``dataset.eval_source``, ``dataset.mix[].source`` and
  ``dataset.preprocess.file`` exist and can be read; ``output.dir`` is (or can be created as) a writable directory, not under a
  file, ``/proc`` or ``/sys``; ``training.max_seq_length`` fits a builtin or local model.
* :func:`check_model_config`: the worker, once the model is fetched (hf://, s3://, oci://... models are
  known only then), before any data is prepared.

Only the standard library is used: ``validate`` must stay light.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import constants as C
from .errors import SpecError

__all__ = ["check_local", "check_model_config", "read_model_config", "model_max_positions", "entrypoint_problems", "volume_problems"]

# Kernel filesystems: writing results there fails, or worse, does something.
_SYSTEM_ROOTS = tuple(Path(p) for p in C.OUTPUT_FORBIDDEN_ROOTS)
# Keys a model config names its longest sequence by, most common first (llama & co, gpt2, others).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
_MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KiB; a bigger one is not read here
_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's limits on one file name and a whole path, in bytes


def check_local(job: Any) -> None:
    """Refuse a job that cannot run on this machine, naming every field and path at fault.

    Raises:
        SpecError: a local source is missing or unreadable, output.dir cannot be created or written, or
            training.max_seq_length exceeds a builtin or local model's positions.
    """
    if job.entrypoint is not None:  # the user's own function: its code and packages must be here instead
        sources = entrypoint_problems(job.entrypoint)
        problems = [*sources, *_output_problems(job)]
        if problems:
            raise SpecError("the job cannot run on this machine:\n  " + "\n  ".join(problems), problems=problems,
                            hint="the local backend installs nothing: pip install the missing packages into this environment, "
                            "or run on kubernetes/kfp, whose pods install entrypoint.packages" if any("entrypoint.packages" in p for p in problems) else None)
        return
    sources = _source_problems(job)
    problems = [*sources, *_output_problems(job)]
    config = read_model_config(job.model.source)
    if config is not None:
        problem = _seq_length_problem(job, config)
        if problem:
            problems.append(problem)
    if problems:
        raise SpecError(
            "the job cannot run on this machine:\n  " + "\n  ".join(problems),
            problems=problems,
            hint="relative paths resolve against the current directory, then the spec file's" if len(sources) > len(volume_problems(job)) else None,
        )


def check_model_config(job: Any, model_path: str | os.PathLike) -> None:
    """Refuse ``training.max_seq_length`` beyond the fetched model's positions (its ``config.json``).

    Raises:
        SpecError: naming training.max_seq_length, the model and its limit.
    """
    config = read_model_config(str(model_path))
    problem = _seq_length_problem(job, config) if config is not None else None
    if problem:
        raise SpecError(problem, hint="lower training.max_seq_length (longer rows are cut or dropped: dataset.length_handling)")


def read_model_config(source: str) -> dict | None:
    """The model config of a builtin model or a local model directory, or None when it is not at hand."""
    if source.startswith(f"{C.BUILTIN_SCHEME}://"):
        from .training.builtin import BUILTIN_MODELS

        return BUILTIN_MODELS.get(source.split("://", 1)[1].strip("/"))
    path = _local_path(source)
    if path is None:
        return None
    config = path / "config.json"
    try:
        if not config.is_file() or config.stat().st_size > _MAX_CONFIG_BYTES:
            return None
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable or not JSON: loading the model reports it
    return data if isinstance(data, dict) else None


def model_max_positions(config: dict) -> int | None:
    """The longest sequence a model config allows (``max_position_embeddings`` or its other names), or None."""
    for section in (config, config.get("text_config")):
        if not isinstance(section, dict):
            continue
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


# --- helpers -------------------------------------------------------------------------------------
def _seq_length_problem(job: Any, config: dict) -> str | None:
    limit = model_max_positions(config)
    length = job.training.max_seq_length
    if limit is None or length <= limit:
        return None
    return (
        f"training.max_seq_length: {length} is more than the model {job.model.source} can take "
        f"(max_position_embeddings {limit}); use at most {limit}"
    )


def _local_path(value: str) -> Path | None:
    """The path of a local source (plain path or file://), or None for a remote URI."""
    if "://" in value and not value.startswith("file://"):
        return None
    return Path(value.removeprefix("file://")).expanduser()


def entrypoint_problems(entrypoint: Any) -> list[str]:
    """A missing entrypoint.file, or entrypoint.packages not installed here (by project name; versions are not compared)."""
    from importlib import metadata

    from .spec.entrypoint import requirement_name

    problems = []
    if entrypoint.file is not None and not Path(entrypoint.file).expanduser().is_file():
        problems.append(f"entrypoint.file: no such file: {entrypoint.file}")
    for req in entrypoint.packages:
        try:
            metadata.version(requirement_name(req))
        except metadata.PackageNotFoundError:
            problems.append(f"entrypoint.packages: {req} is not installed here")
    return problems


def volume_problems(job: Any) -> list[str]:
    """``pvc://`` inputs and outputs, which only the kaito flavour reads and writes (Kaito mounts the claim)."""
    fields = [("output.uri", job.output.uri)]
    if job.model is not None:  # an entrypoint job may name neither
        fields.append(("model.source", job.model.source))
    if job.dataset is not None:
        fields += [("dataset.source", job.dataset.source), ("dataset.eval_source", job.dataset.eval_source)]
        fields += [(f"dataset.mix[{i}].source", m.source) for i, m in enumerate(job.dataset.mix)]
    prefix = f"{C.PVC_SCHEME}://"
    return [f"{field}: {value} is a PersistentVolumeClaim, which only kubernetes.flavor kaito mounts (Kaito reads and writes the "
            "volume itself); use s3://, https://, oci:// or hf:// here (kubetune deliver copies data there)"
            for field, value in fields if value and str(value).lower().startswith(prefix)]


def _source_problems(job: Any) -> list[str]:
    problems = volume_problems(job)
    fields = [("model.source", job.model.source), ("dataset.source", job.dataset.source)]
    if job.dataset.eval_source:
        fields.append(("dataset.eval_source", job.dataset.eval_source))
    fields += [(f"dataset.mix[{i}].source", m.source) for i, m in enumerate(job.dataset.mix)]
    if job.dataset.preprocess is not None:
        fields.append(("dataset.preprocess.file", job.dataset.preprocess.file))
    for field, value in fields:
        path = _local_path(value)
        if path is None:
            continue
        try:
            exists = path.exists()
        except OSError as e:  # a name too long, a loop of links
            problems.append(f"{field}: {value}: {e.strerror or e}")
            continue
        if not exists:
            problems.append(f"{field}: no such file or directory: {value}")
        elif not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
            problems.append(f"{field}: {value} cannot be read (permission denied)")
    return problems


def _output_problems(job: Any) -> list[str]:
    out = job.output_dir
    shown = f"output.dir: {out}"
    real = Path(os.path.realpath(out))  # links followed: /tmp/x -> /proc/... counts as /proc
    for root in _SYSTEM_ROOTS:
        if real == root or root in real.parents:
            return [f"{shown} is under {root}, a kernel filesystem; results cannot go there"]
    if len(os.fsencode(str(real))) >= _PATH_MAX or any(len(os.fsencode(part)) > _NAME_MAX for part in real.parts):
        return [f"{shown} is too long a path ({_NAME_MAX} bytes a name, {_PATH_MAX} in all)"]
    existing = real
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "exists and is not a directory" if existing == real else f"cannot be created: {existing} is a file, not a directory"
        return [f"{shown} {what}"]
    try:  # the only reliable test (root passes every permission check, but not a read-only or immutable filesystem)
        fd, probe = tempfile.mkstemp(prefix=".kubetune-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = e.strerror or str(e)
        where = "" if existing == real else f" (in {existing}, where it would be created)"
        return [f"{shown} cannot be written{where}: {why}"]
    return []
