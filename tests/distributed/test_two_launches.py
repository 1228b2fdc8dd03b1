"""Two nodes on one machine: two launches of `python -m kubetune.launch` rendezvous on 127.0.0.1.

The commands of docs/distributed.md ("Two nodes, by hand"), with a free port. The job trains as one world of
two ranks: the same losses as 2 processes on one node, and only node 0's launcher writes the run directory.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from kubetune import constants as C

from .conftest import cli_env, dist_spec, fault_env, result, status, write_spec

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_launches(tmp_path, env1: dict | None = None) -> tuple[list[subprocess.Popen], list[str], object]:
    """Node 0 and node 1 of a 2-node job on this machine; returns (processes, outputs, run dir)."""
    run_dir = tmp_path / "run"
    spec = dist_spec(run_dir, procs=1)
    spec["resources"]["nodes"] = 2
    spec_file = write_spec(spec, tmp_path / "two-nodes.yaml")
    port = _free_port()

    def launch(node_rank: int, env: dict) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "kubetune.launch", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
             "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "kubetune.worker", "--spec", str(spec_file)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )

    nodes = [launch(0, cli_env()), launch(1, env1 or cli_env())]
    try:
        outs = [p.communicate(timeout=300)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    return nodes, outs, run_dir


def test_two_launches_on_one_machine_train_as_one_job(tmp_path, two_process_run):
    nodes, outs, run_dir = _two_launches(tmp_path)
    assert [p.returncode for p in nodes] == [0, 0], "\n\n".join(o[-2000:] for o in outs)

    st = status(run_dir)
    assert st["state"] == C.STATE_SUCCEEDED
    assert st["extra"]["world_size"] == 2 and st["extra"]["launcher_pid"] == nodes[0].pid  # node 0 owns the run
    assert "[kubetune] step 4/4 loss=" in outs[0] and "[kubetune] step" not in outs[1]  # rank 0 reports, on node 0

    # 2 nodes x 1 process trains exactly what 1 node x 2 processes does
    ref_proc, ref_dir = two_process_run
    assert ref_proc.returncode == 0
    mine, ref = result(run_dir), result(ref_dir)
    assert [x["step"] for x in mine["losses"]] == [1, 2, 3, 4]
    for a, b in zip(mine["losses"], ref["losses"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]


def test_a_rank_failing_on_the_other_node_fails_the_job_and_node_0_says_where_to_look(tmp_path):
    nodes, outs, run_dir = _two_launches(tmp_path, env1=fault_env(rank=1, step=2, mode="raise"))
    assert [p.returncode for p in nodes] == [1, 1], "\n\n".join(o[-2000:] for o in outs)
    # node 1's launcher names its rank's own error (in node 1's log; it does not own the run directory) ...
    assert "error: rank 1 failed: RuntimeError: injected failure on rank 1 at step 2" in outs[1], outs[1][-3000:]
    # ... and node 0's, which records the job's end, says rank 0 lost a peer and where that peer's error is
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    assert st["reason"].startswith("rank 0 failed:") and "lost its connection to another rank, which failed first" in st["reason"], st["reason"]
    assert "that node's log" in st["reason"]
