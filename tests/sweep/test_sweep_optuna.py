"""Optuna in sweeps, on the backend double (backend_double.py): ``--tpe N`` asks TPE for each trial as a slot
frees, a rerun continues the study kept in the sweep directory, Hyperband / successive halving / the median
rule stop a clearly bad trial (pruned in sweep.json and in the study), and the command line's mistakes end in
one message."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from kubetune import constants as C  # noqa: E402
from kubetune.backends import BACKENDS  # noqa: E402
from kubetune.cli.sweep import _job_from_options  # noqa: E402
from kubetune.errors import KubetuneError, SpecError  # noqa: E402
from kubetune.spec import load_spec  # noqa: E402
from kubetune.sweep import optuna_search  # noqa: E402
from kubetune.sweep.run import load_sweep, run_sweep  # noqa: E402

from .backend_double import InstantBackend, installer, sweep_jobs  # noqa: E402

GOOD, FINE, BAD = 1e-3, 2e-3, 5e-2
LR_LOW, LR_HIGH = 1e-4, 1e-1
STATES = optuna.trial.TrialState


def curve(job) -> list[float]:
    """Loss per step: flat at 3.0 when the learning rate is too high (>= 1e-2), else learning (lower lr, lower loss)."""
    steps = job.training.max_steps or 1
    lr = job.training.learning_rate
    if lr >= 1e-2:
        return [3.0] * steps
    return [round(2.0 - 0.1 * s + lr, 5) for s in range(1, steps + 1)]


@pytest.fixture
def double(monkeypatch):
    return installer(monkeypatch, curve)


@pytest.fixture
def job(tiny_job, tmp_path):
    return sweep_jobs(tiny_job, tmp_path, objective="train_loss", parallel=1)


def tpe(trials: int, **more) -> dict:
    return {"sampler": "tpe", "trials": trials, "seed": 7, "grid": {"method.lora.r": [4, 8]},
            "random": {"training.learning_rate": {"type": "log_uniform", "low": LR_LOW, "high": LR_HIGH}}, **more}


def study_of(sweep) -> "optuna.Study":
    return optuna.load_study(study_name=sweep.id, storage=f"sqlite:///{sweep.path / C.SWEEP_OPTUNA_DB}")


def test_tpe_runs_n_trials_each_asked_after_the_earlier_ones_finished(double, job, monkeypatch):
    backend = double()
    seen: list[int] = []  # finished study trials at each ask
    ask = optuna_search.OptunaSearch.ask

    def counting_ask(self):
        seen.append(len(self.study.get_trials(deepcopy=False, states=(STATES.COMPLETE,))))
        return ask(self)

    monkeypatch.setattr(optuna_search.OptunaSearch, "ask", counting_ask)
    sweep = run_sweep(job(**tpe(5)), backend="double", run_id="tpe")
    assert seen == [0, 1, 2, 3, 4]  # parallel 1: every ask comes after the previous trial was told
    assert len(backend.submitted) == 5 and len(set(backend.submitted)) == 5
    assert sweep.state == C.STATE_SUCCEEDED and [t.optuna for t in sweep.trials] == [0, 1, 2, 3, 4]
    for t in sweep.trials:
        assert t.name.startswith(f"tiny-tpe-t{t.optuna}-") and t.state == C.STATE_SUCCEEDED
        assert t.values["method.lora.r"] in (4, 8) and LR_LOW <= t.values["training.learning_rate"] <= LR_HIGH
    study = study_of(sweep)
    assert [ft.state for ft in study.trials] == [STATES.COMPLETE] * 5
    assert {ft.number: ft.value for ft in study.trials} == {t.optuna: pytest.approx(t.objective) for t in sweep.trials}
    assert {ft.number: ft.params for ft in study.trials} == {t.optuna: t.values for t in sweep.trials}
    assert (sweep.path / C.SWEEP_OPTUNA_DB).is_file()


def test_parallel_tpe_trials_run_at_once(double, job):
    double()
    sweep = run_sweep(job(**tpe(4, parallel=2)), backend="double", run_id="par")
    assert [t.state for t in sweep.trials] == [C.STATE_SUCCEEDED] * 4
    assert len({tuple(t.values.items()) for t in sweep.trials}) == 4  # the constant liar keeps pending trials apart
    assert len(study_of(sweep).trials) == 4


def test_a_rerun_continues_the_study_and_a_larger_n_adds_the_difference(double, job):
    double()
    first = run_sweep(job(**tpe(3)), backend="double", run_id="again")
    again = double()
    rerun = run_sweep(job(**tpe(3)), backend="double", run_id="again")
    assert again.submitted == [] and [t.name for t in rerun.trials] == [t.name for t in first.trials]
    assert len(study_of(rerun).trials) == 3

    more = double()
    grown = run_sweep(job(**tpe(5)), backend="double", run_id="again")
    assert len(more.submitted) == 2 and more.submitted == [t.name for t in grown.trials[3:]]
    assert [t.optuna for t in grown.trials] == [0, 1, 2, 3, 4] and grown.state == C.STATE_SUCCEEDED
    assert [ft.state for ft in study_of(grown).trials] == [STATES.COMPLETE] * 5


def test_a_rerun_that_turns_the_direction_around_needs_a_new_run_id(double, job):
    double()
    run_sweep(job(**tpe(1)), backend="double", run_id="dir")
    with pytest.raises(SpecError, match="study minimizes its objective; this spec says maximize") as e:
        run_sweep(job(**tpe(2), direction="maximize"), backend="double", run_id="dir")
    assert "--run-id" in e.value.hint


def test_an_interrupted_tpe_trial_stays_running_in_the_study_and_the_rerun_resumes_it(double, job):
    backend = double()
    submitted: list[str] = []

    def log(line: str) -> None:
        if ": submitted" in line:
            submitted.append(line)
            if len(submitted) == 2:  # the first trial has finished; the second has just started
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(job(**tpe(3)), backend="double", run_id="int", log=log)
    sweep = load_sweep("tiny-int")
    assert [t.state for t in sweep.trials] == [C.STATE_SUCCEEDED, C.TRIAL_INTERRUPTED]
    assert [ft.state for ft in study_of(sweep).trials] == [STATES.COMPLETE, STATES.RUNNING]
    assert backend.cancelled == [sweep.trials[1].name]

    again = double()
    rerun = run_sweep(job(**tpe(3)), backend="double", run_id="int")
    assert again.submitted[0] == sweep.trials[1].name and len(again.submitted) == 2  # resumed, then one new trial
    assert rerun.trials[1].attempts == 2 and [t.state for t in rerun.trials] == [C.STATE_SUCCEEDED] * 3
    assert [ft.state for ft in study_of(rerun).trials] == [STATES.COMPLETE] * 3


def test_a_study_trial_asked_but_never_recorded_is_run_by_the_rerun(double, job):
    double()
    spec = job(**tpe(2))
    run_sweep(spec, backend="double", run_id="orphan")
    sweep = load_sweep("tiny-orphan")
    study = study_of(sweep)
    study.ask(optuna_search.search_space(spec.sweep)[0])  # as if the process died right after asking
    again = double()
    rerun = run_sweep(job(**tpe(3)), backend="double", run_id="orphan")
    assert len(again.submitted) == 1 and rerun.trials[2].optuna == 2 and rerun.trials[2].state == C.STATE_SUCCEEDED
    assert [ft.state for ft in study_of(rerun).trials] == [STATES.COMPLETE] * 3


@pytest.mark.parametrize("rule", ["hyperband", "successive_halving"])
def test_optuna_pruners_stop_the_bad_trial_of_a_grid(double, job, rule):
    backend = double()
    spec = job(grid={"training.learning_rate": [GOOD, FINE, BAD]}, early_stopping={"rule": rule})
    sweep = run_sweep(spec, backend="double", run_id="prune")
    by_lr = {t.values["training.learning_rate"]: t for t in sweep.trials}
    assert by_lr[BAD].state == C.TRIAL_PRUNED and f"by Optuna's {rule} pruner" in by_lr[BAD].reason
    assert by_lr[BAD].step < 6 and by_lr[BAD].name in backend.cancelled
    assert by_lr[GOOD].state == C.STATE_SUCCEEDED and sweep.best().name == by_lr[GOOD].name
    study = {ft.user_attrs[optuna_search.STUDY_TRIAL_ATTR]: ft for ft in study_of(sweep).trials}
    assert study[by_lr[BAD].name].state == STATES.PRUNED and study[by_lr[GOOD].name].state == STATES.COMPLETE
    assert {t.name: t.optuna for t in sweep.trials} == {name: ft.number for name, ft in study.items()}

    again = double()
    rerun = run_sweep(spec, backend="double", run_id="prune")
    assert again.submitted == [] and rerun.trial(by_lr[BAD].name).state == C.TRIAL_PRUNED


@pytest.mark.parametrize("rule", ["median", "hyperband"])
def test_tpe_with_pruning_marks_the_stopped_trials_pruned_in_the_study(double, job, rule):
    double()
    early = {"rule": rule, "min_trials": 1}
    sweep = run_sweep(job(**tpe(8, early_stopping=early)), backend="double", run_id="tp")
    pruned = [t for t in sweep.trials if t.state == C.TRIAL_PRUNED]
    assert pruned and all(t.values["training.learning_rate"] >= 1e-2 or t.objective > 1.5 for t in pruned)
    study = study_of(sweep)
    assert {ft.number for ft in study.trials if ft.state == STATES.PRUNED} == {t.optuna for t in pruned}
    assert len(study.trials) == 8 and all(ft.state in (STATES.COMPLETE, STATES.PRUNED) for ft in study.trials)


def test_pruning_needs_the_objective_during_training(job):
    spec = job(objective="eval_loss", grid={"training.learning_rate": [GOOD, BAD]}, early_stopping={"rule": "hyperband"})
    with pytest.raises(SpecError, match="set training.eval_steps"):
        run_sweep(spec, backend="double", run_id="noeval")


def test_command_line_tpe_and_prune(tmp_path, tiny_job):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_job()))
    job = _job_from_options(path, [], ["method.lora.r=4,8"], ["training.learning_rate=log-uniform:1e-5,1e-3"], None, 3, 2, "train_loss",
                            None, False, None, tpe=6, prune="successive-halving")
    s = job.sweep
    assert (s.search, s.trials, s.seed, s.parallel, s.early_stopping.rule) == ("tpe", 6, 3, 2, "successive_halving")
    assert s.uses_optuna
    median = _job_from_options(path, [], ["method.lora.r=4,8"], [], None, None, None, None, None, False, None, tpe=2, prune="median").sweep
    assert median.early_stopping.rule == "median" and median.search == "tpe"
    spec = tiny_job()
    spec["sweep"] = {"sampler": "tpe", "trials": 4, "grid": {"method.lora.r": [4, 8]}}
    path.write_text(yaml.safe_dump(spec))
    assert _job_from_options(path, [], [], [], 3, None, None, None, None, False, None).sweep.search == "random"  # --random wins
    plain = load_spec({**tiny_job(), "sweep": {"grid": {"method.lora.r": [4, 8]}, "trials": 2}}).sweep
    assert plain.search == "random" and not plain.uses_optuna and plain.sampler is None  # as before: trials means random


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "method.lora.r=4,8", "--tpe", "3", "--random", "3"], "--tpe 3 and --random 3 both say how to choose the trials"),
        (["--tpe", "3"], "TPE needs a search space"),
        (["--grid", "method.lora.r=4,8", "--prune", "asha"], "--prune 'asha': expected one of median, hyperband, successive-halving"),
        (["--grid", "method.lora.r=4,8", "--prune", "hyperband", "--server", "http://127.0.0.1:9"], "not on a kubetune server"),
        (["--grid", "method.lora.r=4,8", "--prune", "hyperband"], "set training.eval_steps"),
    ],
)
def test_tpe_and_prune_mistakes_end_in_one_message_and_exit_code_2(args, message, tmp_path, tiny_job, kubetune_cli):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_job()))
    r = subprocess.run([*kubetune_cli, "sweep", str(path), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_spec_mistakes():
    base = {"name": "s", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "x.jsonl"}}
    with pytest.raises(SpecError, match="sampler tpe needs trials"):
        load_spec({**base, "sweep": {"sampler": "tpe", "grid": {"method.lora.r": [4]}}})
    with pytest.raises(SpecError, match="sampler grid runs every combination"):
        load_spec({**base, "sweep": {"sampler": "grid", "trials": 3, "grid": {"method.lora.r": [4]}}})
    assert load_spec({**base, "sweep": {"early_stopping": {"rule": "successive-halving"}}}).sweep.early_stopping.rule == "successive_halving"


def test_without_optuna_one_error_names_the_extra(double, job, monkeypatch, tmp_path):
    double()
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed
    for sweep in (tpe(2), {"grid": {"training.learning_rate": [GOOD, BAD]}, "early_stopping": {"rule": "successive_halving"}}):
        with pytest.raises(KubetuneError, match="'sweep' extra") as e:
            run_sweep(job(**sweep), backend="double", run_id="noopt")
        assert "pip install 'kubetune[sweep]'" in str(e.value.hint)
    assert not (tmp_path / "sweeps").exists()  # nothing was written


def test_float_and_list_choices_round_trip_through_the_study(job):
    spec = job(sampler="tpe", trials=2, grid={"method.lora.target_modules": [["q_proj", "v_proj"], "all-linear"]},
               random={"method.lora.r": {"type": "log_uniform", "low": 2, "high": 64, "integer": True}})
    space, encoded = optuna_search.search_space(spec.sweep)
    assert encoded == {"method.lora.target_modules"} and space["method.lora.r"].log and isinstance(space["method.lora.r"], optuna.distributions.IntDistribution)


def test_the_documented_tpe_command_is_a_tpe_sweep_with_hyperband(monkeypatch):
    import re
    import shlex
    from pathlib import Path

    from typer.testing import CliRunner

    import kubetune.sweep.run
    from kubetune.cli import app

    repo = Path(__file__).resolve().parents[2]
    command = next(b for b in re.findall(r"```bash\n(.*?)```", (repo / "docs" / "sweeps.md").read_text(), re.S) if "--tpe" in b)
    calls = []

    def capture(job, **kw):
        calls.append(job)
        raise KeyboardInterrupt

    monkeypatch.setattr(kubetune.sweep.run, "run_sweep", capture)
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(app, shlex.split(command.replace("\\\n", " "))[1:])
    assert result.exit_code == 130 and calls, result.output
    s = calls[0].sweep
    assert (s.search, s.trials, s.parallel, s.seed, s.early_stopping.rule) == ("tpe", 20, 2, 1, "hyperband")
    space, _ = optuna_search.search_space(s)
    assert list(space) == ["training.lr_scheduler", "training.learning_rate", "method.lora.r"] and space["method.lora.r"].log


class FailsOnce(InstantBackend):
    """The double, but the first trial with a too-high learning rate fails before its first step (only that one, once)."""

    def __init__(self) -> None:
        super().__init__(curve)
        self.failed: list[str] = []

    def status(self, ref):
        job, _ = self.jobs.get(ref.id, (None, None))
        if job is not None and job.training.learning_rate >= 1e-2 and not self.failed and self.steps[ref.id] == 0:
            from kubetune.events import RunDir

            self.failed.append(job.name)
            RunDir(ref.run_dir).set_state(C.STATE_FAILED, reason="out of memory (the double)")
        return super().status(ref)


def test_a_failed_tpe_trial_is_closed_in_the_study_and_not_rerun(job, monkeypatch):
    monkeypatch.setattr(C, "SWEEP_POLL_SECONDS", 0.01)
    backend = FailsOnce()
    monkeypatch.setitem(BACKENDS, "double", lambda **kw: backend)
    spec = job(sampler="tpe", trials=2, grid={"training.learning_rate": [BAD]})
    sweep = run_sweep(spec, backend="double", run_id="fail")
    assert [t.state for t in sweep.trials] == [C.STATE_FAILED, C.STATE_SUCCEEDED] and sweep.state == C.STATE_FAILED
    assert [ft.state for ft in study_of(sweep).trials] == [STATES.FAIL, STATES.COMPLETE]
    again = FailsOnce()
    monkeypatch.setitem(BACKENDS, "double", lambda **kw: again)
    lines: list[str] = []
    rerun = run_sweep(spec, backend="double", run_id="fail", log=lines.append)
    assert again.submitted == [] and f"{sweep.trials[0].name}: skipped (failed earlier; the Optuna study closed it as failed)" in lines
    assert len(study_of(rerun).trials) == 2


def test_a_failed_grid_trial_pruned_through_optuna_runs_again_under_a_new_study_trial(job, monkeypatch):
    monkeypatch.setattr(C, "SWEEP_POLL_SECONDS", 0.01)
    backend = FailsOnce()
    monkeypatch.setitem(BACKENDS, "double", lambda **kw: backend)
    spec = job(grid={"training.learning_rate": [GOOD, BAD]}, early_stopping={"rule": "successive_halving"})
    sweep = run_sweep(spec, backend="double", run_id="gridfail")
    bad = next(t for t in sweep.trials if t.values["training.learning_rate"] == BAD)
    assert bad.state == C.STATE_FAILED and bad.optuna == 1
    again = FailsOnce()
    again.failed.append(bad.name)  # it does not fail this time
    monkeypatch.setitem(BACKENDS, "double", lambda **kw: again)
    rerun = run_sweep(spec, backend="double", run_id="gridfail")
    assert again.submitted == [bad.name] and rerun.trial(bad.name).optuna == 2
    states = [(ft.user_attrs[optuna_search.STUDY_TRIAL_ATTR], ft.state) for ft in study_of(rerun).trials]
    assert states[1:] == [(bad.name, STATES.FAIL), (bad.name, STATES.PRUNED)]
    assert rerun.trial(bad.name).state == C.TRIAL_PRUNED  # the good trial's rungs stop it this time
