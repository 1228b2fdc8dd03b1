"""Custom training functions (spec.entrypoint, kubetune.train(func=...)) on the local backend: real torchrun, real ranks.

What a user notices: each rank runs the function with its RANK/WORLD_SIZE, rank 0's reports become the run directory's
events, status and result.json, a raising function fails the job with its traceback in the log and one line in the
status, a rerun resumes from the newest reported checkpoint, cancel stops it, and mistakes are one clear message.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

import kubetune
from kubetune import Client, constants as C
from kubetune.errors import SpecError
from kubetune.spec import dump_spec, load_spec

from _support.fixtures_servers import s3, s3_server  # noqa: F401  (pytest fixtures: the loopback S3 server)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom-training" / "job.yaml"

# Each rank says who it is, the ranks all-reduce their ranks over gloo, and rank 0's report carries the sum.
RANKS_FN = '''
import os


def main(tag: str = "x"):
    import torch
    import torch.distributed as dist

    import kubetune

    ctx = kubetune.context()
    print(f"hello from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} ({ctx.rank}/{ctx.world_size}) {tag}", flush=True)
    dist.init_process_group("gloo")
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    kubetune.report(step=1, loss=0.25, total_steps=1, metrics={"rank_sum": t.item(), "world_size": ctx.world_size})
    dist.destroy_process_group()
    return {"rank": ctx.rank, "tag": tag}
'''


def _write(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _spec(tmp_path: Path, file: Path, *, processes: int = 1, **entrypoint) -> dict:
    return {
        "name": "custom",
        "entrypoint": {"file": str(file), "function": "main", **entrypoint},
        "resources": {"processes_per_node": processes},
        "output": {"dir": str(tmp_path / "run")},
    }


def _run(spec: dict, timeout: float = 240):
    client = Client("local")
    ref = client.submit(spec)
    return client.wait(ref, timeout=timeout), Path(ref.run_dir), ref


def _events(run: Path, kind: str) -> list[dict]:
    lines = (run / C.EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


# --- the Done-when test: 2 processes, each rank sees its RANK/WORLD_SIZE and reports -----------------
def test_two_processes_each_rank_runs_the_function_and_rank_0_reports(tmp_path):
    st, run, _ = _run(_spec(tmp_path, _write(tmp_path, RANKS_FN), processes=2, args={"tag": "tagged"}))
    log = (run / C.LOGS_DIR / C.WORKER_LOG).read_text(encoding="utf-8")
    assert st.state == C.STATE_SUCCEEDED, log
    assert "hello from rank 0 of 2 (0/2) tagged" in log and "hello from rank 1 of 2 (1/2) tagged" in log
    # the all-reduce proves both ranks took part; only rank 0's report is recorded (one metrics event)
    (metrics,) = [e for e in _events(run, "metrics") if "metrics" in e.get("data", {})]
    assert metrics["data"]["metrics"] == {"rank_sum": 1.0, "world_size": 2.0}
    assert (st.step, st.total_steps, st.loss, st.extra["world_size"]) == (1, 1, 0.25, 2)
    result = json.loads((run / C.RESULT_FILE).read_text())
    assert result["function"] == "train.py:main"
    assert result["metrics"]["rank_sum"] == 1.0 and result["returned"] == {"rank": 0, "tag": "tagged"}
    for name in (C.SPEC_FILE, C.STATUS_FILE, C.EVENTS_FILE, C.DONE_FILE):
        assert (run / name).is_file(), name
    assert "entrypoint:" in (run / C.SPEC_FILE).read_text() and "model:" not in (run / C.SPEC_FILE).read_text()


def test_a_raising_function_fails_the_job_with_its_traceback_in_the_log(tmp_path):
    fn = _write(tmp_path, '''
        def main():
            helper()

        def helper():
            raise ValueError("the learning rate is on fire\\nsecond line")
    ''')
    st, run, _ = _run(_spec(tmp_path, fn))
    assert st.state == C.STATE_FAILED
    assert st.reason == "the training function train.py:main raised ValueError: the learning rate is on fire (traceback in the job's log)"
    log = (run / C.LOGS_DIR / C.WORKER_LOG).read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in log and 'in helper' in log and 'raise ValueError("the learning rate is on fire' in log
    assert not (run / C.DONE_FILE).exists()


def test_a_failing_rank_is_named_in_the_reason(tmp_path):
    fn = _write(tmp_path, '''
        def main():
            import kubetune
            if kubetune.context().rank == 1:
                raise RuntimeError("rank one broke")
    ''')
    st, _, _ = _run(_spec(tmp_path, fn, processes=2))
    assert st.state == C.STATE_FAILED
    assert st.reason.startswith("rank 1 failed: the training function train.py:main raised RuntimeError: rank one broke")


def test_a_rerun_resumes_from_the_newest_reported_checkpoint_and_a_finished_run_is_kept(tmp_path):
    fn = _write(tmp_path, '''
        def main():
            import kubetune
            ctx = kubetune.context()
            if ctx.resume_from is None:
                path = ctx.checkpoint_dir / "step-5.txt"
                path.write_text("5")
                kubetune.report_checkpoint(path, step=5)
                raise RuntimeError("preempted, sort of")
            kubetune.report(step=int(ctx.resume_from.read_text()) + 1)
            return {"resumed_from": ctx.resume_from.name}
    ''')
    spec = _spec(tmp_path, fn)
    first, run, _ = _run(spec)
    assert first.state == C.STATE_FAILED
    assert [(e["message"], e["data"]["step"]) for e in _events(run, "checkpoint")] == [("saved step-5.txt", 5)]
    second, _, _ = _run(spec)
    assert second.state == C.STATE_SUCCEEDED, second.reason
    assert json.loads((run / C.RESULT_FILE).read_text())["returned"] == {"resumed_from": "step-5.txt"}
    assert any(e["data"].get("resume") for e in _events(run, "checkpoint"))
    # the same spec again: its finished run is kept, nothing runs
    ref = Client("local").submit(spec)
    assert ref.extra.get("already_complete") is True


def test_cancel_stops_the_function(tmp_path):
    fn = _write(tmp_path, '''
        def main():
            import time
            import kubetune
            for step in range(1, 1000):
                kubetune.report(step=step)
                time.sleep(0.2)
    ''')
    client = Client("local")
    ref = client.submit(_spec(tmp_path, fn))
    _wait_for_step(client, ref, 2)
    client.cancel(ref)
    assert client.wait(ref, timeout=60).state == C.STATE_CANCELLED


def test_module_entrypoint_with_env(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _write(pkg, '''
        def main():
            import os
            import kubetune
            kubetune.report(metrics={"from_env": float(os.environ["MY_SETTING"])})
    ''', name="train.py")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    spec = {"name": "custom", "entrypoint": {"module": "mypkg.train", "env": {"MY_SETTING": "7"}}, "output": {"dir": str(tmp_path / "run")}}
    st, run, _ = _run(spec)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    assert json.loads((run / C.RESULT_FILE).read_text())["metrics"] == {"from_env": 7.0}


# --- the SDK ---------------------------------------------------------------------------------------
def sdk_main(scale: float = 1.0):
    import os

    import kubetune

    kubetune.report(step=2, loss=0.5 * scale, metrics={"rank": float(os.environ.get("RANK", "0"))})
    return {"world": kubetune.context().world_size}


def test_sdk_train_runs_a_function(tmp_path):
    st = kubetune.train(func=sdk_main, func_args={"scale": 3.0}, name="sdk-fn", output={"dir": str(tmp_path / "run")})
    assert st.state == C.STATE_SUCCEEDED, st.reason
    assert (st.step, st.loss) == (2, 1.5)
    result = json.loads((tmp_path / "run" / C.RESULT_FILE).read_text())
    assert result["returned"] == {"world": 1} and result["function"] == "<source>:sdk_main"


def _uses_a_module_global():
    return json.dumps({})


def test_sdk_refuses_functions_that_cannot_travel(tmp_path):
    with pytest.raises(SpecError, match=r"func: _uses_a_module_global uses json from its module, which is not shipped"):
        kubetune.train(func=_uses_a_module_global)
    outer = 3

    def closure():
        return outer

    with pytest.raises(SpecError, match="uses variables of the function around it"):
        kubetune.train(func=closure)
    with pytest.raises(SpecError, match="is not a plain function"):
        kubetune.train(func=lambda: 1)
    with pytest.raises(SpecError, match="not both"):
        kubetune.train("builtin://tiny-chat", "d.jsonl", func=sdk_main)
    with pytest.raises(SpecError, match="give model and dataset"):
        kubetune.train()
    with pytest.raises(SpecError, match="func_args, packages and env go with func"):
        kubetune.train("builtin://tiny-chat", "d.jsonl", packages=["numpy"])


# --- the spec form -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "entrypoint, extra, message",
    [
        ({"file": "t.py", "module": "m"}, {}, "entrypoint: name the function's code in exactly one way"),
        ({}, {}, "entrypoint: name the function's code in exactly one way"),
        ({"module": "my-pkg.train"}, {}, "entrypoint.module: 'my-pkg.train' is not a dotted module path"),
        ({"module": "m", "function": "1x"}, {}, "entrypoint.function: '1x' is not a Python function name"),
        ({"module": "m", "packages": ["--index-url=http://evil"]}, {}, "entrypoint.packages: '--index-url=http://evil' is not a pip requirement"),
        ({"module": "m", "env": {"KUBETUNE_HOME": "/x"}}, {}, "entrypoint.env: KUBETUNE_HOME"),
        ({"module": "m", "args": {"not-ident": 1}}, {}, "argument names must be Python identifiers"),
        ({"module": "m"}, {"model": {"source": "builtin://tiny-chat"}}, "model: an entrypoint job takes no model"),
        ({"module": "m"}, {"training": {"epochs": 2}, "method": {"type": "full"}}, "method, training.epochs: not used by an entrypoint job"),
        ({"module": "m"}, {"sweep": {"grid": {"entrypoint.args.lr": [0.1, 0.2]}}}, "sweep: sweeps over an entrypoint job are not supported yet"),
    ],
)
def test_spec_mistakes_are_one_message(entrypoint, extra, message):
    with pytest.raises(SpecError) as e:
        load_spec({"name": "c", "entrypoint": entrypoint, **extra})
    assert message in str(e.value)


def test_built_in_jobs_still_need_model_and_dump_as_before(tiny_job):
    with pytest.raises(SpecError, match="model: required field is missing"):
        load_spec({"dataset": {"source": "d.jsonl"}})
    assert "entrypoint" not in dump_spec(load_spec(tiny_job()))


def test_a_relative_file_is_found_next_to_the_spec_and_reloads_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = load_spec(EXAMPLE)
    assert job.entrypoint.file == str(EXAMPLE.parent / "train.py")
    assert load_spec(job.model_dump(mode="json")) == job  # what the worker receives is the same job


def test_missing_local_packages_and_files_are_refused_before_anything_runs(tmp_path):
    spec = _spec(tmp_path, tmp_path / "nope.py", packages=["pyyaml>=6", "surely-not-installed-kubetune-pkg==1.0"])
    with pytest.raises(SpecError) as e:
        Client("local").submit(spec)
    text = str(e.value)
    assert "entrypoint.file: no such file" in text
    assert "entrypoint.packages: surely-not-installed-kubetune-pkg==1.0 is not installed here" in text and "pyyaml" not in text.split("hint")[0]
    assert "the local backend installs nothing" in text
    assert not (tmp_path / "run").exists()


def test_report_outside_a_job_does_nothing_and_checks_its_values():
    kubetune.report(step=1, loss=0.1, metrics={"a": 1})  # e.g. the function called from a unit test
    assert kubetune.context().run_dir is None
    with pytest.raises(TypeError, match="loss must be a number"):
        kubetune.report(loss="low")
    with pytest.raises(TypeError, match="must be finite"):
        kubetune.report(metrics={"x": float("nan")})
    with pytest.raises(TypeError, match="unknown field"):
        kubetune.report(accuracy=0.9)


def test_the_example_runs(tmp_path):
    st, run, _ = _run(load_spec(EXAMPLE, [f"output.dir={tmp_path / 'run'}"]))
    assert st.state == C.STATE_SUCCEEDED, st.reason
    assert (st.step, st.total_steps) == (20, 20)
    result = json.loads((run / C.RESULT_FILE).read_text())
    assert result["loss"] < 1.0 and result["checkpoint"].endswith("step-20.pt")


def test_preempt_stops_it_and_a_rerun_resumes(tmp_path):
    fn = _write(tmp_path, '''
        def main():
            import time
            import kubetune
            ctx = kubetune.context()
            if ctx.resume_from is not None:
                return {"resumed_from": ctx.resume_from.name}
            for step in range(1, 1000):
                path = ctx.checkpoint_dir / f"step-{step}.txt"
                path.write_text(str(step))
                kubetune.report_checkpoint(path, step=step)
                kubetune.report(step=step)
                time.sleep(0.2)
    ''')
    spec = _spec(tmp_path, fn)
    client = Client("local")
    ref = client.submit(spec)
    _wait_for_step(client, ref, 2)
    client.preempt(ref)
    assert client.wait(ref, timeout=60).state == C.STATE_PREEMPTED
    st, run, _ = _run(spec)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    newest = max(int(p.stem.split("-")[1]) for p in (run / C.CHECKPOINTS_DIR).glob("step-*.txt"))
    assert json.loads((run / C.RESULT_FILE).read_text())["returned"] == {"resumed_from": f"step-{newest}.txt"}


@pytest.mark.parametrize(
    "body, state, reason",
    [
        ("def main():\n    import sys\n    sys.exit(0)\n", C.STATE_SUCCEEDED, None),
        ("def main():\n    import sys\n    sys.exit(3)\n", C.STATE_FAILED, "the training function train.py:main exited with 3"),
        ("def other():\n    pass\n", C.STATE_FAILED, "entrypoint.function: {file} defines no 'main'\n  hint: functions there: other"),
        ("import not_a_module_anywhere\n\ndef main():\n    pass\n", C.STATE_FAILED,
         "loading entrypoint.file train.py raised ModuleNotFoundError: No module named 'not_a_module_anywhere' (add it to "
         "entrypoint.packages, or install it into the image) (traceback in the job's log)"),
    ],
)
def test_how_a_function_ends(tmp_path, body, state, reason):
    fn = _write(tmp_path, body)
    st, _, _ = _run(_spec(tmp_path, fn))
    assert st.state == state
    assert st.reason == (reason.format(file=fn) if reason else None)


def test_every_example_spec_loads():
    specs = sorted((REPO / "examples").rglob("*.yaml"))
    assert EXAMPLE in specs
    for path in specs:
        load_spec(path)


def test_output_uri_receives_the_run_record(tmp_path, s3):
    fn = _write(tmp_path, '''
        def main():
            import kubetune
            path = kubetune.context().checkpoint_dir / "state.txt"
            path.write_text("weights")
            kubetune.report_checkpoint(path, step=1)
            kubetune.report(step=1, loss=0.5)
    ''')
    spec = _spec(tmp_path, fn)
    spec["output"]["uri"] = s3.uri("custom-out")
    st, _, _ = _run(spec)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="custom-out/")["Contents"]}
    assert {"custom-out/result.json", "custom-out/DONE", "custom-out/events.jsonl", "custom-out/logs/worker.log"} <= keys, keys


def test_serving_an_entrypoint_run_says_to_serve_the_saved_model(tmp_path):
    from kubetune.errors import SourceError
    from kubetune.serve.deploy import render_serve
    from kubetune.serve.sources import resolve_sources

    job = load_spec(EXAMPLE)
    with pytest.raises(SpecError, match=r"custom-regression runs a custom training function \(train.py:main\)"):
        render_serve(job)
    run = tmp_path / "run"
    run.mkdir()
    (run / C.SPEC_FILE).write_text(dump_spec(job), encoding="utf-8")
    with pytest.raises(SourceError, match="the run ran a custom training function") as e:
        resolve_sources(str(run))
    assert "kubetune serve RUN/model" in str(e.value)


def test_the_cli_runs_it_and_reports_mistakes_in_one_message(tmp_path, kubetune_cli):
    import subprocess

    import yaml

    fn = _write(tmp_path, "def main():\n    raise ValueError('bad batch')\n")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "cli-fn", "entrypoint": {"file": "train.py"}, "output": {"dir": str(tmp_path / "run")}}))
    out = subprocess.run([*kubetune_cli, "run", str(spec_file)], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode != 0
    assert "the training function train.py:main raised ValueError: bad batch" in out.stdout + out.stderr
    fn.unlink()
    out = subprocess.run([*kubetune_cli, "run", str(spec_file), "--set", "output.dir=" + str(tmp_path / "run2")],
                         capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 2 and "entrypoint.file: no such file" in out.stderr and "Traceback" not in out.stderr


def test_a_file_imports_its_neighbours_locally(tmp_path):
    _write(tmp_path, "SCALE = 4.0\n", name="helpers.py")
    fn = _write(tmp_path, "from helpers import SCALE\n\n\ndef main():\n    import kubetune\n    kubetune.report(step=1, loss=SCALE)\n")
    st, _, _ = _run(_spec(tmp_path, fn))
    assert (st.state, st.loss) == (C.STATE_SUCCEEDED, 4.0), st.reason


def _wait_for_step(client, ref, step: int, timeout: float = 120) -> None:
    """Until the running job has reported ``step`` (so a cancel or preemption lands mid-training)."""
    deadline = time.monotonic() + timeout
    while client.status(ref).step < step:
        assert time.monotonic() < deadline, client.status(ref)
        time.sleep(0.2)
