"""The job spec: good and bad specs, overrides, the JSON schema, relative paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from kubetune import SpecError, TuneJob, load_spec
from kubetune.spec import apply_overrides

BASE = {"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "data.jsonl"}}


def spec(**sections):
    d = json.loads(json.dumps(BASE))
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    return d


GOOD = [
    spec(),
    spec(method={"type": "full"}),
    spec(method={"type": "qlora", "lora": {"r": 64, "target_modules": ["q_proj", "v_proj"]}}),
    spec(method={"type": "dora"}, training={"max_steps": 10, "global_batch_size": 32, "batch_size": 4}, resources={"processes_per_node": 2}),
    spec(model={"source": "hf://meta-llama/Llama-3.2-1B-Instruct@main"}, dataset={"source": "s3://bucket/data/", "eval_source": "https://example.com/eval.jsonl"}),
    spec(output={"uri": "oci://registry.local/adapters/x:v1"}, resources={"accelerators": 8, "processes_per_node": 8, "accelerator_type": "habana.ai/gaudi"}),
]

BAD = [
    (spec(training={"learnig_rate": 1e-4}), "training.learnig_rate: unknown key; did you mean training.learning_rate?"),
    (spec(modell={"source": "x"}), "modell: unknown key; did you mean model?"),
    (spec(training={"batch_size": 0}), "training.batch_size: Input should be greater than or equal to 1"),
    (spec(training={"learning_rate": "fast"}), "training.learning_rate: Input should be a valid number"),
    (spec(model={"source": "gs://bucket/model"}), "model.source: unknown URI scheme 'gs://'"),
    (spec(method={"type": "prefix"}), "method.type: Input should be 'full', 'lora', 'qlora' or 'dora'"),
    (spec(dataset={"eval_split": 0.2, "eval_source": "e.jsonl"}), "set either eval_source or eval_split, not both"),
    (spec(training={"global_batch_size": 10, "batch_size": 4}), "training.global_batch_size (10) must be a multiple of training.batch_size x processes (4 x 1 = 4)"),
    (spec(training={"global_batch_size": 8, "gradient_accumulation_steps": 2}), "set either global_batch_size or gradient_accumulation_steps, not both"),
    (spec(resources={"accelerators": 1, "processes_per_node": 4}), "resources.processes_per_node (4) exceeds resources.accelerators (1)"),
    (spec(name="My Job"), "name: 'My Job' is not a valid job name"),
    (spec(output={"uri": "https://example.com/out"}), "output.uri must be s3://..., oci://..., hf://ORG/NAME, file://... or pvc://CLAIM"),
    ({"dataset": {"source": "d.jsonl"}}, "model: required field is missing"),
    (spec(resources={"cpu": "eight"}), "resources.cpu: expected a Kubernetes quantity, got 'eight'"),
    (spec(resources={"cpu": "-2"}), "resources.cpu: expected a Kubernetes quantity, got '-2'"),
    (spec(resources={"memory": "32GB"}), "resources.memory: expected a Kubernetes quantity, got '32GB'"),
    (spec(resources={"memory": True}), "resources.memory: expected a Kubernetes quantity, got 'true'"),
    (spec(kubernetes={"shm_size": "16 Gi"}), "kubernetes.shm_size: expected a Kubernetes quantity, got '16 Gi'"),
    (spec(kfp={"memory_limit": "lots"}), "kfp.memory_limit: expected a Kubernetes quantity, got 'lots'"),
]


@pytest.mark.parametrize("data", GOOD)
def test_good_specs_validate(data):
    job = load_spec(data)
    assert isinstance(job, TuneJob)
    # Resolved spec round-trips: dumping and loading gives the same job.
    assert load_spec(job.model_dump(mode="json")) == job


@pytest.mark.parametrize("data,expected", BAD)
def test_bad_specs_name_the_field(data, expected):
    with pytest.raises(SpecError) as e:
        load_spec(data)
    assert expected in str(e.value)


def test_all_problems_are_listed_at_once():
    with pytest.raises(SpecError) as e:
        load_spec(spec(training={"batch_size": 0, "epochs": -1}, method={"type": "nope"}))
    assert len(e.value.problems) == 3


def test_derived_batch_and_accumulation():
    job = load_spec(spec(training={"global_batch_size": 64, "batch_size": 4}, resources={"processes_per_node": 2}))
    assert job.accumulation_steps == 8
    assert job.global_batch == 64
    job = load_spec(spec(training={"batch_size": 4, "gradient_accumulation_steps": 3}))
    assert job.global_batch == 12


def test_overrides_are_typed_and_nested():
    d = apply_overrides(json.loads(json.dumps(BASE)), [
        "training.learning_rate=1e-4", "training.epochs=2", "method.lora.target_modules=[q_proj,v_proj]",
        "training.packing=true", "name=sweep-a",
    ])
    job = load_spec(d)
    assert job.training.learning_rate == pytest.approx(1e-4)
    assert job.training.epochs == 2
    assert job.method.lora.target_modules == ["q_proj", "v_proj"]
    assert job.training.packing is True
    assert job.name == "sweep-a"


@pytest.mark.parametrize("bad", ["training.learning_rate", "=3", "model.source.x=1"])
def test_bad_overrides(bad):
    with pytest.raises(SpecError):
        load_spec(json.loads(json.dumps(BASE)), [bad])


def test_yaml_file_errors(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("model:\n  source: builtin://tiny-chat\ndataset: [unclosed\n")
    with pytest.raises(SpecError, match=r"job.yaml:4: not valid YAML: .*flow sequence at line 3"):
        load_spec(f)
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")


def test_relative_paths_resolve_against_cwd_then_spec_dir(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "train.jsonl").write_text("{}\n")
    f = tmp_path / "specs" / "my_job.yaml"
    f.write_text(yaml.safe_dump({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "train.jsonl"}}))
    monkeypatch.chdir(tmp_path)
    job = load_spec(f)
    assert job.dataset.source == str(tmp_path / "specs" / "train.jsonl")
    assert job.name == "my-job"  # derived from the file name


def test_output_dir_template(tmp_path):
    job = load_spec(spec(name="abc", output={"dir": str(tmp_path / "runs/{name}")}))
    assert job.output_dir == tmp_path / "runs" / "abc"


def test_a_bad_quantity_says_what_a_quantity_looks_like():
    with pytest.raises(SpecError) as e:
        load_spec(spec(resources={"cpu": "8 cores", "memory": "32GB"}))
    assert len(e.value.problems) == 2
    assert all("e.g. 8 or 500m (millicores) for cpu, 32Gi or 1.5G for memory" in p for p in e.value.problems)


@pytest.mark.parametrize("cpu,memory", [("8", "32Gi"), ("500m", "1.5G"), (8, 1e9), (0.5, "512Mi"), ("2.5", "128974848")])
def test_good_quantities_are_kept_as_kubernetes_text(cpu, memory):
    r = load_spec(spec(resources={"cpu": cpu, "memory": memory})).resources
    assert (r.cpu, r.memory) == (str(cpu), str(memory))  # a YAML number (cpu: 8) is taken as its text, as Kubernetes does


def test_the_spec_and_the_renderer_share_one_quantity_rule():
    from kubetune.backends.kubernetes import pod
    from kubetune.spec import cluster

    assert pod.K8S_QUANTITY_RE is cluster.K8S_QUANTITY_RE
    assert not any(name.endswith("QUANTITY_RE") and name != "K8S_QUANTITY_RE" for name in vars(pod))


def test_json_schema_describes_every_section():
    schema = TuneJob.model_json_schema()
    assert {"model", "dataset", "method", "training", "output", "resources"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    defs = schema["$defs"]
    assert "description" in defs["TrainingSpec"]["properties"]["learning_rate"]


def test_dataset_format_choices_are_the_format_registry():
    from kubetune.data.formats import FORMATS
    from kubetune.data.preference_formats import PREFERENCE_FORMATS

    defs = TuneJob.model_json_schema()["$defs"]
    for section in ("DatasetSpec", "DatasetSourceSpec"):
        assert defs[section]["properties"]["format"]["enum"] == ["auto", *FORMATS, *PREFERENCE_FORMATS]
    assert load_spec(spec(dataset={"format": list(FORMATS)[-1]})).dataset.format == list(FORMATS)[-1]
    with pytest.raises(SpecError, match="dataset.format: Input should be 'auto', 'messages'"):
        load_spec(spec(dataset={"format": "chatml"}))


def test_cli_schema_and_validate(tmp_path, kubetune_cli):
    out = subprocess.run([*kubetune_cli, "schema"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["title"] == "kubetune job spec"
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(spec()))
    (tmp_path / "data.jsonl").write_text("{}\n")  # validate also checks that local sources exist (tests/test_preflight.py)
    ok = subprocess.run([*kubetune_cli, "validate", str(f), "--set", "training.epochs=1"], capture_output=True, text=True)
    assert ok.returncode == 0
    resolved = yaml.safe_load(ok.stdout)
    assert resolved["training"]["epochs"] == 1 and resolved["training"]["learning_rate"] == 2e-4  # defaults filled in
    bad = subprocess.run([*kubetune_cli, "validate", str(f), "--set", "training.learnig_rate=1"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "did you mean training.learning_rate?" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_help_and_validate_do_not_import_torch(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(spec()))
    (tmp_path / "data.jsonl").write_text("{}\n")  # validate also checks that local sources exist
    code = (
        "import sys\n"
        "from kubetune.cli import app\n"
        "for argv in (['--help'], ['validate', %r]):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    ) % str(f)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY=\n" in out.stdout or out.stdout.strip().endswith("HEAVY="), out.stdout + out.stderr


@pytest.mark.parametrize(
    "source, revision, pinned",
    [
        ("hf://org/m", None, "hf://org/m"),
        ("hf://org/m", "v2", "hf://org/m@v2"),
        ("hf://org/m@v1", "v2", "hf://org/m@v2"),  # revision wins over @REV (docs/spec.md)
        ("hf://org/m@v1", None, "hf://org/m@v1"),
        ("hf://models/org/m@v1/sub/dir", "abc123", "hf://models/org/m@abc123/sub/dir"),
        ("s3://bucket/model", "v2", "s3://bucket/model"),  # only hub sources have revisions
    ],
)
def test_the_model_source_and_revision_are_joined_in_one_place(source, revision, pinned):
    from kubetune.spec import load_spec

    job = load_spec({"name": "x", "model": {"source": source, "revision": revision}, "dataset": {"source": "data.jsonl"}})
    assert job.model.pinned_source == pinned
    from kubetune.storage import parse_uri

    if source.startswith("hf://"):  # what fetch resolves is what the pinned URI names
        assert parse_uri(pinned).revision == parse_uri(source, revision).revision


def test_merge_specs_merges_mappings_replaces_the_rest_and_changes_neither():
    from kubetune.spec import merge_specs

    base = {"method": {"type": "lora", "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]}}, "training": {"epochs": 3}}
    extra = {"method": {"lora": {"r": 16, "target_modules": ["o_proj"]}}, "training": {"learning_rate": 1e-4}}
    before = (repr(base), repr(extra))
    out = merge_specs(base, extra)
    assert out == {"method": {"type": "lora", "lora": {"r": 16, "target_modules": ["o_proj"]}},
                   "training": {"epochs": 3, "learning_rate": 1e-4}}
    assert (repr(base), repr(extra)) == before
    out["method"]["lora"]["target_modules"].append("x")
    assert extra["method"]["lora"]["target_modules"] == ["o_proj"]  # a copy, not shared
