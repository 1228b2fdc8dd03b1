"""method.objective (sft | dpo | orpo): presets on top of the method's, value sources, and the mistakes a spec can make."""

from __future__ import annotations

import pytest

from kubetune import SpecError, load_spec
from kubetune.presets import objective_names, objective_values, preset_values

BASE = {"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "pairs.jsonl"}}


def spec(method=None, **sections):
    return {**BASE, "method": method or {}, **sections}


def test_dpo_preset_fills_beta_loss_and_a_learning_rate_per_method_type():
    assert objective_names() == ["dpo", "orpo"]
    lora = load_spec(spec({"objective": "dpo"}))
    assert (lora.method.dpo.beta, lora.method.dpo.loss_type) == (0.1, "sigmoid")
    assert lora.training.learning_rate == 5e-6  # far below LoRA's SFT 2e-4
    assert lora.method.lora.r == preset_values("lora")["method.lora.r"]  # the method preset still applies
    full = load_spec(spec({"objective": "dpo", "type": "full"}))
    assert full.training.learning_rate == 5e-7 and full.training.weight_decay == preset_values("full")["training.weight_decay"]
    orpo = load_spec(spec({"objective": "orpo", "orpo": {"beta": 0.2}}))
    assert orpo.method.orpo.beta == 0.2 and orpo.training.learning_rate == objective_values("orpo", "lora")["training.learning_rate"]
    sft = load_spec(spec())
    assert sft.method.objective == "sft" and sft.training.learning_rate == 2e-4


def test_field_sources_name_the_objective_preset_and_the_spec_wins():
    job = load_spec(spec({"objective": "dpo", "dpo": {"beta": 0.3}}, training={"learning_rate": 1e-5}))
    src = job.field_sources()
    assert src["method.dpo.beta"] == "spec" and src["training.learning_rate"] == "spec"
    assert src["method.dpo.loss_type"] == "preset dpo" and src["training.warmup_ratio"] == "preset dpo"
    assert src["method.lora.r"] == "preset lora"


def test_switching_the_objective_with_overrides_brings_its_preset():
    sft = load_spec(spec())
    dpo = sft.with_overrides(["method.objective=dpo"])
    assert dpo.training.learning_rate == 5e-6 and dpo.method.dpo.beta == 0.1
    back = dpo.with_overrides(["method.objective=sft"])
    assert back.training.learning_rate == 2e-4 and back == sft


BAD = [
    (spec({"objective": "ppo"}), "method.objective: Input should be 'sft', 'dpo' or 'orpo'"),
    (spec({"objective": "dpo", "dpo": {"loss_type": "kto"}}), "method.dpo.loss_type: Input should be 'sigmoid'"),
    (spec({"objective": "dpo", "dpo": {"beta": 0}}), "method.dpo.beta: Input should be greater than 0"),
    (spec({"objective": "dpo", "dpo": {"reference": "hf://org/ref"}}), "method.dpo.reference applies to method.type full only"),
    (spec({"objective": "orpo", "type": "full", "dpo": {"reference": "hf://org/ref"}}), "ORPO has no reference model"),
    (spec({"objective": "dpo"}, dataset={"source": "p.jsonl", "format": "messages"}), "dataset.format messages holds no preference pairs"),
    (spec(dataset={"source": "p.jsonl", "format": "preference"}), "dataset.format preference is preference data: set method.objective to dpo or orpo"),
    (spec({"objective": "dpo"}, training={"packing": True}), "training.packing does not apply to method.objective dpo"),
    (spec({"objective": "orpo"}, dataset={"source": "p.jsonl", "train_on_inputs": True}), "dataset.train_on_inputs does not apply"),
    (spec({"objective": "dpo"}, dataset={"source": "p.jsonl", "mix": [{"source": "q.jsonl"}]}), "dataset.mix is not supported with method.objective dpo"),
    (spec({"objective": "dpo", "type": "full", "dpo": {"reference": "gs://b/ref"}}), "method.dpo.reference: unknown URI scheme 'gs://'"),
]


@pytest.mark.parametrize("data,expected", BAD)
def test_preference_mistakes_name_the_field_and_the_fix(data, expected):
    with pytest.raises(SpecError) as e:
        load_spec(data)
    assert expected in str(e.value)


def test_a_resolved_preference_spec_round_trips():
    job = load_spec(spec({"objective": "dpo", "type": "full", "dpo": {"reference": "builtin://tiny-chat"}}))
    assert load_spec(job.model_dump(mode="json")) == job


def test_a_full_fine_tune_takes_an_explicit_reference():
    job = load_spec(spec({"objective": "dpo", "type": "full", "dpo": {"reference": "builtin://tiny-chat"}}))
    assert job.method.dpo.reference == "builtin://tiny-chat"


def test_cli_validate_exits_2_naming_the_field(tmp_path, kubetune_cli):
    import subprocess

    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(spec({"objective": "dpo", "dpo": {"reference": "hf://org/ref"}})))
    out = subprocess.run([*kubetune_cli, "validate", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "method.dpo.reference applies to method.type full only" in out.stderr


def test_kubetune_presets_lists_and_shows_the_objectives():
    import yaml
    from typer.testing import CliRunner

    from kubetune.cli import app

    listing = CliRunner().invoke(app, ["presets"])
    assert listing.exit_code == 0 and "method.objective dpo | orpo" in listing.output
    assert any(line.startswith("dpo") and "Direct Preference Optimization" in line for line in listing.output.splitlines())
    shown = CliRunner().invoke(app, ["presets", "dpo"])
    assert shown.exit_code == 0 and yaml.safe_load(shown.output)["method"]["dpo"]["beta"] == 0.1
