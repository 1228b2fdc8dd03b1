"""Planning a sweep: which trials, their names and specs, how many run at once, when one is stopped."""

from __future__ import annotations

import re

import pytest

from kubetune import constants as C
from kubetune.errors import BackendError, SpecError
from kubetune.spec import SweepSpec, load_spec
from kubetune.sweep.run import local_slots, median_stop, plan_values, sweep_id_for, trial_name, trial_spec
from kubetune.sweep.plan import check_sweep

NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_grid_runs_every_combination_in_order():
    spec = SweepSpec(grid={"method.lora.r": [4, 8], "training.learning_rate": ["1e-4", 3e-4]})
    assert plan_values(spec) == [
        {"method.lora.r": 4, "training.learning_rate": 1e-4},
        {"method.lora.r": 4, "training.learning_rate": 3e-4},
        {"method.lora.r": 8, "training.learning_rate": 1e-4},
        {"method.lora.r": 8, "training.learning_rate": 3e-4},
    ]


def test_random_search_is_seeded_in_range_and_extends_stably():
    spec = SweepSpec(
        grid={"method.lora.r": [4, 8, 16]},
        random={
            "training.learning_rate": {"type": "log-uniform", "low": "1e-5", "high": 1e-3},
            "training.warmup_ratio": {"type": "uniform", "low": 0.0, "high": 0.1},
            "method.lora.alpha": {"type": "log_uniform", "low": 8, "high": 64, "integer": True},
            "training.lr_scheduler": {"type": "choice", "values": ["cosine", "linear"]},
        },
        trials=12,
        seed=7,
    )
    first = plan_values(spec)
    assert first == plan_values(spec)  # same seed, same trials
    assert len(first) == 12 and len({str(v) for v in first}) == 12
    for v in first:
        assert v["method.lora.r"] in (4, 8, 16)
        assert 1e-5 <= v["training.learning_rate"] <= 1e-3
        assert 0.0 <= v["training.warmup_ratio"] <= 0.1
        assert isinstance(v["method.lora.alpha"], int) and 8 <= v["method.lora.alpha"] <= 64
        assert v["training.lr_scheduler"] in ("cosine", "linear")
    more = plan_values(spec.model_copy(update={"trials": 20}))
    assert more[:12] == first  # drawing more keeps the trials already run
    assert plan_values(spec.model_copy(update={"seed": 8})) != first
    # log-uniform: about as many draws per decade
    lrs = [v["training.learning_rate"] for v in plan_values(SweepSpec(random={"training.learning_rate": {"type": "log_uniform", "low": 1e-5, "high": 1e-3}}, trials=400))]
    low_decade = sum(x < 1e-4 for x in lrs)
    assert 150 < low_decade < 250


def test_random_search_over_a_small_discrete_space_yields_each_point_once():
    spec = SweepSpec(grid={"method.lora.r": [4, 8]}, trials=10)
    assert sorted(v["method.lora.r"] for v in plan_values(spec)) == [4, 8]


def test_trial_names_are_readable_valid_and_stable():
    assert trial_name("tiny-alpha", {"method.lora.r": 8, "training.learning_rate": 3e-4}) == "tiny-alpha-r8-lr3e-4"
    assert trial_name("tiny-alpha", {"training.learning_rate": 0.1, "training.lr_scheduler": "cosine"}) == "tiny-alpha-lr0p1-cosine"
    long = trial_name("a-rather-long-job-name-for-a-sweep", {"method.lora.r": 64, "training.learning_rate": 1e-4, "training.warmup_ratio": 0.05})
    assert len(long) <= 40 and NAME.match(long) and long.startswith("a-rather-long")
    assert long == trial_name("a-rather-long-job-name-for-a-sweep", {"method.lora.r": 64, "training.learning_rate": 1e-4, "training.warmup_ratio": 0.05})
    # values a name cannot show exactly get a hash, so that two trials never share a name
    a = trial_name("s", {"training.learning_rate": 1 / 3})
    b = trial_name("s", {"training.learning_rate": 0.33333})
    assert a != b and NAME.match(a) and NAME.match(b)
    lists = trial_name("s", {"method.lora.target_modules": ["q_proj", "v_proj"]})
    assert NAME.match(lists) and len(lists) <= 40
    assert sweep_id_for(load_spec(_base(name="tiny")), "Alpha_1") == "tiny-alpha-1"
    assert len(sweep_id_for(load_spec(_base(name="x" * 40)), "run")) <= 40


def test_trial_spec_applies_values_and_gets_its_own_name_dir_and_output(tmp_path):
    job = load_spec(_base(output={"dir": "runs/{name}", "uri": "s3://bucket/exp"}, sweep={"grid": {"method.lora.r": [4, 8]}}))
    t = trial_spec(job, "tiny-a", {"method.lora.r": 4, "training.learning_rate": 1e-4}, tmp_path)
    assert t.name == "tiny-a-r4-lr1e-4"
    assert t.method.lora.r == 4 and t.training.learning_rate == 1e-4
    assert t.output_dir == tmp_path / "trials" / "tiny-a-r4-lr1e-4"
    assert t.output.uri == "s3://bucket/exp/tiny-a-r4-lr1e-4"
    assert t.sweep is None and t.model.source == job.model.source
    oci = load_spec(_base(output={"uri": "oci://reg.example/adapters:v1"}))
    assert trial_spec(oci, "s", {"method.lora.r": 4}, tmp_path).output.uri == "oci://reg.example/adapters:v1-s-r4"
    with pytest.raises(SpecError, match=r"(?s)trial s-r0 \(method.lora.r=0\).*method.lora.r: .*greater than or equal to 1"):
        trial_spec(job, "s", {"method.lora.r": 0}, tmp_path)


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"grid": {"method.lora.rr": [1, 2]}}, "did you mean method.lora.r"),
        ({"grid": {"output.dir": ["a"]}}, "cannot be swept"),
        ({"grid": {"method.lora": [1]}}, "is a section"),
        ({"grid": {"method.lora.r": []}}, "has no values"),
        ({"random": {"training.learning_rate": {"type": "uniform", "low": 0.1, "high": 0.2}}}, "need trials"),
        ({"random": {"training.learning_rate": {"type": "log-uniform", "low": 0, "high": 1}}, "trials": 2}, "low > 0"),
        ({"random": {"method.lora.r": {"type": "choice"}}, "trials": 2}, "needs values"),
        ({"grid": {"method.lora.r": [4]}, "random": {"method.lora.r": {"type": "choice", "values": [8]}}, "trials": 2}, "both as grid and as random"),
        ({"direction": "up"}, "sweep.direction"),
    ],
)
def test_invalid_sweep_sections_name_the_problem(sweep, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(_base(sweep=sweep))


def test_sweeps_that_cannot_rank_their_trials_are_refused():
    with pytest.raises(SpecError, match="no parameters"):
        check_sweep(load_spec(_base()), SweepSpec())
    no_eval = load_spec(_base(dataset={"source": "data.jsonl", "eval_split": 0.0}))
    with pytest.raises(SpecError, match="eval_loss needs evaluation data") as e:
        check_sweep(no_eval, SweepSpec(grid={"method.lora.r": [4, 8]}))
    assert "dataset.eval_split" in str(e.value)
    check_sweep(no_eval, SweepSpec(grid={"method.lora.r": [4, 8]}, objective="train_loss"))
    with pytest.raises(SpecError, match="training.eval_steps"):
        check_sweep(load_spec(_base()), SweepSpec(grid={"method.lora.r": [4, 8]}, early_stopping={}))


def test_local_parallelism_divides_cores_between_trials():
    slots, notes = local_slots(2, 4, cores=2, devices=[], accelerators=0)
    assert slots == [{C.ENV_OMP_NUM_THREADS: "1", C.ENV_MKL_NUM_THREADS: "1"}] * 2 and not notes
    slots, _ = local_slots(None, 10, cores=16, devices=[], accelerators=0)
    assert len(slots) == 16 // C.SWEEP_CORES_PER_TRIAL and slots[0][C.ENV_OMP_NUM_THREADS] == str(C.SWEEP_CORES_PER_TRIAL)
    slots, notes = local_slots(8, 10, cores=2, devices=[], accelerators=0)
    assert len(slots) == 2 and "lowered to 2" in notes[0]
    slots, _ = local_slots(None, 1, cores=16, devices=[], accelerators=0)
    assert len(slots) == 1 and slots[0][C.ENV_OMP_NUM_THREADS] == "16"  # one trial left: it gets every core
    slots, _ = local_slots(2, 4, cores=8, devices=[], accelerators=0, processes=2)
    assert slots[0][C.ENV_OMP_NUM_THREADS] == "2"  # 4 cores per trial, 2 processes each


def test_local_parallelism_gives_each_trial_its_own_accelerators():
    slots, notes = local_slots(None, 8, cores=16, devices=["0", "1", "2", "3"], accelerators=2)
    assert slots == [{C.ENV_CUDA_VISIBLE_DEVICES: "0,1"}, {C.ENV_CUDA_VISIBLE_DEVICES: "2,3"}] and not notes
    slots, notes = local_slots(3, 8, cores=16, devices=["0", "1", "2", "3"], accelerators=2)
    assert len(slots) == 2 and "lowered to 2" in notes[0]
    slots, _ = local_slots(None, 8, cores=16, devices=["4", "6"], accelerators=1)
    assert [s[C.ENV_CUDA_VISIBLE_DEVICES] for s in slots] == ["4", "6"]
    with pytest.raises(BackendError, match="asks for 4 accelerators"):
        local_slots(None, 2, cores=16, devices=["0", "1"], accelerators=4)
    slots, notes = local_slots(None, 2, cores=8, devices=[], accelerators=1)
    assert "no accelerator is visible" in notes[0] and C.ENV_OMP_NUM_THREADS in slots[0]


def test_median_rule_stops_only_clearly_worse_trials():
    good = [(s, 2.0 - 0.1 * s) for s in range(1, 11)]
    fine = [(s, 2.1 - 0.1 * s) for s in range(1, 11)]
    bad = [(s, 3.0) for s in range(1, 6)]
    assert median_stop(bad, [good, fine], direction="minimize", min_trials=2) == (3.0, pytest.approx(1.75), 5)  # running averages 1.7 and 1.8 at step 5
    assert median_stop(bad, [good, fine], direction="minimize", min_trials=3) is None  # too few to compare
    assert median_stop(bad, [good, fine], direction="minimize", min_trials=2, grace_steps=6) is None
    assert median_stop(fine[:5], [good, bad], direction="minimize", min_trials=2) is None  # better than the median
    assert median_stop(bad, [good[:3], fine[:3]], direction="minimize", min_trials=1) is None  # nobody reached step 5
    up = [(s, -v) for s, v in bad]
    assert median_stop(up, [[(s, -v) for s, v in good], [(s, -v) for s, v in fine]], direction="maximize", min_trials=2) is not None


def _base(**sections):
    spec = {
        "name": "tiny",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": "data.jsonl", "eval_split": 0.1},
        "training": {"max_steps": 4},
    }
    for key, value in sections.items():
        spec[key] = {**spec[key], **value} if isinstance(spec.get(key), dict) else value
    return spec
