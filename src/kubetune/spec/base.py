"""Shared pieces of the spec sections: URIs, the strict section base class and number handling."""

from __future__ import annotations

import math
import re
import types as types_
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator




# Schemes a model, dataset or output may name. A plain path (no scheme) is a local path. pvc://CLAIM: the kaito
# flavour's volume input and output only (every other backend and flavour refuses it).
URI_SCHEMES = ("file", "hf", "s3", "http", "https", "oci", "builtin", "pvc")
_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_uri(value: str) -> str:
    """Return ``value`` if it is a local path or a URI with a supported scheme, else raise ValueError."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty path or URI")
    m = _SCHEME_RE.match(value)
    if m and m.group(1).lower() not in URI_SCHEMES:
        raise ValueError(
            f"unknown URI scheme '{m.group(1)}://' in '{value}'; supported: "
            + ", ".join(f"{s}://" for s in URI_SCHEMES)
            + " or a local path"
        )
    return value


# A number as text: YAML 1.1 (PyYAML) reads exponents without a dot, like 1e-4, as strings.
_NUMBER_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class _Section(BaseModel):
    # allow_inf_nan: no NaN or infinity in any number of a spec
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """Numbers are numbers: true/false is not one; '1e9' (a string to YAML 1.1) counts as 1e9 for an integer field,
        which then must be whole and in range."""
        kind = _number_kind(cls, info.field_name)
        if kind is None:
            return v
        if isinstance(v, bool):
            raise ValueError(f"expected a number, got {str(v).lower()}")
        if kind is int and isinstance(v, str) and _NUMBER_RE.match(v.strip()) and not v.strip().lstrip("+-").isdigit():
            v = float(v)
        if kind is int and isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)  # 1e38 too: the field's bounds then name the limit
        return v


_NUMBER_KINDS: dict[type, dict[str, type]] = {}


def _number_kind(cls: type[BaseModel], name: str | None) -> type | None:
    """int or float when field ``name`` of ``cls`` holds a number (possibly optional), else None."""
    kinds = _NUMBER_KINDS.get(cls)
    if kinds is None:
        kinds = {}
        for field_name, field in cls.model_fields.items():
            ann = field.annotation
            types = set(get_args(ann)) - {type(None)} if get_origin(ann) in (Union, types_.UnionType) else {ann}
            if types in ({int}, {float}):
                kinds[field_name] = next(iter(types))
        _NUMBER_KINDS[cls] = kinds
    return kinds.get(name or "")




# The model every field path starts from: TuneJob, registered by spec/job.py once it is defined (job.py
# imports the section and validation modules, so they cannot import it back).
_ROOT: list[type[BaseModel]] = []


def register_root(model: type[BaseModel]) -> None:
    """Make ``model`` the root of field paths (called once, by spec/job.py)."""
    _ROOT[:] = [model]


def root_model() -> type[BaseModel]:
    """The root of field paths (TuneJob)."""
    return _ROOT[0]
