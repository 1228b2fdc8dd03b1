"""Loading hostile or broken spec files: alias bombs, deep nesting, huge files, bad bytes, duplicate keys,
several documents, absurd numbers. Each is refused quickly, in bounded memory, with one message that names the
file and line (or the field), and the CLI exits 2 without a traceback."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kubetune import SpecError, load_spec
from kubetune import constants as C

HEAD = "model:\n  source: builtin://tiny-chat\ndataset:\n  source: data.jsonl\n"


def write(tmp_path, text: str | bytes, name: str = "job.yaml"):
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return f


def billion_laughs(levels: int = 9, fan: int = 9) -> str:
    """The classic: each level is a list of `fan` aliases to the level below; ~700 bytes expand to fan**levels values."""
    lines = [HEAD.rstrip(), "kubernetes:", "  affinity:", "    nodeAffinity:", "      l0: &l0 [" + ", ".join(['"lol"'] * fan) + "]"]
    for i in range(1, levels):
        lines.append(f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_fast_naming_file_and_line(tmp_path):
    f = write(tmp_path, billion_laughs())
    assert f.stat().st_size < 1000
    started = time.monotonic()
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert time.monotonic() - started < 5
    assert f"{f}:" in str(e.value) and "aliases are expanded" in str(e.value)


def test_an_alias_bomb_in_a_subprocess_with_little_memory(tmp_path):
    """The old loader needed >6 GB for this file; now it must fail cleanly within 1 GiB of address space."""
    f = write(tmp_path, billion_laughs(levels=12))
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))\n"
        "from kubetune.cli import main\n"
        f"sys.argv = ['kubetune', 'validate', {str(f)!r}]\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "aliases are expanded" in out.stderr and "Traceback" not in out.stderr


def test_aliases_within_the_limit_still_work(tmp_path):
    text = HEAD + "kubernetes:\n  labels: &l {team: a}\n  annotations: *l\n"
    job = load_spec(write(tmp_path, text))
    assert job.kubernetes.labels == job.kubernetes.annotations == {"team": "a"}
    merged = HEAD + "kubernetes:\n  labels: &l {team: a}\n  annotations: {<<: *l, note: b}\n"
    assert load_spec(write(tmp_path, merged, "merged.yaml")).kubernetes.annotations == {"team": "a", "note": "b"}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("x: &a [*a]\n", "recursive alias"),
        ("x: " + "[" * 200 + "]" * 200 + "\n", f"nesting deeper than {C.SPEC_MAX_DEPTH} levels"),
        ("x:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 100)), f"nesting deeper than {C.SPEC_MAX_DEPTH} levels"),
        ("x: !!binary aGVsbG8=\n", "!!binary is not allowed"),
        ("x: !!set {a, b}\n", "!!set is not allowed"),
        ("x: !!python/object:os.system {}\n", "not valid YAML"),
        ("x: " + "9" * 5000 + "\n", "integer is too long"),
    ],
)
def test_hostile_yaml_is_refused_with_its_line(tmp_path, text, expected):
    f = write(tmp_path, HEAD + text)
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert expected in str(e.value)
    assert f"{f}:5" in str(e.value) or f"{f}:6" in str(e.value)


def test_a_huge_file_is_refused_before_parsing(tmp_path):
    f = write(tmp_path, HEAD + "# " + "x" * C.SPEC_MAX_BYTES + "\n")
    with pytest.raises(SpecError, match="larger than 1024 KiB"):
        load_spec(f)
    many = write(tmp_path, HEAD + "kubernetes:\n  image_pull_secrets: [" + "a," * C.SPEC_MAX_VALUES + "]\n", "many.yaml")
    with pytest.raises(SpecError, match=f"more than {C.SPEC_MAX_VALUES:,} values"):
        load_spec(many)


def test_non_utf8_bytes_name_the_line_and_byte(tmp_path):
    f = write(tmp_path, HEAD.encode() + b"name: caf\xe9\n")
    with pytest.raises(SpecError) as e:
        load_spec(f)
    offset = len(HEAD) + len("name: caf")
    assert f"{f}:5: the spec file is not UTF-8 text (byte {offset}: 0xe9)" in str(e.value)
    assert load_spec(write(tmp_path, b"\xef\xbb\xbf" + HEAD.encode(), "bom.yaml")).model.source == "builtin://tiny-chat"


def test_control_characters_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"job.yaml:5: not valid YAML: the control character U\+0000 is not allowed"):
        load_spec(write(tmp_path, HEAD + "name: a\x00b\n"))
    with pytest.raises(SpecError, match="NUL character"):
        load_spec({"model": {"source": "a\x00b"}, "dataset": {"source": "d.jsonl"}})


def test_duplicate_keys_name_both_lines(tmp_path):
    f = write(tmp_path, HEAD + "training:\n  epochs: 1\n  batch_size: 4\n  epochs: 3\n")
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert f"{f}:8: duplicate key 'epochs' (first at line 6)" in str(e.value)
    top = write(tmp_path, HEAD + "model:\n  source: hf://x/y\n", "top.yaml")
    with pytest.raises(SpecError, match=r"top.yaml:5: duplicate key 'model' \(first at line 1\)"):
        load_spec(top)


def test_several_documents_or_a_non_mapping_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"job.yaml:5: a job spec is one YAML document"):
        load_spec(write(tmp_path, HEAD + "---\nname: other\n"))
    for text, kind in (("- a\n- b\n", "list"), ("just text\n", "string"), ("42\n", "number")):
        with pytest.raises(SpecError, match=f"must be a YAML mapping .*got a {kind}"):
            load_spec(write(tmp_path, text, "odd.yaml"))


def test_dates_stay_strings(tmp_path):
    job = load_spec(write(tmp_path, "model:\n  source: builtin://tiny-chat\ndataset:\n  source: d.jsonl\n  split: 2024-01-01\n"))
    assert job.dataset.split == "2024-01-01"


ABSURD = [
    ({"training": {"epochs": 1e9}}, "training.epochs: Input should be less than or equal to 1000"),
    ({"training": {"max_steps": 1e12}}, "training.max_steps: Input should be less than or equal to 10000000"),
    ({"training": {"max_steps": "1e12"}}, "training.max_steps: Input should be less than or equal to 10000000"),
    ({"training": {"max_steps": 2.5}}, "training.max_steps: Input should be a valid integer, got a number with a fractional part"),
    ({"training": {"batch_size": 1e38}}, "training.batch_size: Input should be less than or equal to 65536"),
    ({"training": {"batch_size": 2**62}}, "training.batch_size: Input should be less than or equal to 65536 (got 4.61e+18)"),
    ({"training": {"batch_size": 10**40}}, "training.batch_size: an integer beyond 64 bits is not allowed"),
    ({"kubernetes": {"affinity": {"nodeAffinity": {"x": 10**5000}}}}, "kubernetes.affinity.nodeAffinity.x: an integer beyond 64 bits"),
    ({"training": {"max_seq_length": 1e7}}, "training.max_seq_length: Input should be less than or equal to 1048576"),
    ({"training": {"learning_rate": float("nan")}}, "training.learning_rate: nan is not allowed (a spec holds finite numbers only)"),
    ({"training": {"epochs": float("inf")}}, "training.epochs: inf is not allowed"),
    ({"training": {"max_grad_norm": float("inf")}}, "training.max_grad_norm: inf is not allowed"),
    ({"training": {"seed": 2**40}}, "training.seed: Input should be less than or equal to 4294967295"),
    ({"training": {"warmup_steps": -1}}, "training.warmup_steps: Input should be greater than or equal to 0"),
    ({"training": {"epochs": True}}, "training.epochs: expected a number, got true"),
    ({"training": {"batch_size": "lots"}}, "training.batch_size: Input should be a valid integer"),
    ({"method": {"lora": {"alpha": 1e30}}}, "method.lora.alpha: Input should be less than or equal to 100000"),
    ({"resources": {"nodes": 10**6}}, "resources.nodes: Input should be less than or equal to 4096"),
    ({"resources": {"collective_timeout_seconds": 10**12}}, "resources.collective_timeout_seconds: Input should be less than or equal to 604800"),
    ({"kubernetes": {"ttl_seconds_after_finished": 2**40}}, "kubernetes.ttl_seconds_after_finished: Input should be less than or equal to 2147483647"),
    ({"kubernetes": {"affinity": {"nodeAffinity": {"x": float("nan")}}}}, "kubernetes.affinity.nodeAffinity.x: nan is not allowed"),
    ({"dataset": {"source": "d.jsonl", "mix": [{"source": "m.jsonl"}] * 300}}, "dataset.mix: List should have at most 256 items"),
    ({"output": {"dir": "  "}}, "output.dir: must be a directory path"),
    ({"sweep": {"trials": 10**6, "grid": {"training.seed": [1, 2]}}}, "sweep.trials: Input should be less than or equal to 10000"),
    ({"sweep": {"grid": {f"training.{k}": list(range(1, 30)) for k in ("seed", "logging_steps", "save_steps")}}},
     "the grid has 24389 combinations, more than the 10,000 trials"),
    ({"sweep": {"random": {"training.learning_rate": {"type": "uniform", "low": 0, "high": float("inf")}}, "trials": 2}},
     "sweep.random.training.learning_rate.high: inf is not allowed"),
]


@pytest.mark.parametrize("sections,expected", ABSURD)
def test_absurd_values_are_refused_naming_the_field(sections, expected):
    data = {"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "data.jsonl"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    with pytest.raises(SpecError) as e:
        load_spec(data)
    assert expected in str(e.value)


def test_integral_floats_and_exponent_strings_are_converted_in_range():
    job = load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "d.jsonl"},
                     "training": {"max_steps": "1e3", "batch_size": 4.0, "save_steps": 1e2, "learning_rate": "2e-5"}})
    assert (job.training.max_steps, job.training.batch_size, job.training.save_steps) == (1000, 4, 100)
    assert isinstance(job.training.max_steps, int) and job.training.learning_rate == 2e-5


def test_field_errors_name_the_file_line_and_overrides(tmp_path):
    f = write(tmp_path, HEAD + "training:\n  batch_size: 4\n  epochs: 1e9\n")
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert f"{f}:7: training.epochs: Input should be less than or equal to 1000" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_spec(f, ["training.batch_size=1e38"])
    assert "--set 'training.batch_size=1e38': training.batch_size: Input should be less than or equal to 65536" in str(e.value)


def test_python_dicts_are_bounded_too():
    deep: dict = {}
    node = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        node["x"] = {}
        node = node["x"]
    with pytest.raises(SpecError, match="nesting deeper than 64"):
        load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "d.jsonl"}, "kubernetes": {"affinity": {"nodeAffinity": deep}}})
    looped: dict = {"source": "d.jsonl"}
    looped["columns"] = looped
    with pytest.raises(SpecError, match="nesting deeper than 64"):
        load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": looped})
    shared = ["x"] * 10
    for _ in range(8):  # a DAG of shared lists: 10**8 values when walked
        shared = [shared] * 10
    started = time.monotonic()
    with pytest.raises(SpecError, match=f"more than {C.SPEC_MAX_VALUES:,} values"):
        load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "d.jsonl"}, "kubernetes": {"affinity": {"podAffinity": shared}}})
    assert time.monotonic() - started < 5


def test_override_values_are_bounded(tmp_path):
    bomb = "[" * 100 + "]" * 100
    with pytest.raises(SpecError, match="nesting deeper than 64"):
        load_spec({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "d.jsonl"}}, [f"kubernetes.affinity={{nodeAffinity: {bomb}}}"])


@pytest.mark.parametrize(
    "text,expected",
    [
        (billion_laughs(), "aliases are expanded"),
        (HEAD + "training:\n  epochs: 1e9\n", "training.epochs: Input should be less than or equal to 1000"),
        (HEAD + "a: 1\na: 2\n", "duplicate key 'a'"),
    ],
)
def test_cli_validate_exits_2_without_traceback(tmp_path, kubetune_cli, text, expected):
    f = write(tmp_path, text)
    out = subprocess.run([*kubetune_cli, "validate", str(f), "--no-check-local"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert expected in out.stderr and str(f) in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_validate_non_utf8_exits_2(tmp_path, kubetune_cli):
    f = write(tmp_path, b"model: {source: \xff\xfe}\n")
    out = subprocess.run([*kubetune_cli, "validate", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not UTF-8" in out.stderr and "Traceback" not in out.stderr


def test_nan_and_infinity_in_a_file_name_their_line(tmp_path):
    f = write(tmp_path, HEAD + "training:\n  batch_size: 4\n  learning_rate: .nan\n")
    with pytest.raises(SpecError, match=r"job.yaml:7: training.learning_rate: nan is not allowed"):
        load_spec(f)


def test_a_directory_or_a_device_is_not_a_spec(tmp_path):
    with pytest.raises(SpecError, match="is a directory; a job spec is a YAML file"):
        load_spec(tmp_path)
    with pytest.raises(SpecError, match="is not a regular file"):
        load_spec("/dev/zero")
