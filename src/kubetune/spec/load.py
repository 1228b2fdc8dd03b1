"""Loading a spec (a YAML file, a dict or text) and writing the resolved one back (``spec.yaml``, redacted)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from ..errors import SpecError
from ..redact import MASK, has_credentials, redact_data
from .reader import Located, check_shape, read_spec_file
from .cluster import _SECRET_VALUE_RE, _secretish_env_name
from .validate import _yaml_type


from .job import TuneJob
from .validate import validate_job

def load_spec(source: str | os.PathLike | dict, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> TuneJob:
    """Load, override and validate a job spec.

    A spec file is read within bounds (size, aliases, nesting, one UTF-8 YAML document, no duplicate
    keys: see :mod:`kubetune.spec.reader`); errors name the file and line. A null value unsets its field:
    the field's preset or default applies, or None where the field takes None.

    Args:
        source: a YAML file path, or a dict with the spec's fields.
        overrides: ``path=value`` strings (like ``helm --set``) or a mapping of dotted paths to values,
            applied before validation.

    Returns:
        The validated :class:`TuneJob`; it remembers which fields the spec (and overrides) set.

    Raises:
        SpecError: the file is missing, too big or not YAML, or the spec is invalid (all problems listed).
    """
    base: Path | None = None
    label = ""
    located = Located()
    if isinstance(source, dict):
        check_shape(source)  # before copying: bounded in size and depth, no cycles
        data = _deep_copy(source)
    else:
        path = Path(source)
        label = str(path)
        raw, located = read_spec_file(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: a job spec must be a YAML mapping (model:, dataset:, ...), got a {_yaml_type(raw)}")
        data = _deep_copy(raw)  # aliased sections become separate: an override changes one place only
        base = path.parent.resolve()
        if data.get("name") is None:
            data["name"] = _name_from_file(path)
    return validate_job(data, overrides, base=base, label=label, located=located)


def _name_from_file(path: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-")
    return (name if name and name[0].isalpha() else f"job-{name}")[:40].rstrip("-") or "kubetune-job"


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def spec_to_dict(job: TuneJob) -> dict:
    """The resolved spec as plain data (every default filled in), credentials included: for the job itself
    (the worker, rendering), never for showing or saving (:func:`redacted_spec_dict`)."""
    return job.model_dump(mode="json")


def redacted_spec_dict(job: TuneJob) -> dict:
    """The resolved spec as plain data with every credential masked (``***``): the user-info and credential
    parameters of each URI (:mod:`kubetune.redact`), and the values of ``kubernetes.env`` variables whose names
    look like credentials. What ``spec.yaml``, ``kubetune validate`` and sweep records show."""
    data = redact_data(spec_to_dict(job))
    env = (data.get("kubernetes") or {}).get("env") or {}
    for name in env:
        if _secretish_env_name(name) or _SECRET_VALUE_RE.search(str(env[name])):
            env[name] = MASK
    return data


def dump_spec(job: TuneJob) -> str:
    """The resolved spec as YAML, in field order, credentials masked (what ``spec.yaml`` holds)."""
    return yaml.dump(redacted_spec_dict(job), Dumper=_SpecDumper, sort_keys=False, allow_unicode=True)


class _SpecDumper(yaml.SafeDumper):
    """safe_dump, with multi-line strings (an entrypoint's source) as literal blocks that read like the code they hold."""


def _str(dumper: yaml.SafeDumper, value: str):
    block = "\n" in value and not any(line != line.rstrip() for line in value.splitlines())
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_SpecDumper.add_representer(str, _str)


def spec_warnings(job: TuneJob) -> list[str]:
    """Things in a valid spec that are probably a mistake, one message each (shown by validate, render, run).

    Today: ``kubernetes.env`` values that look like credentials (by the variable's name, or by the value's
    shape: a known token format, a URI with credentials), which would be visible in the rendered objects.
    """
    out = []
    for name, value in job.kubernetes.env.items():
        why = ("its name looks like a credential" if _secretish_env_name(name)
               else "its value looks like a credential" if _SECRET_VALUE_RE.search(value) or has_credentials(value) else None)
        if why:
            out.append(
                f"kubernetes.env.{name}: {why}, and a literal value is visible to anyone who can read the rendered objects "
                f"or the pod spec; put it in a Secret and reference it: kubernetes.secrets.env: [{{var: {name}, secret: NAME, key: KEY}}]"
            )
    return out


def explain_spec(job: Any) -> str:
    """The resolved spec as YAML, every value followed by where it came from (spec, preset NAME, default).

    Credentials are masked as in spec.yaml (:func:`kubetune.spec.redacted_spec_dict`).
    """
    sources = job.field_sources()
    lines: list[str] = []

    def scalar(value: Any) -> str:
        if isinstance(value, str) and ("\n" in value or "#" in value):
            return json.dumps(value)  # one line, and valid YAML
        text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip()
        return text.removesuffix("\n...").removesuffix("...").strip()

    def walk(node: dict, prefix: str, indent: int) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            pad = "  " * indent
            if isinstance(value, dict) and value and not _is_leaf(path, sources):
                lines.append(f"{pad}{key}:")
                walk(value, path + ".", indent + 1)
            else:
                src = sources.get(path, "default")
                lines.append(f"{pad}{key}: {scalar(value)}  # {src}")

    walk(redacted_spec_dict(job), "", 0)
    return "\n".join(lines) + "\n"


def _is_leaf(path: str, sources: dict[str, str]) -> bool:
    return path in sources
