"""Presets as data: `kubetune presets`, field-by-field overrides, value sources, and the step plan shown up front."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kubetune.presets import preset_names, preset_values
from kubetune.spec import load_spec

from .conftest import small, write_spec


def _cli(*args):
    from typer.testing import CliRunner

    from kubetune.cli import app

    return CliRunner().invoke(app, list(args))


def test_presets_lists_every_method_with_its_defaults():
    out = _cli("presets")
    assert out.exit_code == 0, out.output
    for name in ("lora", "qlora", "dora", "full"):
        assert name in preset_names()
        assert any(line.startswith(name) for line in out.output.splitlines()), name
    table = {line.split()[0]: line.split()[1:] for line in out.output.splitlines() if line.startswith(("training.", "method."))}
    columns = preset_names()  # the table's columns, in this order
    max_grad_norm = dict(zip(columns, table["training.max_grad_norm"]))
    assert max_grad_norm["qlora"] == "0.3" and max_grad_norm["lora"] == "1.0"  # QLoRA paper's clipping
    checkpointing = dict(zip(columns, table["training.gradient_checkpointing"]))
    assert checkpointing["qlora"] == "true" and checkpointing["lora"] == "false"
    assert dict(zip(columns, table["training.learning_rate"]))["full"] == "2e-05"
    assert "kubetune validate SPEC shows each value's source" in " ".join(out.output.split())


def test_presets_shows_one_in_full_and_refuses_an_unknown_name(kubetune_cli):
    out = _cli("presets", "qlora")
    assert out.exit_code == 0, out.output
    data = yaml.safe_load(out.output)
    assert data["training"]["max_grad_norm"] == 0.3 and data["method"]["lora"]["target_modules"] == "all-linear"
    bad = subprocess.run([*kubetune_cli, "presets", "qlroa"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "no preset 'qlroa'" in bad.stderr and "lora" in bad.stderr


def test_presets_as_json_and_yaml(kubetune_cli):
    import json

    listed = _cli("presets", "-o", "json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.output)
    assert set(data["methods"]) == set(preset_names()) and {"dpo", "orpo"} <= set(data["objectives"])
    assert data["methods"]["qlora"]["training"]["max_grad_norm"] == 0.3
    one = _cli("presets", "dora", "-o", "json")
    assert one.exit_code == 0 and json.loads(one.output) == data["methods"]["dora"]
    assert yaml.safe_load(_cli("presets", "-o", "yaml").output) == data
    bad = subprocess.run([*kubetune_cli, "presets", "-o", "xml"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "-o/--output: 'xml' is not one of table, json, yaml" in bad.stderr


def test_every_shipped_preset_is_valid_data():
    for name in preset_names():
        flat = preset_values(name)
        assert flat and all(k.startswith(("method.lora.", "training.")) for k in flat), name


def test_the_spec_overrides_a_preset_field_by_field(tiny_job):
    spec = small(tiny_job, method={"type": "qlora"}, training={"learning_rate": 5e-4})
    spec["training"].pop("save_steps")
    job = load_spec(spec)
    assert job.training.learning_rate == 5e-4  # the spec wins...
    assert job.training.max_grad_norm == 0.3 and job.training.gradient_checkpointing is True  # ...the rest is the preset
    sources = job.field_sources()
    assert sources["training.learning_rate"] == "spec"
    assert sources["training.max_grad_norm"] == "preset qlora"
    assert sources["method.lora.r"] == "spec"  # small() sets r
    assert sources["training.save_steps"] == "default"
    # Switching the method switches the preset for every field the spec left unset.
    lora = load_spec({**spec, "method": {**spec["method"], "type": "lora"}})
    assert lora.training.max_grad_norm == 1.0 and lora.training.gradient_checkpointing is False
    assert lora.training.learning_rate == 5e-4


def test_validate_shows_every_value_with_its_source_and_the_total_steps(tiny_job, tmp_path):
    spec = small(tiny_job, method={"type": "qlora"}, training={"max_steps": 30, "learning_rate": 5e-4})
    out = _cli("validate", str(write_spec(spec, tmp_path / "job.yaml")))
    assert out.exit_code == 0, out.output
    text = out.output
    assert "learning_rate: 0.0005  # spec" in text
    assert "max_grad_norm: 0.3  # preset qlora" in text
    assert "gradient_checkpointing: true  # preset qlora" in text
    assert "lr_scheduler: cosine  # preset qlora" in text
    assert "total steps: 30 (training.max_steps)" in text


@pytest.mark.parametrize(
    "training,processes,samples,accumulation,global_batch,steps",
    [
        ({"epochs": 3, "batch_size": 8}, 1, 270, 1, 8, 3 * 34),  # 3 x ceil(270 / 8)
        ({"epochs": 3, "batch_size": 8, "max_steps": 10}, 1, 270, 1, 8, 10),  # max_steps wins
        ({"epochs": 1, "batch_size": 4, "gradient_accumulation_steps": 4}, 1, 270, 4, 16, 17),
        ({"epochs": 2, "batch_size": 4, "global_batch_size": 32}, 2, 270, 4, 32, 2 * 9),  # accumulation derived
        ({"epochs": 0.5, "batch_size": 8}, 1, 270, 1, 8, 17),  # ceil(0.5 x 34)
    ],
)
def test_total_steps_and_accumulation_are_planned_up_front(tiny_job, training, processes, samples, accumulation, global_batch, steps):
    job = load_spec(tiny_job(training={**training, "max_steps": training.get("max_steps")}, resources={"processes_per_node": processes}))
    assert job.accumulation_steps == accumulation
    assert job.global_batch == global_batch
    assert job.planned_steps(samples) == steps
