"""Checking a spec the way ``POST /v1/jobs`` would, for the submit page: each problem as its field path, its
message and, where the YAML text has that field, its line (1-based), so the page shows the error at the field."""

from __future__ import annotations

import re

from ...spec.reader import Located, parse_spec_text, where_written

__all__ = ["validate_spec_text", "field_line"]

_PROBLEM_RE = re.compile(r"^(?P<field>[A-Za-z0-9_.\[\]-]+): (?P<message>.*)$", re.S)
_SERVER_ONLY = {  # what the jobs server refuses although the spec itself is valid (native.py says why)
    "entrypoint": "the jobs server runs the built-in fine-tune only, never a client's own training function",
    "dataset.preprocess": "the jobs server runs no client code; preprocess the rows first and upload the result",
}


def field_line(located: Located, field: str) -> int | None:
    """The 1-based line of ``field`` (``training.max_steps``, ``dataset.mix[0].source``) in the parsed spec
    ``located`` (:func:`~kubetune.spec.reader.parse_spec_text`); the nearest written parent's line when the field
    itself is not written; None when nothing on its path is."""
    path = tuple(p for p in re.split(r"[.\[\]]+", field) if p)
    return _line_of(where_written(path, located))


def _line_of(message: str) -> int | None:
    m = re.search(r"\bspec:(\d+)", message)
    return int(m.group(1)) if m else None


def _problem(located: Located, raw: str) -> dict:
    m = _PROBLEM_RE.match(raw.strip())
    field, message = (m["field"], m["message"]) if m else (None, raw.strip())
    return {"field": field, "message": message, "line": field_line(located, field) if field else None}


def validate_spec_text(text: str) -> dict:
    """``{"valid": bool, "errors": [{"field", "message", "line"}], "spec": resolved spec or None}``."""
    from ...errors import SpecError
    from ...spec import load_spec, spec_to_dict

    try:  # the spec's bounded YAML reader: duplicate keys, alias bombs and oversized documents are refused with their line
        parsed, located = parse_spec_text(text, "spec")
    except SpecError as e:
        return {"valid": False, "spec": None, "errors": [{"field": None, "message": f"not valid YAML: {e.message}",
                                                          "line": _line_of(e.message)}]}
    if not isinstance(parsed, dict):
        return {"valid": False, "spec": None, "errors": [{"field": None, "line": None,
                                                          "message": "the spec must be a mapping of sections (name, model, dataset, ...)"}]}
    try:
        job = load_spec(parsed)
    except SpecError as e:
        return {"valid": False, "spec": None, "errors": [_problem(located, p) for p in e.problems]}
    refused = [f for f, set_ in (("entrypoint", job.entrypoint is not None),
                                 ("dataset.preprocess", job.dataset is not None and job.dataset.preprocess is not None)) if set_]
    if refused:
        return {"valid": False, "spec": None, "errors": [{"field": f, "message": _SERVER_ONLY[f], "line": field_line(located, f)} for f in refused]}
    return {"valid": True, "spec": spec_to_dict(job), "errors": []}
