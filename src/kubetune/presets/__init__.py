"""Method presets: the defaults each training method starts from, kept as data (one YAML file each).

A job with ``method.type: qlora`` starts from ``qlora.yaml``; every field the spec sets wins, field by
field (:meth:`kubetune.spec.TuneJob.field_sources` tells which value came from where). Presets may set
``method.lora.*`` and ``training.*`` fields only. ``target_modules.yaml`` maps architectures to the
module names behind ``method.lora.target_modules: attention | mlp``.

A preference objective (``method.objective: dpo | orpo``) adds its own preset from ``objectives/NAME.yaml``
on top of the method's: its ``method.dpo.*`` / ``method.orpo.*`` values, and training values that may
depend on ``method.type`` (a mapping from type to value, e.g. the learning rate).

Only YAML is read here, so the CLI's ``validate`` and ``presets`` stay light.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "preset_names", "load_preset", "preset_values", "objective_names", "load_objective", "objective_values",
    "target_modules_for", "architectures", "PRESET_SECTIONS",
]  # fmt: skip

_HERE = Path(__file__).parent
_TARGET_MODULES_FILE = "target_modules.yaml"
# The spec sections a preset may fill (dotted paths from the job's root).
PRESET_SECTIONS = ("method.lora", "training")
_OBJECTIVES = _HERE / "objectives"


def preset_names() -> list[str]:
    """Names of the shipped presets (one per method type)."""
    return sorted(p.stem for p in _HERE.glob("*.yaml") if p.name != _TARGET_MODULES_FILE)


@functools.lru_cache(maxsize=None)
def _read(name: str, folder: Path = _HERE) -> dict:
    path = folder / f"{name}.yaml"
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


def objective_names() -> list[str]:
    """Names of the shipped preference-objective presets (``dpo``, ``orpo``)."""
    return sorted(p.stem for p in _OBJECTIVES.glob("*.yaml"))


def _read_objective(name: str) -> dict:
    return _read(name, _OBJECTIVES)


def load_objective(name: str) -> dict:
    """The objective preset ``name`` as written (a copy).

    Raises:
        KeyError: no objective preset of that name.
    """
    return copy.deepcopy(_read_objective(name))


def objective_values(name: str, method_type: str) -> dict[str, Any]:
    """The objective preset's values for ``method_type``, flattened to dotted paths.

    ``{"method.dpo.beta": 0.1, "training.learning_rate": 5e-6, ...}``; a training value given as a mapping
    from method type to value takes this type's entry. ``sft`` has no preset (an empty dict).

    Raises:
        ValueError: the preset sets something outside ``method.NAME`` and ``training`` (a packaging bug).
    """
    if name == "sft":
        return {}
    data = load_objective(name)
    data.pop("description", None)
    method = data.pop("method", None) or {}
    training = data.pop("training", None) or {}
    own = method.pop(name, None) or {}
    if data or method or not isinstance(training, dict) or not isinstance(own, dict):
        raise ValueError(f"objective preset {name}: presets may set only method.{name}.* and training.*")
    flat = {f"method.{name}.{k}": v for k, v in own.items()}
    for k, v in training.items():
        if isinstance(v, dict):
            if method_type in v:
                flat[f"training.{k}"] = v[method_type]
        else:
            flat[f"training.{k}"] = v
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
