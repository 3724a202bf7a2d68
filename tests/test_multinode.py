"""Two torchrun agents on localhost, one "node" each (gloo), joined by a c10d rendezvous and
launched through the cluster_check asset: node 0 by the TorchrunLauncher, node 1 by the peer
script it writes (tests/peers.py plays the second machine)."""

import os
import signal
import socket

import dagster as dg
import pytest

from gc25d_pipeline.lib.launcher import PreparedLaunch, shared_fs_bootstrap_env, shared_fs_pipes
from gc25d_pipeline.lib.torchrun import TorchrunLauncher
from tests.launch_helpers import (
    error_messages,
    interrupt_run_worker,
    materialize_cluster_check,
    start_cluster_check_cli,
    wait_for_cluster_check,
)
from tests.peers import PeerNodes, processes_with

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(port: int, env: dict[str, str] | None = None) -> TorchrunLauncher:
    return TorchrunLauncher(
        nnodes=2, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}", extra_env=env or {}
    )


def test_bootstrap_env_matches_a_real_session(tmp_path):
    """The peer script's Pipes variables are computed before the session exists: same as Dagster's."""
    seen = {}
    launch = PreparedLaunch(tmp_path, tmp_path / "c.yaml", tmp_path / "logs", tmp_path / "pipes", [])
    launch.pipes_dir.mkdir()

    @dg.asset
    def probe(context: dg.AssetExecutionContext):
        with dg.open_pipes_session(context=context, **shared_fs_pipes(launch)) as session:
            seen.update(session.get_bootstrap_env_vars())
        return dg.MaterializeResult()  # no external process ran: nothing came through the session

    assert dg.materialize([probe]).success
    assert seen == shared_fs_bootstrap_env(launch)


def test_two_nodes_one_materialization_and_node1_root_cause_then_resume(tmp_path):
    peers = PeerNodes(tmp_path / "runs", nodes=[1], env={"GC25D_FAULT": "rank=any,step=3,attempt=0"})
    peers.start()
    try:
        with dg.instance_for_test() as instance:
            result = materialize_cluster_check(tmp_path, instance, _launcher(_free_port()))
            logs = [r.user_message for r in instance.all_logs(result.run_id)]
    finally:
        peers.stop()
    assert result.success, logs[-20:]
    # attempt 0: node 1's rank failed at step 3; its error (not node 0's lost peer) fails the step
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1
    messages = error_messages(retries[0].event_specific_data.error)
    assert any("node 1 local rank 0 failed" in m and "InjectedFault" in m for m in messages), messages
    assert any("node 1 local rank 0 failed" in m and "injected fault on rank" in m for m in logs)
    assert len(peers.started_scripts) == 2  # one peer script per attempt
    mats = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert len(mats) == 1  # global rank 0 only, whichever node the rendezvous gave it
    md = mats[0].event_specific_data.materialization.metadata
    assert md["world_size"].value == 2 and md["backend"].value == "gloo"
    assert md["resumed_from_step"].value == 2  # the retry resumed from the shared run folder
    assert md["total"].value == 5 * 3.0


def test_terminating_the_run_reaches_both_agents(tmp_path):
    runs_root = tmp_path / "runs_multinode_terminate"
    port = _free_port()
    launcher = {"kind": "torchrun", "nnodes": 2, "nproc_per_node": 1, "rdzv_endpoint": f"127.0.0.1:{port}"}
    peers = PeerNodes(runs_root, nodes=[1])
    peers.start()
    proc = start_cluster_check_cli(tmp_path, runs_root, launcher)
    try:
        # two agents + one rank each
        job = wait_for_cluster_check(runs_root, 4, 150, "the two-node job")
        agents = [p for p in job if "gc25d_core.lifeline" in p.cmdline()]
        assert len(agents) == 2
        # only node 0's run worker is stopped: the stop must reach node 1 itself
        alive = interrupt_run_worker(proc, runs_root, timeout_s=60)
        assert not alive, f"left running: {[p.cmdline() for p in alive]}"
        assert all(p.poll() is not None for p in peers.procs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        peers.stop()
        for p in processes_with(str(runs_root)):
            p.kill()
