"""Optuna in a sweep: TPE chooses the trials one at a time (ask-and-tell); Hyperband and successive halving prune them.

The sweep runner (:mod:`kubetune.sweep.run`) still submits and follows every trial as an ordinary kubetune job;
:class:`OptunaSearch` only decides. With ``sampler: tpe`` the runner asks it for the next trial each time a slot
frees (:meth:`OptunaSearch.ask`), so later trials learn from the finished ones, and tells it how each ended
(:meth:`OptunaSearch.finish`). With ``early_stopping.rule: hyperband`` or ``successive_halving`` (any sampler), the
runner hands it each running trial's objective by step (:meth:`OptunaSearch.should_stop`), which it reports to
the study and asks Optuna's pruner about.

The study lives in ``<sweep dir>/optuna.db`` (SQLite through SQLAlchemy), named after the sweep id and loaded
when it exists, so a rerun continues it. Its trials and ``sweep.json`` agree this way: a kubetune trial that
is interrupted (Ctrl-C, ``kubetune sweep cancel``, a killed sweep process) stays RUNNING in the study and the
rerun resumes that same study trial; a study trial asked but never recorded in ``sweep.json`` (the process
died in between) is rebuilt from its parameters; a trial that ended while no sweep process listened is told
on the next run. optuna is imported only here, and only when a sweep uses it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .. import constants as C
from ..errors import SpecError
from ..extras import require
from ..spec import SweepSpec, TuneJob
from .plan import trial_name, trial_spec

__all__ = ["OptunaSearch", "search_space", "require_optuna", "STUDY_TRIAL_ATTR"]

STUDY_TRIAL_ATTR = "kubetune_trial"  # user attribute of a study trial: the kubetune trial's name
_NUMBER_KEY = "t"  # the study trial's number in a TPE trial's name: <sweep id>-t3-lr...
_REDUCTION_FACTOR = 3  # rungs of Hyperband / successive halving: grace_steps, x3, x9, ...
_MAX_STARTUP_TRIALS = 10  # TPE draws at random until this many trials (or a third of them) have finished
_PRIMITIVE = (str, int, float, bool, type(None))


def require_optuna() -> None:
    """Raise one error naming the extra (``kubetune[sweep]``) when optuna is not installed."""
    require("sweep", "a sweep with sampler tpe or early_stopping.rule hyperband / successive_halving")


def _optuna() -> Any:
    """Import optuna, or raise one error naming the extra that brings it."""
    require_optuna()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep logs its own lines
    return optuna


def search_space(spec: SweepSpec) -> tuple[dict[str, Any], set[str]]:
    """Optuna distributions of the sweep's parameters, in the sweep's order (grid keys, then random keys).

    Grid values and choice distributions become categorical; uniform / log_uniform become floats (or ints
    with ``integer``), log-scaled for log_uniform.

    Returns:
        The distributions, and the keys whose choices are JSON text (values Optuna cannot store, e.g. lists).
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space: dict[str, Any] = {}
    encoded: set[str] = set()

    def categorical(key: str, values: list[Any]) -> Any:
        if all(isinstance(v, _PRIMITIVE) for v in values):
            return CategoricalDistribution(list(values))
        encoded.add(key)
        return CategoricalDistribution([json.dumps(v, sort_keys=True) for v in values])

    for key, values in spec.grid.items():
        space[key] = categorical(key, values)
    for key, d in spec.random.items():
        if d.type == "choice":
            space[key] = categorical(key, d.values or [])
            continue
        assert d.low is not None and d.high is not None
        log = d.type == "log_uniform"
        if d.integer:
            low, high = int(-(-d.low // 1)), int(d.high // 1)
            if low > high:
                raise SpecError(f"sweep.random.{key}: no whole number between {d.low} and {d.high}")
            space[key] = IntDistribution(max(low, 1) if log else low, high, log=log)
        else:
            space[key] = FloatDistribution(d.low, d.high, log=log)
    return space, encoded


class OptunaSearch:
    """The sweep's Optuna study: asks TPE for trials, reports objectives by step, prunes, and is told results.

    Args:
        job: the base job (trials are built from it as the other samplers build them).
        spec: its sweep section.
        sweep_id: names the study.
        directory: the sweep directory; the study is ``optuna.db`` there.
    """

    def __init__(self, job: TuneJob, spec: SweepSpec, sweep_id: str, directory: Path) -> None:
        optuna = _optuna()
        self.optuna, self.job, self.spec, self.sweep_id, self.dir = optuna, job, spec, sweep_id, directory
        self.tpe = spec.search == C.SWEEP_SAMPLER_TPE
        self.space, self.encoded = search_space(spec) if self.tpe else ({}, set())
        directory.mkdir(parents=True, exist_ok=True)
        storage = optuna.storages.RDBStorage(f"sqlite:///{directory / C.SWEEP_OPTUNA_DB}")
        existing = [s for s in optuna.get_all_study_names(storage) if s == sweep_id]
        done = len(optuna.load_study(study_name=sweep_id, storage=storage).trials) if existing else 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # The seed moves on with the study's size: a rerun's sampler must not draw the first trials again.
            startup = max(1, min(_MAX_STARTUP_TRIALS, (spec.trials or 0) // 3))
            sampler = (
                optuna.samplers.TPESampler(seed=spec.seed + done, constant_liar=True, n_startup_trials=startup)
                if self.tpe else optuna.samplers.RandomSampler(seed=spec.seed)
            )
            self.study = optuna.create_study(
                storage=storage, study_name=sweep_id, direction=spec.direction, sampler=sampler, pruner=self._pruner(), load_if_exists=True
            )
        wanted = optuna.study.StudyDirection.MINIMIZE if spec.direction == "minimize" else optuna.study.StudyDirection.MAXIMIZE
        if self.study.direction != wanted:
            raise SpecError(
                f"sweep {sweep_id}'s Optuna study {self.study.direction.name.lower()}s its objective; this spec says {spec.direction}",
                hint="pass a new --run-id to start a fresh sweep, or restore sweep.direction to continue this one",
            )
        self._reported: dict[int, set[int]] = {}  # study trial number -> steps reported

    def _pruner(self) -> Any:
        rule = self.spec.early_stopping
        pruners = self.optuna.pruners
        if rule is None or rule.rule == C.SWEEP_RULE_MEDIAN:
            return pruners.NopPruner()  # the median rule is kubetune's own (kubetune.sweep.plan.median_stop)
        first = max(1, rule.grace_steps)
        if rule.rule == C.SWEEP_RULE_HALVING:
            return pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=_REDUCTION_FACTOR)
        steps = self.job.training.max_steps
        return pruners.HyperbandPruner(min_resource=first, max_resource=steps if steps and steps > first else "auto", reduction_factor=_REDUCTION_FACTOR)

    # --- which trials ----------------------------------------------------------------------------
    def plan(self) -> list[tuple[dict[str, Any], TuneJob]]:
        """The trials the study already has (TPE), as ``(values, job)`` in the order they were asked.

        A study trial asked without a kubetune trial (the process died in between) is part of it, so the
        rerun runs it; without TPE (pruning only) the planned trials come from the grid / random plan, and
        study trials that never got a kubetune name are closed as failed.
        """
        out = []
        for ft in self.study.get_trials(deepcopy=False):
            if self.tpe and ft.params:
                values = self._values(ft.params)
                name = ft.user_attrs.get(STUDY_TRIAL_ATTR) or self._name(ft.number, values)
                out.append((values, trial_spec(self.job, self.sweep_id, values, self.dir, name=name)))
            elif not ft.user_attrs.get(STUDY_TRIAL_ATTR) and ft.state == self.optuna.trial.TrialState.RUNNING:
                self.study.tell(ft.number, state=self.optuna.trial.TrialState.FAIL, skip_if_finished=True)
        return out

    def remaining(self) -> int:
        """How many more trials TPE is to choose: ``trials`` less those the study has (in any state); 0 without TPE."""
        return max(0, (self.spec.trials or 0) - len(self.study.get_trials(deepcopy=False))) if self.tpe else 0

    def ask(self) -> tuple[dict[str, Any], TuneJob]:
        """The next trial TPE chooses, given every trial so far (running ones count through the constant liar).

        Raises:
            SpecError: the chosen values make an invalid job (the study trial is closed as failed).
        """
        trial = self.study.ask(self.space)
        try:
            values, tj = self._trial_job(trial.number, self._values(trial.params))
        except SpecError:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            raise
        trial.set_user_attr(STUDY_TRIAL_ATTR, tj.name)
        return values, tj

    def number(self, name: str) -> int | None:
        """The study trial number of the kubetune trial ``name`` (None when it has none yet)."""
        ft = self._frozen(name)
        return None if ft is None else ft.number

    def attach(self, name: str) -> int:
        """Give the kubetune trial ``name`` its study trial (pruning a grid or random sweep), once; its number.

        A grid or random trial that failed earlier runs again (as without Optuna) under a new study trial.
        """
        ft = self._frozen(name)
        if ft is not None and (self.tpe or ft.state != self.optuna.trial.TrialState.FAIL):
            return ft.number
        trial = self.study.ask()
        trial.set_user_attr(STUDY_TRIAL_ATTR, name)
        return trial.number

    # --- pruning and results ---------------------------------------------------------------------
    def should_stop(self, name: str, history: list[tuple[int, float]]) -> tuple[int, float] | None:
        """Report the trial's objective so far (``(step, value)``, new steps only) and ask the pruner.

        Returns:
            ``(step, value)`` of its latest report when Optuna prunes it, else None.
        """
        ft = self._frozen(name)
        if ft is None or not history or ft.state != self.optuna.trial.TrialState.RUNNING:
            return None
        seen = self._reported.setdefault(ft.number, set(ft.intermediate_values))
        new = [(s, v) for s, v in history if s not in seen]
        if not new:
            return None
        trial = self.optuna.trial.Trial(self.study, ft._trial_id)  # the live trial of a frozen one (as Study.tell does)
        for step, value in new:
            trial.report(value, step)
            seen.add(step)
        return new[-1] if trial.should_prune() else None

    def finish(self, name: str, state: str, objective: float | None) -> None:
        """Tell the study how the kubetune trial ended: succeeded -> COMPLETE with its objective, pruned ->
        PRUNED, failed or cancelled -> FAIL. An interrupted or pending trial stays RUNNING (the rerun resumes
        it); a study trial already finished is left as it is."""
        ft = self._frozen(name)
        states = self.optuna.trial.TrialState
        if ft is None or ft.state != states.RUNNING or state in (C.TRIAL_INTERRUPTED, C.STATE_PENDING, C.STATE_RUNNING):
            return
        if state == C.TRIAL_PRUNED:
            self.study.tell(ft.number, state=states.PRUNED, skip_if_finished=True)
        elif state == C.STATE_SUCCEEDED and objective is not None:
            self.study.tell(ft.number, objective, skip_if_finished=True)
        else:
            self.study.tell(ft.number, state=states.FAIL, skip_if_finished=True)

    def final(self, name: str) -> bool:
        """Whether TPE's study has closed the trial as failed: a rerun does not run it again (its values were
        TPE's choice at that point; a larger ``trials`` asks for more)."""
        ft = self._frozen(name) if self.tpe else None
        return ft is not None and ft.state == self.optuna.trial.TrialState.FAIL

    # --- helpers ---------------------------------------------------------------------------------
    def _frozen(self, name: str) -> Any:
        """The study trial of the kubetune trial ``name``: by the name it was given, else (TPE, the process died
        before naming it) by the name its number and parameters make."""
        trials = self.study.get_trials(deepcopy=False)[::-1]  # the newest first: a rerun failed grid trial has a new one
        found = next((ft for ft in trials if ft.user_attrs.get(STUDY_TRIAL_ATTR) == name), None)
        if found is None and self.tpe:
            found = next((ft for ft in trials if ft.params and not ft.user_attrs and self._name(ft.number, self._values(ft.params)) == name), None)
        return found

    def _values(self, params: dict[str, Any]) -> dict[str, Any]:
        """A study trial's parameters as the trial's values, in the sweep's order (JSON choices decoded)."""
        keys = [k for k in self.space if k in params] + [k for k in params if k not in self.space]
        return {k: (json.loads(params[k]) if k in self.encoded else params[k]) for k in keys}

    def _name(self, number: int, values: dict[str, Any]) -> str:
        return trial_name(self.sweep_id, {_NUMBER_KEY: number, **values})

    def _trial_job(self, number: int, values: dict[str, Any]) -> tuple[dict[str, Any], TuneJob]:
        return values, trial_spec(self.job, self.sweep_id, values, self.dir, name=self._name(number, values))
