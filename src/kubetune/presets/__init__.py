"""Method presets: the defaults each training method starts from, kept as data (one YAML file each).

A job with ``method.type: qlora`` starts from ``qlora.yaml``; every field the spec sets wins, field by
field (:meth:`kubetune.spec.TuneJob.field_sources` tells which value came from where). Presets may set
``method.lora.*`` and ``training.*`` fields only. ``target_modules.yaml`` maps architectures to the
module names behind ``method.lora.target_modules: attention | mlp``.

Only YAML is read here, so the CLI's ``validate`` and ``presets`` stay light.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml

__all__ = ["preset_names", "load_preset", "preset_values", "target_modules_for", "architectures", "explain_spec", "PRESET_SECTIONS"]

_HERE = Path(__file__).parent
_TARGET_MODULES_FILE = "target_modules.yaml"
# The spec sections a preset may fill (dotted paths from the job's root).
PRESET_SECTIONS = ("method.lora", "training")


def preset_names() -> list[str]:
    """Names of the shipped presets (one per method type)."""
    return sorted(p.stem for p in _HERE.glob("*.yaml") if p.name != _TARGET_MODULES_FILE)


@functools.lru_cache(maxsize=None)
def _read(name: str) -> dict:
    path = _HERE / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(name)
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset must be a mapping")
    return data


def load_preset(name: str) -> dict:
    """The preset ``name`` as written: ``description`` plus ``method``/``training`` sections (a copy).

    Raises:
        KeyError: no preset of that name.
    """
    return copy.deepcopy(_read(name))


def preset_values(name: str) -> dict[str, Any]:
    """The preset's field values flattened to dotted paths, e.g. ``{"training.learning_rate": 2e-4}``.

    Raises:
        KeyError: no preset of that name.
        ValueError: the preset sets something outside :data:`PRESET_SECTIONS` (a packaging bug).
    """
    data = load_preset(name)
    data.pop("description", None)
    method = data.pop("method", None) or {}
    training = data.pop("training", None) or {}
    lora = method.pop("lora", None) or {}
    if data or method or not isinstance(training, dict) or not isinstance(lora, dict):
        raise ValueError(f"preset {name}: presets may set only {', '.join(s + '.*' for s in PRESET_SECTIONS)}")
    flat = {f"method.lora.{k}": v for k, v in lora.items()}
    flat.update({f"training.{k}": v for k, v in training.items()})
    return flat


@functools.lru_cache(maxsize=None)
def _target_table() -> dict:
    return yaml.safe_load((_HERE / _TARGET_MODULES_FILE).read_text(encoding="utf-8")) or {}


def architectures() -> list[str]:
    """Architectures (``config.model_type``) with target-module presets."""
    return sorted(_target_table())


def target_modules_for(model_type: str, group: str) -> list[str] | None:
    """Module names of ``group`` (``attention`` or ``mlp``) for an architecture, or None when unknown."""
    entry = _target_table().get(model_type)
    if not entry or group not in entry:
        return None
    return list(entry[group])


def explain_spec(job: Any) -> str:
    """The resolved spec as YAML, every value followed by where it came from (spec, preset NAME, default).

    Credentials are masked as in spec.yaml (:func:`kubetune.spec.redacted_spec_dict`).
    """
    from ..spec import redacted_spec_dict

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
