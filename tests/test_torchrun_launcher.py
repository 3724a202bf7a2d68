"""Real 2-rank gloo torchrun jobs launched by a Dagster asset through Pipes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from gc25d_pipeline.defs.ops.assets import cluster_check
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _materialize(tmp_path, instance, fault: str | None = None, steps: int = 5):
    env = {"GC25D_FAULT": fault} if fault else {}
    project = Gc25dProject(
        preset="tiny", store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs"))
    )
    return dg.materialize(
        [cluster_check],
        resources={"project": project, "torchrun": TorchrunLauncher(nproc_per_node=2, extra_env=env)},
        instance=instance,
        run_config={"ops": {"cluster_check": {"config": {"steps": steps}}}},
        raise_on_error=False,
    )


def _materializations(result):
    return [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]


def test_two_ranks_report_once(tmp_path):
    with dg.instance_for_test() as instance:
        result = _materialize(tmp_path, instance)
        assert result.success
        mats = _materializations(result)
        assert len(mats) == 1  # only global rank 0 reported
        md = mats[0].event_specific_data.materialization.metadata
        assert md["world_size"].value == 2 and md["backend"].value == "gloo"
        assert md["steps"].value == 5 and md["resumed_from_step"].value == 0
        assert md["total"].value == 5 * 3.0  # all_reduce of ranks 1 + 2 per step
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
        assert any("steps 5/5" in m for m in logs)  # progress from rank 0 reaches the run log


def test_crashed_rank_fails_the_step_with_its_error(tmp_path):
    with dg.instance_for_test() as instance:
        result = _materialize(tmp_path, instance, fault="rank=1,step=3")  # every attempt fails
        assert not result.success
        failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert len(failures) == 1
        error, messages = failures[0].event_specific_data.error, []
        while error is not None:  # "Exceeded max_retries" wraps the launcher's Failure
            messages.append(error.message)
            error = error.cause
        assert any("local rank 1 failed" in m and "InjectedFault" in m for m in messages), messages
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
        assert any("local rank 1 failed" in m and "injected fault on rank 1 at step 3" in m for m in logs)
        retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert len(retries) == 2  # RetryPolicy(max_retries=2)


def test_retry_resumes_from_the_checkpoint_dir(tmp_path):
    with dg.instance_for_test() as instance:
        result = _materialize(tmp_path, instance, fault="rank=1,step=3,attempt=0")  # only the first attempt
        assert result.success
        assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
        mats = _materializations(result)
        assert len(mats) == 1
        md = mats[0].event_specific_data.materialization.metadata
        assert md["resumed_from_step"].value == 2  # steps 1..2 were checkpointed before the crash
        assert md["total"].value == 5 * 3.0  # and the state carried over exactly
        ckpt = Path(md["checkpoint_dir"].value)
        assert sorted(p.name for p in ckpt.iterdir()) == ["step-000004", "step-000005"]  # keep=2 rotation


def _job_processes(marker: str) -> list[psutil.Process]:
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return procs


def test_terminating_the_run_leaves_no_orphans(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    runs_root = tmp_path / "runs_for_terminate"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC25D_PRESET": "tiny",
        "GC25D_OVERRIDES": f"paths.runs_root={runs_root};paths.data_root={tmp_path / 'data'}",
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
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    marker = str(runs_root)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = [
                p for p in _job_processes(marker) if "gc25d_core.jobs.cluster_check" in " ".join(p.cmdline())
            ]
            # torchrun itself + 2 ranks, and a first checkpoint proves the ranks are working
            if len(ranks) >= 3 and list(runs_root.rglob("step-*")):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the torchrun job did not start within 120 s")
        pids = [p.pid for p in _job_processes(marker)]
        os.kill(proc.pid, signal.SIGINT)  # only the run worker: Dagster must stop the ranks itself
        proc.wait(timeout=90)
        gone, alive = psutil.wait_procs(
            [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)], timeout=30
        )
        assert not alive, f"orphans left: {[p.cmdline() for p in alive]}"
        assert _job_processes(marker) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in _job_processes(marker):
            p.kill()
