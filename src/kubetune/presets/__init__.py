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
from pathlib import Path
from typing import Any

import yaml

__all__ = ["preset_names", "load_preset", "preset_values", "target_modules_for", "architectures", "PRESET_SECTIONS"]

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
