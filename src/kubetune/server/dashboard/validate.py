"""Checking a spec the way ``POST /v1/jobs`` would, for the submit page: each problem as its field path, its
message and, where the YAML text has that field, its line (1-based), so the page shows the error at the field."""

from __future__ import annotations

import re

__all__ = ["validate_spec_text", "field_line"]

_PROBLEM_RE = re.compile(r"^(?P<field>[A-Za-z0-9_.\[\]-]+): (?P<message>.*)$", re.S)
_SERVER_ONLY = {  # what the jobs server refuses although the spec itself is valid (native.py says why)
    "entrypoint": "the jobs server runs the built-in fine-tune only, never a client's own training function",
    "dataset.preprocess": "the jobs server runs no client code; preprocess the rows first and upload the result",
}


def field_line(text: str, field: str) -> int | None:
    """The 1-based line of ``field`` (``training.max_steps``) in the YAML ``text``; the nearest existing parent's
    line when the field itself is missing; None when the text is not YAML."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in field.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if hit is None:
            break
        line, node = hit[0].start_mark.line + 1, hit[1]
    return line


def _line_of(message: str) -> int | None:
    m = re.search(r"\bspec:(\d+)", message)
    return int(m.group(1)) if m else None


def _problem(text: str, raw: str) -> dict:
    m = _PROBLEM_RE.match(raw.strip())
    field, message = (m["field"], m["message"]) if m else (None, raw.strip())
    return {"field": field, "message": message, "line": field_line(text, field) if field else None}


def validate_spec_text(text: str) -> dict:
    """``{"valid": bool, "errors": [{"field", "message", "line"}], "spec": resolved spec or None}``."""
    from ...errors import SpecError
    from ...spec import load_spec, spec_to_dict
    from ...spec.reader import parse_spec_text

    try:  # the spec's bounded YAML reader: duplicate keys, alias bombs and oversized documents are refused with their line
        parsed = parse_spec_text(text, "spec")[0]
    except SpecError as e:
        return {"valid": False, "spec": None, "errors": [{"field": None, "message": f"not valid YAML: {e.message}",
                                                          "line": _line_of(e.message)}]}
    if not isinstance(parsed, dict):
        return {"valid": False, "spec": None, "errors": [{"field": None, "line": None,
                                                          "message": "the spec must be a mapping of sections (name, model, dataset, ...)"}]}
    try:
        job = load_spec(parsed)
    except SpecError as e:
        return {"valid": False, "spec": None, "errors": [_problem(text, p) for p in e.problems]}
    refused = [f for f, set_ in (("entrypoint", job.entrypoint is not None),
                                 ("dataset.preprocess", job.dataset is not None and job.dataset.preprocess is not None)) if set_]
    if refused:
        return {"valid": False, "spec": None, "errors": [{"field": f, "message": _SERVER_ONLY[f], "line": field_line(text, f)} for f in refused]}
    return {"valid": True, "spec": spec_to_dict(job), "errors": []}
