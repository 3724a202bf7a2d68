"""SlurmLauncher against a real Slurm: slurmctld + slurmd + munge on this machine, one CPU node
(.ci/services.sh). Each test submits cluster_check with sbatch (one task, torchrun inside with a
c10d rendezvous on the node, 2 gloo ranks) and follows it through scontrol."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from gc25d_pipeline.lib.launcher import PreparedLaunch
from gc25d_pipeline.lib.slurm import JOB_RECORD, SlurmLauncher, parse_scontrol
from tests.launch_helpers import error_messages, materialize_cluster_check, start_cluster_check_cli
from tests.services import ensure_service, slurm_up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def slurm():
    ensure_service("slurm", slurm_up)


def _launcher(env: dict[str, str] | None = None) -> SlurmLauncher:
    return SlurmLauncher(nproc_per_node=2, cpus_per_task=1, poll_interval_s=0.5, extra_env=env or {})


def _job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return parse_scontrol(out).get("JobState", "")


def _wait_for_job(runs_root: Path, attempt: int = 0, timeout_s: float = 120) -> tuple[str, Path]:
    """The job id of ``attempt`` once it has checkpointed a first step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in runs_root.rglob(JOB_RECORD):
            data = json.loads(record.read_text())
            if data["attempt"] == attempt and list(record.parent.rglob("step-*")):
                return str(data["job_id"]), record.parent
        time.sleep(0.3)
    raise AssertionError(f"no running Slurm job of attempt {attempt} under {runs_root} within {timeout_s} s")


def test_parse_scontrol():
    line = (
        "JobId=7 JobName=x JobState=CANCELLED Reason=None ExitCode=0:15 RunTime=00:00:04 TimeLimit=UNLIMITED"
    )
    kv = parse_scontrol(line)
    assert kv["JobState"] == "CANCELLED" and kv["ExitCode"] == "0:15" and kv["TimeLimit"] == "UNLIMITED"


def test_sbatch_job_reports_once_through_shared_pipes(tmp_path):
    with dg.instance_for_test() as instance:
        result = materialize_cluster_check(tmp_path, instance, _launcher())
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
    assert result.success, logs[-20:]
    mats = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert len(mats) == 1
    md = mats[0].event_specific_data.materialization.metadata
    assert md["world_size"].value == 2 and md["total"].value == 5 * 3.0
    assert md["slurm_job_id"].value.isdigit()
    assert any("submitted Slurm job" in m for m in logs)
    assert any("steps 5/5" in m for m in logs)  # rank 0's progress came over the shared file


def test_failed_rank_fails_the_step_with_its_error(tmp_path):
    with dg.instance_for_test() as instance:
        result = materialize_cluster_check(
            tmp_path, instance, _launcher({"GC25D_FAULT": "rank=1,step=2,attempt=0"})
        )
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
    assert result.success  # attempt 1 resumed
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    messages = error_messages(retries[0].event_specific_data.error)
    assert any("local rank 1 failed" in m and "InjectedFault" in m and "FAILED" in m for m in messages), (
        messages
    )
    assert any("injected fault on rank 1 at step 2" in m for m in logs)
    md = next(
        e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
    ).event_specific_data.materialization.metadata
    assert md["resumed_from_step"].value == 1


def test_scancel_from_outside_fails_the_step_and_the_retry_resumes(tmp_path):
    cancelled: dict[str, str] = {}

    def cancel_first_job():
        job_id, _ = _wait_for_job(tmp_path / "runs")
        time.sleep(1.0)  # a few more steps checkpointed
        subprocess.run(["scancel", job_id], check=True)
        cancelled["job"] = job_id

    canceller = threading.Thread(target=cancel_first_job, daemon=True)
    canceller.start()
    with dg.instance_for_test() as instance:
        result = materialize_cluster_check(tmp_path, instance, _launcher(), steps=30, step_seconds=0.1)
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
    canceller.join(timeout=10)
    job_id = cancelled["job"]
    assert result.success, logs[-20:]
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1
    messages = error_messages(retries[0].event_specific_data.error)
    assert any(
        f"Slurm job {job_id} was cancelled outside Dagster" in m and "CANCELLED" in m for m in messages
    ), messages
    md = next(
        e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
    ).event_specific_data.materialization.metadata
    assert md["resumed_from_step"].value > 0  # the retry's job started from the cancelled job's state
    assert md["total"].value == 30 * 3.0
    assert md["slurm_job_id"].value != job_id


def test_terminating_the_run_scancels_the_job(tmp_path):
    runs_root = tmp_path / "runs"
    launcher = {"kind": "slurm", "nproc_per_node": 2, "cpus_per_task": 1, "poll_interval_s": 0.5}
    proc = start_cluster_check_cli(tmp_path, runs_root, launcher)
    job_id = None
    try:
        job_id, _ = _wait_for_job(runs_root, timeout_s=150)
        assert _job_state(job_id) == "RUNNING"
        os.kill(proc.pid, signal.SIGINT)  # the run worker only: the launcher must scancel the job
        out, _ = proc.communicate(timeout=90)
        deadline = time.monotonic() + 60
        while _job_state(job_id) not in ("CANCELLED", "") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _job_state(job_id) in ("CANCELLED", ""), out.decode(errors="replace")[-3000:]
        assert b"cancelling Slurm job" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if job_id is not None:
            subprocess.run(["scancel", job_id])


def test_sbatch_reads_quoted_options_as_written_and_runs_nothing_else(tmp_path):
    """The job script with awkward but legal values goes through the real sbatch: held, so it never
    runs; what Slurm recorded is each value verbatim (quotes, '#', '$(' and a space included)."""
    comment = "a 'quoted' # comment $(touch pwned)"
    launcher = SlurmLauncher(
        partition="debug",
        time_limit="0-01:30:00",
        mem="100M",
        sbatch_args=["--hold", f"--comment={comment}"],
        extra_env={"GC25D_X": "a'b\n$(touch pwned)"},
    )
    run_dir = tmp_path / "run dir"
    launch = PreparedLaunch(run_dir, run_dir / "config.yaml", run_dir / "logs", run_dir / "pipes", [])
    launch.log_dir.mkdir(parents=True)
    script = launch.log_dir / "job.sbatch"
    script.write_text(
        launcher.script("gc25d_core.jobs.cluster_check", launch, launcher.job_env(0), "gc25d x")
    )
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    job_id = launcher.submit(script)
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%P|%l|%m|%j|%k|%r"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert out == f"debug|1:30:00|100M|gc25d x|{comment}|JobHeldUser", out
    finally:
        subprocess.run(["scancel", job_id])
    assert not list(tmp_path.rglob("pwned")) and not (Path.cwd() / "pwned").exists()
