"""Real 2-rank gloo torchrun jobs launched by a Dagster asset through Pipes."""

import os
import signal
from pathlib import Path

import dagster as dg
import pytest

from gc25d_pipeline.lib.torchrun import TorchrunLauncher
from tests.launch_helpers import (
    error_messages,
    interrupt_run_worker,
    materialize_cluster_check,
    start_cluster_check_cli,
    wait_for_cluster_check,
)
from tests.peers import processes_with

pytestmark = pytest.mark.slow


def _materialize(tmp_path, instance, fault: str | None = None, steps: int = 5):
    env = {"GC25D_FAULT": fault} if fault else {}
    return materialize_cluster_check(
        tmp_path, instance, TorchrunLauncher(nproc_per_node=2, extra_env=env), steps=steps
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
        messages = error_messages(failures[0].event_specific_data.error)
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


def test_terminating_the_run_leaves_no_orphans(tmp_path):
    runs_root = tmp_path / "runs_for_terminate"
    proc = start_cluster_check_cli(tmp_path, runs_root)
    try:
        # torchrun itself + 2 ranks
        wait_for_cluster_check(runs_root, 3, 120, "the torchrun job")
        alive = interrupt_run_worker(proc, runs_root, timeout_s=30)
        assert not alive, f"orphans left: {[p.cmdline() for p in alive]}"
        assert processes_with(str(runs_root)) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in processes_with(str(runs_root)):
            p.kill()


def test_a_two_rank_launch_prints_no_banner_or_warning(tmp_path, capfd, monkeypatch):
    """torchrun's banner about OMP_NUM_THREADS (four lines at every launch of several ranks) is not
    printed: the launcher sets torchrun's own default itself, and the ranks run with it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launcher = TorchrunLauncher(nproc_per_node=2)
    assert launcher.job_env(0)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in TorchrunLauncher(nproc_per_node=1).job_env(0)  # torchrun sets none
    with dg.instance_for_test() as instance:
        assert _materialize(tmp_path, instance).success
    out = capfd.readouterr()
    printed = out.out + out.err
    assert "cluster_check" in printed  # the launch's own lines were captured
    assert "OMP_NUM_THREADS" not in printed and "Warning" not in printed, printed[-3000:]
