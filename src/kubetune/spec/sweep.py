"""The ``sweep`` section: which fields a sweep varies, how, and when it stops trials."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from .. import constants as C
from .base import _NUMBER_RE, _Section, root_model
from .validate import _shown, _unwrap


# --- sweep -----------------------------------------------------------------------------------
# Fields a sweep sets on every trial itself, so no grid or distribution may vary them.
_SWEEP_RESERVED = ("name", "output.dir", "output.uri", "sweep")


def _sweep_number(value: Any) -> Any:
    """'1e-4' -> 0.0001: YAML 1.1 reads exponents without a dot as strings; sweeps want numbers."""
    if isinstance(value, str) and _NUMBER_RE.match(value.strip()):
        text = value.strip()
        return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
    return value


def _sweep_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be swept (unknown or reserved field), or None."""
    parts = key.split(".")
    if not all(parts) or any(key == r or key.startswith(r + ".") for r in _SWEEP_RESERVED):
        return f"'{key}' cannot be swept" + ("" if all(parts) else " (empty path component)") + (
            "; the sweep sets name, output.dir and output.uri of each trial itself" if all(parts) else ""
        )
    model: Any = root_model()
    for i, part in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None  # inside a free-form mapping (kubernetes.env, dataset.columns): any key goes
        if part not in model.model_fields:
            close = difflib.get_close_matches(part, list(model.model_fields), n=1, cutoff=0.6)
            where = ".".join(parts[:i] + [close[0]]) if close else None
            return f"'{key}' is not a spec field" + (f"; did you mean {where}?" if where else f"; valid keys here: {', '.join(model.model_fields)}")
        model = _unwrap(model.model_fields[part].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return f"'{key}' is a section; sweep one of its fields, e.g. {key}.{next(iter(model.model_fields))}"
    return None


class SweepParamSpec(_Section):
    """A distribution that random search draws one hyperparameter from."""

    type: Literal["choice", "uniform", "log_uniform"] = Field(
        description="choice: one of values; uniform: evenly in [low, high]; log_uniform (or log-uniform): evenly in log space "
        "(learning rates)."
    )
    values: list[Any] | None = Field(None, description="The candidates (choice).")
    low: float | None = Field(None, description="Lower bound (uniform, log_uniform).")
    high: float | None = Field(None, description="Upper bound (uniform, log_uniform).")
    integer: bool = Field(False, description="Round samples to whole numbers (e.g. method.lora.r).")

    @field_validator("type", mode="before")
    @classmethod
    def _dash(cls, v: Any) -> Any:
        return v.replace("-", "_") if isinstance(v, str) else v

    @field_validator("values")
    @classmethod
    def _numbers(cls, v: list[Any] | None) -> list[Any] | None:
        return None if v is None else [_sweep_number(x) for x in v]

    @model_validator(mode="after")
    def _consistent(self) -> "SweepParamSpec":
        if self.type == "choice":
            if not self.values:
                raise ValueError("a choice distribution needs values: [...]")
            if self.low is not None or self.high is not None:
                raise ValueError("a choice distribution takes values, not low/high")
            return self
        if self.values is not None:
            raise ValueError(f"a {self.type} distribution takes low and high, not values")
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"a {self.type} distribution needs low < high (got low={self.low}, high={self.high})")
        if self.type == "log_uniform" and self.low <= 0:
            raise ValueError(f"a log_uniform distribution needs low > 0 (got {self.low})")
        return self


class EarlyStoppingSpec(_Section):
    """Stop clearly bad trials before they finish (median stopping rule, or Optuna's Hyperband / successive halving)."""

    rule: Literal["median", "hyperband", "successive_halving"] = Field(
        C.SWEEP_RULE_MEDIAN,
        description="median: stop a trial whose best objective so far is worse than the median of the other trials' "
        "running averages at the same step. hyperband, successive_halving (or successive-halving): Optuna's pruners, "
        "which compare trials at rungs of steps (grace_steps, then x3, x9, ...; needs the sweep extra). All need the "
        "objective during training (eval_loss: set training.eval_steps).",
    )
    min_trials: int = Field(
        3, ge=1, le=C.SPEC_MAX_TRIALS,
        description="median: how many other trials must have reached the same step before any trial is stopped (Optuna's pruners: unused).",
    )
    grace_steps: int = Field(
        0, ge=0, le=C.SPEC_MAX_STEPS,
        description="Never stop a trial before this optimizer step (hyperband, successive_halving: the first rung, at least 1).",
    )

    @field_validator("rule", mode="before")
    @classmethod
    def _dash(cls, v: Any) -> Any:
        return v.replace("-", "_") if isinstance(v, str) else v


class SweepSpec(_Section):
    """A hyperparameter sweep over this job (used by `kubetune sweep`; `kubetune run` ignores it)."""

    objective: str = Field("eval_loss", description="The metric that ranks trials, as result.json records it: eval_loss, train_loss, perplexity, ...")
    direction: Literal["minimize", "maximize"] = Field("minimize", description="Whether a lower or a higher objective is better.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Field path -> values, e.g. {method.lora.r: [4, 8, 16]}. Grid search runs every combination; "
        "random search draws from these values.",
    )
    random: dict[str, SweepParamSpec] = Field(
        default_factory=dict, description="Field path -> distribution, e.g. {training.learning_rate: {type: log_uniform, low: 1e-5, high: 1e-3}}."
    )
    trials: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_TRIALS,
        description="Random or TPE search: how many trials (grid values count as choices). Unset: grid search, every combination.",
    )
    sampler: Literal["grid", "random", "tpe"] | None = Field(
        None,
        description="How trials are chosen. grid: every combination; random: trials draws, planned up front; tpe: trials chosen "
        "one at a time by Optuna's TPE sampler from the results so far (needs the sweep extra). Unset: random when trials is "
        "set, else grid.",
    )
    seed: int = Field(0, ge=0, le=C.SPEC_MAX_SEED, description="Seed of random search: the same seed draws the same trials.")
    parallel: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_PARALLEL, description="Trials running at once. Default: local, one per 4 CPU cores or per free set of accelerators; clusters, 4."
    )
    early_stopping: EarlyStoppingSpec | None = Field(None, description="Stop clearly bad trials early; off when unset.")
    dir: str = Field("runs/sweeps/{id}", description="The sweep directory: sweep.json, reports and trials/<trial>/ ({id}: the sweep id).")

    @field_validator("grid")
    @classmethod
    def _grid_values(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"grid '{key}' has no values")
        return {key: [_sweep_number(x) for x in values] for key, values in v.items()}

    @model_validator(mode="after")
    def _keys(self) -> "SweepSpec":
        problems = [p for p in (_sweep_key_problem(k) for k in [*self.grid, *self.random]) if p]
        both = sorted(set(self.grid) & set(self.random))
        if both:
            problems.append(f"{', '.join(both)}: given both as grid and as random distribution; keep one")
        if self.random and self.trials is None and self.sampler != C.SWEEP_SAMPLER_GRID:
            problems.append("random distributions need trials: N (how many trials to draw)")
        if self.sampler == C.SWEEP_SAMPLER_GRID and (self.trials is not None or self.random):
            problems.append("sampler grid runs every combination of grid: it takes no trials and no random distributions")
        if self.sampler in (C.SWEEP_SAMPLER_RANDOM, C.SWEEP_SAMPLER_TPE) and self.trials is None:
            problems.append(f"sampler {self.sampler} needs trials: N (how many trials to run)")
        combinations = math.prod(len(v) for v in self.grid.values())
        if self.trials is None and combinations > C.SPEC_MAX_TRIALS:
            problems.append(
                f"the grid has {_shown(combinations)} combinations, more than the {C.SPEC_MAX_TRIALS:,} trials a sweep may run; "
                "fewer values, or random search (trials: N draws from the grid)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def search(self) -> str:
        """The sampler in effect: ``sampler``, or random when ``trials`` is set, else grid."""
        return self.sampler or (C.SWEEP_SAMPLER_GRID if self.trials is None else C.SWEEP_SAMPLER_RANDOM)

    @property
    def uses_optuna(self) -> bool:
        """Whether Optuna chooses the trials (tpe) or prunes them (hyperband, successive_halving)."""
        rule = self.early_stopping.rule if self.early_stopping else None
        return self.search == C.SWEEP_SAMPLER_TPE or rule in (C.SWEEP_RULE_HYPERBAND, C.SWEEP_RULE_HALVING)


