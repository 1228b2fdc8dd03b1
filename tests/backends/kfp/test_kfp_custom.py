"""Custom training functions as a KFP pipeline: one task, the function's code as a parameter, and a real run through
the kfp local runner with two processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kubetune import Client
from kubetune import constants as C
from kubetune.backends.kfp import render_pipeline
from kubetune.errors import SpecError
from kubetune.spec import load_spec

from _support.custom_functions import TRAIN_PY


def _spec(tmp_path: Path, **entrypoint) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_PY), encoding="utf-8")
    return {
        "name": "custom-kfp",
        "entrypoint": {"file": str(tmp_path / "train.py"), "args": {"tag": "in-kfp"}, **entrypoint},
        "resources": {"processes_per_node": 2, "cpu": "2", "memory": "4Gi"},
        "output": {"dir": str(tmp_path / "run")},
    }


def test_compiles_to_one_task_with_the_code_as_a_parameter(tmp_path):
    ir, platform = list(yaml.safe_load_all(render_pipeline(load_spec(_spec(tmp_path, packages=["pyyaml>=6"])))))
    assert set(ir["components"]) == {"comp-custom"} and set(ir["root"]["dag"]["tasks"]) == {"custom"}
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"spec", "entrypoint_code", "run_dir"}
    assert json.loads(params["entrypoint_code"]["defaultValue"]) == (tmp_path / "train.py").read_text()
    assert json.loads(params["spec"]["defaultValue"])["entrypoint"]["file"] == "train.py"  # its name, not this machine's path
    assert str(tmp_path / "train.py") not in json.dumps(ir)  # the code travels, not this machine's path to it
    container = ir["deploymentSpec"]["executors"]["exec-custom"]["container"]
    command = " ".join(container["command"])
    assert "custom_stage" in command and "pyyaml>=6" in command  # the task installs entrypoint.packages first
    assert container["resources"]["resourceCpuRequest"] == "2"
    assert platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-custom"]["podMetadata"]["labels"][C.LABEL_JOB] == "custom-kfp"


def test_the_local_runner_refuses_missing_packages(tmp_path):
    with pytest.raises(SpecError, match="surely-not-installed-kubetune-pkg is not installed here"):
        Client("kfp").submit(_spec(tmp_path, packages=["surely-not-installed-kubetune-pkg"]))


@pytest.mark.slow
def test_runs_through_the_kfp_local_runner_with_two_processes(tmp_path):
    client = Client("kfp")
    st = client.wait(client.submit(_spec(tmp_path)), timeout=600)
    run = tmp_path / "run"
    log = (run / C.LOGS_DIR / C.WORKER_LOG).read_text()
    assert st.state == C.STATE_SUCCEEDED, log
    assert "hello from rank 0 of 2 in-kfp" in log and "hello from rank 1 of 2 in-kfp" in log
    assert (st.step, st.loss, st.backend) == (1, 0.5, "kfp")
    result = json.loads((run / C.RESULT_FILE).read_text())
    assert result["metrics"] == {"rank_sum": 1.0} and result["returned"] == {"tag": "in-kfp"}
    assert (run / C.DONE_FILE).is_file()
    assert yaml.safe_load((run / C.SPEC_FILE).read_text())["entrypoint"]["file"] == str(tmp_path / "train.py")  # as submitted
    record = next((run / C.KFP_LOCAL_ROOT).glob("kubetune-*/custom/run"))  # the run record as the task's artifact
    assert json.loads((record / C.RESULT_FILE).read_text()) == result and (record / C.DONE_FILE).is_file()


@pytest.mark.slow
def test_a_failing_rank_fails_the_pipeline_with_its_reason(tmp_path):
    client = Client("kfp")
    st = client.wait(client.submit(_spec(tmp_path, args={"tag": "fail"})), timeout=600)
    assert st.state == C.STATE_FAILED
    assert st.reason.startswith("rank 1 failed: the training function train.py:main raised RuntimeError: rank one gave up")


def test_render_cli_does_not_import_torch(tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(tmp_path)), encoding="utf-8")
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kubetune.cli import app\n"
        f"for argv in (['render', {str(spec_file)!r}, '--backend', 'kfp'], ['render', {str(spec_file)!r}, '--flavor', 'pytorchjob'],\n"
        f"             ['validate', {str(spec_file)!r}]):\n"
        "    r = CliRunner().invoke(app, argv)\n"
        "    assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules, 'render/validate imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_submitted_to_a_kfp_server_with_its_code_and_packages(tmp_path, kfp_api, monkeypatch):
    """Remote mode against the KFP API double: nothing to upload, the run carries the code as a parameter."""
    monkeypatch.setenv(C.ENV_KFP_TOKEN, "t")
    kfp_api.token = "t"
    spec = _spec(tmp_path, packages=["scikit-learn>=1.5"])
    spec["kfp"] = {"mode": "remote", "host": kfp_api.url}
    ref = Client("kfp", poll_seconds=0).submit(spec)
    (create,) = kfp_api.calls("POST", "/apis/v2beta1/runs")
    params = create.body["runtime_config"]["parameters"]
    assert json.loads(params["entrypoint_code"]) == (tmp_path / "train.py").read_text()
    assert json.loads(params["spec"])["entrypoint"]["args"] == {"tag": "in-kfp"} and params["run_dir"] == ""
    ir = create.body["pipeline_spec"].get("pipeline_spec", create.body["pipeline_spec"])
    command = " ".join(ir["deploymentSpec"]["executors"]["exec-custom"]["container"]["command"])
    assert "scikit-learn>=1.5" in command
    assert ref.extra["run_id"]
