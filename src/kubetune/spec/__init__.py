"""The job spec: one declarative description of a fine-tune, loaded from YAML or built in Python.

Every section is a pydantic model with ``extra="forbid"``; defaults live here and nowhere else.
``load_spec`` turns YAML (plus ``--set`` overrides) into a validated :class:`TuneJob`, and turns
pydantic's errors into one :class:`~kubetune.errors.SpecError` whose lines name the file:line (or the
override), the field path and, for unknown keys, the closest valid key. The YAML is read within bounds
(:mod:`kubetune.spec.reader`), and every number has a sane range.

A job remembers which fields its spec set; method presets fill the rest. A job derived from another
(a sweep trial, ``Client.submit(job, overrides)``) is made by :meth:`TuneJob.with_overrides`, never by
dumping the resolved spec and loading it back, which would count every preset value as set by the user.
"""

from __future__ import annotations

from .base import URI_SCHEMES, check_uri
from .cluster import KfpSpec, KubernetesSpec
from .entrypoint import EntrypointSpec
from .job import (
    DatasetSourceSpec,
    DatasetSpec,
    LoraSpec,
    MethodSpec,
    ModelSpec,
    OutputSpec,
    ResourcesSpec,
    TrainingSpec,
    TuneJob,
)
from .load import dump_spec, explain_spec, load_spec, redacted_spec_dict, spec_to_dict, spec_warnings
from .sweep import SweepParamSpec, SweepSpec
from .validate import apply_overrides, merge_specs

__all__ = [
    "TuneJob",
    "ModelSpec",
    "DatasetSpec",
    "DatasetSourceSpec",
    "LoraSpec",
    "MethodSpec",
    "TrainingSpec",
    "OutputSpec",
    "ResourcesSpec",
    "EntrypointSpec",
    "load_spec",
    "apply_overrides",
    "merge_specs",
    "spec_to_dict",
    "dump_spec",
    "redacted_spec_dict",
    "spec_warnings",
    "explain_spec",
    "URI_SCHEMES",
    "check_uri",
    "KubernetesSpec",
    "KfpSpec",
    "SweepSpec",
    "SweepParamSpec",
]
