"""Custom training functions on Kubernetes: the function's source ships in the spec ConfigMap (no image build), the
pods pip-install entrypoint.packages, and every flavour runs the same worker under torchrun.

Renders are validated against the real schemas (k8s_validate.py); the submitted objects are taken from the API
server double and run by the pod executor (tests/_support/pod_executor.py) with two real processes.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C
from kubetune.backends import get_backend
from kubetune.backends.kubernetes import render
from kubetune.errors import SpecError
from kubetune.spec import load_spec

from _support.custom_functions import TRAIN_PY
from _support.pod_executor import PodExecutor

from .apiserver_double import CORE, ApiServerDouble, make_pod
from .k8s_validate import validate_all

BIN = Path(sys.executable).parent
# What the test machine needs and a real image has baked in; this tree's kubetune when the tests run from a worktree.
POD_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
WORKLOAD = {"job": "Job", "pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}



def _spec(tmp_path: Path, **extra) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_PY), encoding="utf-8")
    spec = {
        "name": "custom-k8s",
        "entrypoint": {"file": str(tmp_path / "train.py"), "args": {"tag": "in-a-pod"}, "packages": ["pyyaml>=6"]},
        "resources": {"processes_per_node": 2, "cpu": "2", "memory": "2Gi"},
    }
    spec.update(extra)
    return spec


def _main_container(workload: dict) -> dict:
    if workload["kind"] == "Job":
        return workload["spec"]["template"]["spec"]["containers"][0]
    if workload["kind"] == "PyTorchJob":
        return workload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return workload["spec"]["trainer"]


@pytest.mark.parametrize("flavor", list(WORKLOAD))
def test_the_function_ships_in_the_configmap_and_renders_valid_objects(tmp_path, flavor):
    objects = render(load_spec(_spec(tmp_path)), flavor)
    validate_all(objects)
    assert [o["kind"] for o in objects] == ["ConfigMap", WORKLOAD[flavor]]
    configmap, workload = objects
    assert configmap["data"]["train.py"] == (tmp_path / "train.py").read_text()  # under its own name, beside spec.yaml
    pod_spec = yaml.safe_load(configmap["data"][C.K8S_SPEC_KEY])
    assert pod_spec["entrypoint"]["file"] == "train.py" and "model" not in pod_spec
    assert str(tmp_path) not in json.dumps(objects)  # nothing of this machine's paths reaches the cluster
    main = _main_container(workload)
    command, args = main["command"], main.get("args", [])
    # pip installs the packages, then execs the worker unchanged: torchrun with two processes around kubetune.worker
    assert command[:2] == ["sh", "-c"] and command[2].startswith(C.K8S_PIP_INSTALL + " 'pyyaml>=6' && exec")
    assert args[:3] == ["python", "-m", "kubetune.launch"] and "--nproc-per-node=2" in args
    assert f"entrypoint.file={C.K8S_SPEC_DIR}/train.py" in args
    if flavor != "trainjob":
        assert "initContainers" not in json.dumps(workload)  # nothing to fetch: the function reads what it needs


def test_an_sdk_function_and_a_module_render_too(tmp_path):
    source = load_spec({"name": "sdk-fn", "entrypoint": {"source": "def main():\n    pass\n"}})
    configmap = render(source, "job")[0]
    assert configmap["data"][C.K8S_ENTRYPOINT_KEY] == "def main():\n    pass\n"
    module = load_spec({"name": "in-image", "entrypoint": {"module": "mypkg.train"}, "kubernetes": {"image": "registry.example.com/mine:1"}})
    objects = render(module, "pytorchjob")
    validate_all(objects)
    assert list(objects[0]["data"]) == [C.K8S_SPEC_KEY]  # the code is in the image
    assert "entrypoint.file" not in json.dumps(objects[-1]) and _main_container(objects[-1])["command"] == ["kubetune", "worker"]


def test_what_cannot_ship_is_one_message(tmp_path):
    spec = _spec(tmp_path)
    (tmp_path / "train.py").unlink()
    with pytest.raises(SpecError, match="entrypoint.file: cannot read .*train.py"):
        render(load_spec(spec), "job")
    with pytest.raises(SpecError, match="entrypoint: Kaito runs its own tuning code"):
        render(load_spec(_spec(tmp_path)), "kaito")


def test_submitted_to_the_api_double_run_by_the_pod_executor_and_followed(tmp_path):
    """submit -> the ConfigMap and Job the double received -> two real processes in the pod -> status and logs."""
    double = ApiServerDouble().start()
    try:
        backend = get_backend("kubernetes", kubeconfig=str(double.kubeconfig(tmp_path / "kubeconfig")), cache_seconds=0)
        ref = backend.submit(load_spec(_spec(tmp_path)))
        submitted = [double.get(CORE, "configmaps", "default", "custom-k8s-spec"), double.get("batch/v1", "jobs", "default", "custom-k8s")]
        assert submitted[0]["data"]["train.py"] == (tmp_path / "train.py").read_text()

        (pod,) = PodExecutor(submitted, workdir=tmp_path / "cluster", bin_dirs=[BIN], extra_env=POD_ENV, timeout=300).run()
        assert pod.ok, pod.describe()
        out = pod.output("worker")
        assert "hello from rank 0 of 2 in-a-pod" in out and "hello from rank 1 of 2 in-a-pod" in out
        run = pod.host_path(C.K8S_OUTPUT_DIR)
        assert (run / C.DONE_FILE).is_file()
        result = json.loads((run / C.RESULT_FILE).read_text())
        assert result["metrics"] == {"rank_sum": 1.0} and result["returned"] == {"tag": "in-a-pod"}

        # what the kubelet and the Job controller would report, from what really ran: the log alone rebuilds the status
        job = double.get("batch/v1", "jobs", "default", "custom-k8s")
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        kubelet_pod = make_pod("custom-k8s-x7k2p", job["spec"]["template"]["metadata"]["labels"], main="worker", phase="Succeeded",
                               main_state=done, owner=job)
        double.add_pod("default", kubelet_pod, logs={"worker": out})
        double.set_status("batch/v1", "jobs", "default", "custom-k8s", {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
        st = backend.status(ref)
        assert (st.state, st.step, st.total_steps, st.loss) == (C.STATE_SUCCEEDED, 1, 1, 0.5)
        assert any("hello from rank 1 of 2" in line for line in backend.logs(ref))
    finally:
        double.stop()


def test_a_raising_function_fails_the_pod_with_its_traceback(tmp_path):
    (tmp_path / "boom.py").write_text("def main():\n    raise KeyError('no such column')\n", encoding="utf-8")
    spec = {"name": "boom", "entrypoint": {"file": str(tmp_path / "boom.py")}}
    (pod,) = PodExecutor(render(load_spec(spec), "job"), workdir=tmp_path / "cluster", bin_dirs=[BIN], extra_env=POD_ENV, timeout=120).run()
    assert not pod.ok
    out = pod.output("worker")
    assert "Traceback (most recent call last)" in out and "KeyError: 'no such column'" in out
    status = json.loads((pod.host_path(C.K8S_OUTPUT_DIR) / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_FAILED
    assert status["reason"] == "the training function boom.py:main raised KeyError: 'no such column' (traceback in the job's log)"


def test_two_pods_run_the_function_as_one_job_of_two_ranks(tmp_path):
    """nodes: 2 on the job flavour: an Indexed Job and a headless Service; the pods' ranks rendezvous and all-reduce."""
    spec = _spec(tmp_path, resources={"nodes": 2, "processes_per_node": 1, "cpu": "1", "memory": "2Gi"})
    objects = render(load_spec(spec), "job")
    validate_all(objects)
    pods = PodExecutor(objects, workdir=tmp_path / "cluster", bin_dirs=[BIN], extra_env=POD_ENV, timeout=300).run()
    assert all(p.ok for p in pods), "\n\n".join(p.describe() for p in pods)
    assert "hello from rank 0 of 2 in-a-pod" in pods[0].output("worker")
    assert "hello from rank 1 of 2 in-a-pod" in pods[1].output("worker")
    run = pods[0].host_path(C.K8S_OUTPUT_DIR)  # rank 0's pod writes the run directory
    assert json.loads((run / C.RESULT_FILE).read_text())["metrics"] == {"rank_sum": 1.0}
    assert not (pods[1].host_path(C.K8S_OUTPUT_DIR) / C.DONE_FILE).exists()
