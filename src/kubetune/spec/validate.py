"""From plain data to a validated job: ``--set`` overrides, null-means-unset, relative paths, and pydantic's
errors turned into one SpecError naming file:line and the closest valid key. Field paths start at the root
model, :class:`~kubetune.spec.job.TuneJob` (:func:`base.root_model`)."""

from __future__ import annotations

import copy
import difflib
import os
import types as types_
from pathlib import Path
from typing import Any, Iterable, Mapping, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ..errors import SpecError
from .reader import Located, check_shape, parse_value, where_written
from .base import _SCHEME_RE


from .base import root_model

# --- loading, overrides, errors --------------------------------------------------------------
def merge_specs(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict:
    """``base`` with ``extra`` merged in, recursively: mappings merge key by key, anything else in ``extra``
    (a value, a list) replaces what ``base`` has. Neither is changed (a server's method defaults under a request)."""
    out = copy.deepcopy(dict(base))
    for k, v in extra.items():
        out[k] = merge_specs(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
    return out


def _override_items(overrides: Mapping[str, Any] | Iterable[str] | None) -> Iterable[tuple[str, Any, str]]:
    """(key, value, how to name it in errors) for each override: ``KEY=VALUE`` strings or a mapping."""
    if overrides is None:
        return
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            if not isinstance(key, str):
                raise SpecError(f"override {key!r}: keys are dotted field paths, e.g. training.learning_rate")
            yield key, value, f"override '{key}'"
        return
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Iterable):
        what = f"the single string {overrides!r}" if isinstance(overrides, (str, bytes)) else type(overrides).__name__
        raise SpecError(f"overrides: expected a list of KEY=VALUE strings or a mapping, got {what}")
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. training.learning_rate=1e-4")
        key, _, raw = item.partition("=")
        yield key, parse_value(raw), f"--set '{item}'"


def apply_overrides(data: dict, overrides: Mapping[str, Any] | Iterable[str] | None, located: Located | None = None) -> dict:
    """Apply overrides to a spec dict (in place) and return it.

    Args:
        data: the spec as plain data.
        overrides: ``path.to.key=value`` strings (values parsed as YAML) or a mapping of dotted paths to
            values. A number in a path indexes an existing list item. A null value is kept: validation
            then unsets that field (see :func:`load_spec`).
        located: where each value was written; overridden paths are recorded as coming from the override.

    Raises:
        SpecError: an override is not of the form KEY=VALUE, or walks through a value that is not a section.
    """
    for key, value, item in _override_items(overrides):
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"{item}: empty key")
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    has = f"items 0 to {len(node) - 1}" if node else "no items"
                    raise SpecError(f"{item}: '{here}': '{'.'.join(parts[:i])}' is a list with {has}; give an index")
                part = int(part)  # type: ignore[assignment]
            elif not isinstance(node, dict):
                raise SpecError(f"{item}: '{'.'.join(parts[:i])}' is not a section")
            if last:
                node[part] = value
            else:
                nxt = node[part] if isinstance(node, list) else node.get(part)
                if nxt is None:
                    nxt = node[part] = {}
                node = nxt
        if located is not None:
            path = tuple(parts)
            for known in [k for k in located if k[: len(path)] == path]:
                del located[known]
            located[path] = item
    return data


def _unset_nulls(data: Any, model: type[BaseModel]) -> None:
    """null means unset: drop null values of fields that take no None, so their preset or default applies."""
    if not isinstance(data, dict):
        return
    for key in list(data):
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        value, annotation = data[key], field.annotation
        if value is None:
            if not _takes_none(annotation):
                del data[key]
            continue
        inner = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) in (Union, types_.UnionType) else [annotation]
        for ann in inner:
            origin, args = get_origin(ann), get_args(ann)
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                _unset_nulls(value, ann)
            elif origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel) and isinstance(value, list):
                for entry in value:
                    _unset_nulls(entry, args[0])
            elif origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel) and isinstance(value, dict):
                for entry in value.values():
                    _unset_nulls(entry, args[1])


def _takes_none(annotation: Any) -> bool:
    return annotation is Any or (get_origin(annotation) in (Union, types_.UnionType) and type(None) in get_args(annotation))


def _model_at(path: tuple, root: type[BaseModel] = None) -> type[BaseModel] | None:  # type: ignore[assignment]
    """The pydantic model class found by walking ``path`` from TuneJob (for key suggestions)."""
    model: Any = root or root_model()
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    args = getattr(annotation, "__args__", None)
    if args:
        for a in args:
            if isinstance(a, type) and issubclass(a, BaseModel):
                return a
    return annotation


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        try:
            return f"{value:.3g}"
        except OverflowError:  # beyond any float (and str() refuses past 4300 digits)
            return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format_errors(err: ValidationError, source: str, located: Located | None = None) -> SpecError:
    problems = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        path = ".".join(loc) or "(spec)"
        if e["type"] == "extra_forbidden":
            parent = _model_at(tuple(e["loc"][:-1]))
            hint = ""
            if parent is not None:
                close = difflib.get_close_matches(loc[-1], list(parent.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f"; did you mean {'.'.join(loc[:-1] + (close[0],))}?"
                else:
                    hint = f"; valid keys here: {', '.join(parent.model_fields)}"
            problem = f"{path}: unknown key{hint}"
        elif e["type"] == "missing":
            problem = f"{path}: required field is missing"
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            val = e.get("input")
            shown = "" if isinstance(val, (dict, list)) or val is None or " got " in msg else f" (got {_shown(val)})"
            problem = f"{path}: {msg}{shown}"
        where = where_written(loc, located)
        problems.append(f"{where}: {problem}" if where else problem)
    head = f"invalid job spec {source}" if source else "invalid job spec"
    return SpecError(head + ":\n  " + "\n  ".join(problems), problems=problems)


def _resolve_local_paths(data: dict, base: Path | None) -> None:
    """Make relative local dataset/model paths (and dataset.preprocess.file) absolute: the current directory first, then the spec's."""

    def fix(section: dict | None, key: str) -> None:
        if not isinstance(section, dict):
            return
        v = section.get(key)
        if not isinstance(v, str) or _SCHEME_RE.match(v) or os.path.isabs(v):
            return
        p = Path(v).expanduser()
        for candidate in (Path.cwd() / p, (base / p) if base else None):
            if candidate is not None and candidate.exists():
                section[key] = str(candidate.resolve())
                return

    fix(data.get("model"), "source")
    fix(data.get("dataset"), "source")
    fix(data.get("dataset"), "eval_source")
    fix(data.get("entrypoint"), "file")  # the user's training function (spec/entrypoint.py)
    if isinstance(data.get("dataset"), dict):
        fix(data["dataset"].get("preprocess"), "file")
    mix = data.get("dataset", {}).get("mix") if isinstance(data.get("dataset"), dict) else None
    for entry in mix if isinstance(mix, list) else []:
        fix(entry, "source")


def validate_job(
    data: dict, overrides: Mapping[str, Any] | Iterable[str] | None, *, base: Path | None = None, label: str = "", located: Located | None = None
) -> Any:
    """Overrides, bounds, null-means-unset and relative paths, then the models: the one way a TuneJob is made."""
    apply_overrides(data, overrides, located)
    check_shape(data, label, located)
    _unset_nulls(data, root_model())
    _resolve_local_paths(data, base)
    try:
        return root_model().model_validate(data)
    except ValidationError as e:
        raise _format_errors(e, label, located) from None


def _yaml_type(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), type(value).__name__)


