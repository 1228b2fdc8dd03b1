"""Deriving a job from another (TuneJob.with_overrides): method presets follow method.type for every field the
user did not set, in every place that derives a job (sweep trials, Client.submit, the sweep CLI, kfp staging),
and null unsets a field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kubetune import Client, SpecError, TuneJob, load_spec
from kubetune.presets import preset_values
from kubetune.sweep.plan import trial_spec

BASE = {"name": "job", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "data.jsonl"}}
FULL = preset_values("full")
LORA = preset_values("lora")


def base(**sections) -> dict:
    d = json.loads(json.dumps(BASE))
    d.update(sections)
    return d


def assert_full_preset(job: TuneJob) -> None:
    t = job.training
    assert t.learning_rate == FULL["training.learning_rate"] == 2e-5
    assert t.warmup_ratio == FULL["training.warmup_ratio"] == 0.03
    assert t.weight_decay == FULL["training.weight_decay"] == 0.01
    sources = job.field_sources()
    for path in FULL:
        assert sources[path] == "preset full", path


def test_method_change_reapplies_the_new_preset():
    job = load_spec(base()).with_overrides(["method.type=full"])
    assert job.method.type == "full"
    assert_full_preset(job)


def test_the_dict_form_is_the_same_as_strings():
    job = load_spec(base())
    assert job.with_overrides({"method.type": "full"}) == job.with_overrides(["method.type=full"])


def test_an_explicitly_set_field_survives_a_method_change():
    job = load_spec(base(training={"learning_rate": 3e-4, "weight_decay": 0.0}))
    full = job.with_overrides(["method.type=full"])
    assert full.training.learning_rate == 3e-4 and full.training.weight_decay == 0.0  # the user's, not the preset's
    assert full.training.warmup_ratio == 0.03  # not set by the user: the full preset's
    sources = full.field_sources()
    assert sources["training.learning_rate"] == "spec" and sources["training.warmup_ratio"] == "preset full"
    # and back: lora's preset returns for what the user never set
    lora = full.with_overrides({"method.type": "lora"})
    assert lora.training.learning_rate == 3e-4 and lora.training.warmup_ratio == LORA["training.warmup_ratio"]


def test_overriding_twice_is_stable():
    job = load_spec(base())
    once = job.with_overrides(["method.type=full", "training.epochs=1"])
    twice = once.with_overrides(["method.type=full", "training.epochs=1"])
    assert twice == once
    assert twice.field_sources() == once.field_sources()
    assert once.with_overrides(None) == once and once.with_overrides([]).field_sources() == once.field_sources()


def test_with_overrides_leaves_the_job_unchanged_and_reports_bad_values():
    job = load_spec(base())
    with pytest.raises(SpecError, match=r"training.learning_rate: Input should be less than or equal to 1"):
        job.with_overrides({"training.learning_rate": 5})
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        job.with_overrides(["training.learning_rate"])
    with pytest.raises(SpecError, match="single string"):
        job.with_overrides("method.type=full")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="got int"):
        job.with_overrides(5)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="keys are dotted field paths"):
        job.with_overrides({1: 2})  # type: ignore[dict-item]
    assert job.method.type == "lora" and job.training.learning_rate == 2e-4


def test_a_sweep_over_method_type_trains_each_method_with_its_preset(tmp_path):
    job = load_spec(base(training={"epochs": 1}))
    full = trial_spec(job, "s", {"method.type": "full"}, tmp_path)
    assert_full_preset(full)
    assert full.training.epochs == 1  # the base spec's own value stays
    lora = trial_spec(job, "s", {"method.type": "lora"}, tmp_path)
    assert lora.training.learning_rate == 2e-4
    # a trial of a trial (e.g. the sweep CLI's base job) still knows what the user set
    assert trial_spec(full, "s", {"method.type": "full"}, tmp_path) == full


def test_the_sweep_cli_base_job_keeps_the_presets_unset(tmp_path):
    from kubetune.cli.sweep import _job_from_options

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(base()))
    job = _job_from_options(f, [], ["method.type=full,lora"], [], None, None, None, "train_loss", None, False, None)
    assert job.field_sources()["training.learning_rate"] == "preset lora"
    trials = {v["method.type"]: trial_spec(job, "s", v, tmp_path) for v in ({"method.type": "full"}, {"method.type": "lora"})}
    assert_full_preset(trials["full"])
    assert trials["lora"].training.learning_rate == 2e-4


def test_client_submit_applies_overrides_with_presets(tmp_path):
    class Recorder:
        name = "recorder"
        submitted: list = []

        def submit(self, job):
            self.submitted.append(job)
            return job.name

    client = Client.__new__(Client)
    client.backend = Recorder()
    job = load_spec(base())
    client.submit(job, ["method.type=full"])
    client.submit(job, {"method.type": "full"})
    client.submit(base(), ["method.type=full"])
    for submitted in Recorder.submitted:
        assert_full_preset(submitted)


def test_null_unsets_a_field():
    job = load_spec(base(dataset={"source": "data.jsonl", "eval_split": 0.2}, training={"learning_rate": 1e-3}))
    unset = job.with_overrides(["dataset.eval_split=null", "training.learning_rate=~"])
    assert unset.dataset.eval_split == 0.0  # back to the default
    assert unset.training.learning_rate == 2e-4 and unset.field_sources()["training.learning_rate"] == "preset lora"
    # fields that take None are set to None
    keep_all = job.with_overrides(["training.save_total_limit=null"])
    assert keep_all.training.save_total_limit is None
    # the same in a file and in load_spec's overrides
    assert load_spec(base(dataset={"source": "d.jsonl", "eval_split": None})).dataset.eval_split == 0.0
    assert load_spec(base(dataset={"source": "d.jsonl", "eval_split": 0.1}), ["dataset.eval_split=null"]).dataset.eval_split == 0.0
    # eval_source and eval_split together is an error; unsetting one of them makes the job valid
    both = base(dataset={"source": "d.jsonl", "eval_split": 0.1, "eval_source": "e.jsonl"})
    assert load_spec(both, ["dataset.eval_split=null"]).dataset.eval_source.endswith("e.jsonl")


def test_overrides_index_lists():
    job = load_spec(base(dataset={"source": "a.jsonl", "mix": [{"source": "b.jsonl"}, {"source": "c.jsonl"}]}))
    assert job.with_overrides({"dataset.mix.1.source": "s3://bucket/c.jsonl"}).dataset.mix[1].source == "s3://bucket/c.jsonl"
    with pytest.raises(SpecError, match="'dataset.mix' is a list with items 0 to 1"):
        job.with_overrides(["dataset.mix.5.source=x"])


def test_validate_shows_preset_sources_after_a_method_override(tmp_path, kubetune_cli):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(base(training={"epochs": 1})))
    out = subprocess.run([*kubetune_cli, "validate", str(f), "--no-check-local", "--set", "method.type=full"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "learning_rate: 2.0e-05  # preset full" in out.stdout
    assert "weight_decay: 0.01  # preset full" in out.stdout
    assert "epochs: 1.0  # spec" in out.stdout and "type: full  # spec" in out.stdout


def test_every_place_that_derives_a_job_goes_through_with_overrides():
    """No code dumps a resolved spec and loads it back (that turns every preset value into a user-set one)."""
    src = Path(__file__).resolve().parents[1] / "src" / "kubetune"
    offenders = []
    for path in src.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in ("load_spec(data", "load_spec(job.model_dump", "load_spec(spec_to_dict", "apply_overrides(data"):
            if pattern in text and path.parent.name != "spec":  # the spec package itself applies overrides
                offenders.append(f"{path.relative_to(src)}: {pattern}")
    assert not offenders
