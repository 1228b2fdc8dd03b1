"""The ``entrypoint`` section: a user's own training function instead of kubetune's built-in fine-tune.

The function is the user's own code: it runs with the job's privileges wherever the job runs (docs/custom-training.md).
Unlike kubetune's own machinery, which never imports a dotted path taken from a spec, this section names code on
purpose, and only the user's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .. import constants as C
from .base import _Section

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# A pip requirement line: a project name, optional [extras], then an optional version specifier or marker.
# What pip would read as an option (-r, --index-url) or several lines is refused: the line reaches a shell.
_REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,\s-]+\])?\s*([<>=!~;@ ].*)?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def requirement_name(requirement: str) -> str:
    """The project name of a pip requirement line (``numpy>=2`` -> ``numpy``)."""
    return re.split(r"[\[<>=!~;@ ]", requirement.strip(), maxsplit=1)[0]


class EntrypointSpec(_Section):
    """A Python function that kubetune runs under torchrun on every process of the job, instead of its built-in fine-tune."""

    file: str | None = Field(
        None, description="A Python file holding the function (relative to the spec file, or the current directory); "
        "shipped to clusters in the spec's ConfigMap, no image build."
    )
    module: str | None = Field(None, description="An importable module holding the function, e.g. mypkg.train (it must be in the image).")
    source: str | None = Field(
        None, max_length=C.ENTRYPOINT_MAX_SOURCE_CHARS,
        description="The function's Python source itself (what kubetune.train(func=...) writes); self-contained: imports inside it."
    )
    function: str = Field("main", description="The function to call, with args as keyword arguments.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the function (JSON values).")
    packages: list[str] = Field(
        default_factory=list, max_length=C.ENTRYPOINT_MAX_PACKAGES,
        description="pip requirements installed in each pod before the function runs (Kubernetes, KFP); the local "
        "backend installs nothing and refuses a job whose packages are missing here.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables set in every process before the function is loaded.")

    @field_validator("function")
    @classmethod
    def _check_function(cls, v: str) -> str:
        if not _IDENT_RE.match(v):
            raise ValueError(f"'{v}' is not a Python function name (a module-level function of the file, module or source)")
        return v

    @field_validator("module")
    @classmethod
    def _check_module(cls, v: str | None) -> str | None:
        if v is not None and not _MODULE_RE.match(v):
            raise ValueError(f"'{v}' is not a dotted module path, e.g. mypkg.train")
        return v

    @field_validator("args")
    @classmethod
    def _check_args(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in v if not _IDENT_RE.match(k)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: argument names must be Python identifiers (they are keyword arguments)")
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"arguments must be JSON values (numbers, strings, lists, mappings), as the spec travels to clusters: {e}") from None
        return v

    @field_validator("packages")
    @classmethod
    def _check_packages(cls, v: list[str]) -> list[str]:
        for req in v:
            if not isinstance(req, str) or "\n" in req or not _REQUIREMENT_RE.match(req.strip()):
                raise ValueError(f"{req!r} is not a pip requirement: give a project name with an optional version, e.g. numpy>=2 (no pip options)")
        return [r.strip() for r in v]

    @field_validator("env")
    @classmethod
    def _check_env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_NAME_RE.match(k) or k.startswith("KUBETUNE_")]
        if bad:
            raise ValueError(f"{', '.join(bad)}: environment variable names are letters, digits and '_' (KUBETUNE_* are kubetune's own)")
        return v

    @model_validator(mode="after")
    def _one_place(self) -> "EntrypointSpec":
        given = [k for k in ("file", "module", "source") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "name the function's code in exactly one way: file (a Python file), module (a module in the image) or source"
                + (f"; got {' and '.join(given)}" if given else "")
            )
        return self

    def describe(self) -> str:
        """How people see the function: ``train.py:main``, ``mypkg.train:main`` or ``<source>:main``."""
        where = self.module or (self.file.rsplit("/", 1)[-1] if self.file else "<source>")
        return f"{where}:{self.function}"


# --- how an entrypoint changes the job around it (spec/job.py's TuneJob calls these) ---------------
# The training fields an entrypoint job takes: how to treat earlier checkpoints, and the CPU threads of each process.
CUSTOM_TRAINING_FIELDS = frozenset({"resume", "cpu_threads"})


def check_built_in_input(value: Any, info: ValidationInfo) -> Any:
    """model and dataset: required by the built-in fine-tune, refused beside an entrypoint (its function fetches its own)."""
    if "entrypoint" not in info.data:  # the entrypoint itself is invalid: its own error says what to fix
        return value
    custom = info.data["entrypoint"] is not None
    if value is None and not custom:
        raise ValueError("required field is missing (or set entrypoint to run your own training function)")
    if value is not None and custom:
        raise ValueError(
            f"an entrypoint job takes no {info.field_name}: your function reads what it needs "
            "(e.g. with kubetune.storage.fetch); remove it, or remove entrypoint for the built-in fine-tune"
        )
    return value


def check_custom_job(job: Any) -> Any:
    """Refuse what an entrypoint job would silently ignore: method, sweep, training fields but resume/cpu_threads, output.merge.

    Returns:
        ``job``.

    Raises:
        ValueError: naming every such field.
    """
    if job.entrypoint is None:
        return job
    if "sweep" in job.model_fields_set:
        raise ValueError("sweep: sweeps over an entrypoint job are not supported yet; run one job per setting "
                         "(--set entrypoint.args.NAME=VALUE --set name=...)")
    unused = ["method"] if "method" in job.model_fields_set else []
    unused += [f"training.{k}" for k in sorted(job.training.model_fields_set - CUSTOM_TRAINING_FIELDS)]
    if job.output.merge:
        unused.append("output.merge")
    if unused:
        raise ValueError(
            f"{', '.join(unused)}: not used by an entrypoint job (your function trains); remove them. An entrypoint "
            f"job takes name, entrypoint, resources, output.dir/uri, training.{'/'.join(sorted(CUSTOM_TRAINING_FIELDS))}, kubernetes and kfp"
        )
    return job


def dump_without_unused(job: Any, data: dict) -> dict:
    """The job's dump without what it does not use: an unset entrypoint (so built-in jobs dump exactly as before), and an
    entrypoint job's model, dataset, method, sweep and training fields other than resume/cpu_threads."""
    if job.entrypoint is None:
        data.pop("entrypoint", None)
        return data
    for key in ("model", "dataset", "method", "sweep"):
        data.pop(key, None)
    if "training" in data:
        data["training"] = {k: v for k, v in data["training"].items() if k in CUSTOM_TRAINING_FIELDS}
    return data
