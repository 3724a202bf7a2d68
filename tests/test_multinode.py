"""Two torchrun agents on localhost, one "node" each (gloo), joined by a c10d rendezvous and
launched through the cluster_check asset: node 0 by the TorchrunLauncher, node 1 by the peer
script it writes (tests/peers.py plays the second machine)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
import yaml

from gc25d_pipeline.defs.ops.assets import cluster_check
from gc25d_pipeline.lib.launcher import PreparedLaunch, shared_fs_bootstrap_env
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher
from tests.peers import PeerNodes, processes_with

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(port: int, env: dict[str, str] | None = None) -> TorchrunLauncher:
    return TorchrunLauncher(
        nnodes=2, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}", extra_env=env or {}
    )


def _project(tmp_path: Path) -> Gc25dProject:
    store = ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs"))
    return Gc25dProject(preset="tiny", store=store)


def _messages(error) -> list[str]:
    out = []
    while error is not None:
        out.append(error.message)
        error = error.cause
    return out


def test_bootstrap_env_matches_a_real_session(tmp_path):
    """The peer script's Pipes variables are computed before the session exists: same as Dagster's."""
    seen = {}
    launch = PreparedLaunch(tmp_path, tmp_path / "c.yaml", tmp_path / "logs", tmp_path / "pipes", [])
    launch.pipes_dir.mkdir()

    @dg.asset
    def probe(context: dg.AssetExecutionContext):
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesFileContextInjector(str(launch.context_path)),
            message_reader=dg.PipesFileMessageReader(str(launch.messages_path)),
        ) as session:
            seen.update(session.get_bootstrap_env_vars())
        return dg.MaterializeResult()  # no external process ran: nothing came through the session

    assert dg.materialize([probe]).success
    assert seen == shared_fs_bootstrap_env(launch)


def test_two_nodes_one_materialization_and_node1_root_cause_then_resume(tmp_path):
    peers = PeerNodes(tmp_path / "runs", nodes=[1], env={"GC25D_FAULT": "rank=any,step=3,attempt=0"})
    peers.start()
    try:
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [cluster_check],
                resources={"project": _project(tmp_path), "torchrun": _launcher(_free_port())},
                instance=instance,
                run_config={"ops": {"cluster_check": {"config": {"steps": 5}}}},
                raise_on_error=False,
            )
            logs = [r.user_message for r in instance.all_logs(result.run_id)]
    finally:
        peers.stop()
    assert result.success, logs[-20:]
    # attempt 0: node 1's rank failed at step 3; its error (not node 0's lost peer) fails the step
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1
    messages = _messages(retries[0].event_specific_data.error)
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
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    runs_root = tmp_path / "runs_multinode_terminate"
    launcher_cfg = tmp_path / "launcher.yaml"
    port = _free_port()
    launcher_cfg.write_text(
        yaml.safe_dump(
            {"kind": "torchrun", "nnodes": 2, "nproc_per_node": 1, "rdzv_endpoint": f"127.0.0.1:{port}"}
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC25D_PRESET": "tiny",
        "GC25D_OVERRIDES": f"paths.runs_root={runs_root};paths.data_root={tmp_path / 'data'}",
        "GC25D_LAUNCHER_CONFIG": str(launcher_cfg),
    }
    cmd = [
        str(Path(sys.executable).parent / "dagster"),
        "asset",
        "materialize",
        "-m",
        "gc25d_pipeline.definitions",
        "--select",
        "cluster_check",
        "--config-json",
        '{"ops": {"cluster_check": {"config": {"steps": 100000, "step_seconds": 0.05}}}}',
    ]
    peers = PeerNodes(runs_root, nodes=[1])
    peers.start()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    marker = str(runs_root)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            job = [
                p for p in processes_with(marker) if "gc25d_core.jobs.cluster_check" in " ".join(p.cmdline())
            ]
            # two agents + one rank each, and a first checkpoint proves the ranks are working
            if len(job) >= 4 and list(runs_root.rglob("step-*")):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the two-node job did not start within 150 s")
        agents = [p for p in job if "gc25d_core.lifeline" in p.cmdline()]
        assert len(agents) == 2
        pids = [p.pid for p in processes_with(marker)]
        os.kill(proc.pid, signal.SIGINT)  # only node 0's run worker: the stop must reach node 1 itself
        proc.wait(timeout=90)
        _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=60)
        assert not alive, f"left running: {[p.cmdline() for p in alive]}"
        assert all(p.poll() is not None for p in peers.procs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        peers.stop()
        for p in processes_with(marker):
            p.kill()
