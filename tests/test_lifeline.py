"""Nothing of a torchrun job outlives its launcher: real 2-rank gloo jobs, real SIGKILL, real /proc scans."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from gc25d_core.config import load_config, write_resolved
from gc25d_pipeline.lib.torchrun import TorchrunLauncher
from tests.launch_helpers import JOB_MODULE, materialize_cluster_check, start_cluster_check_cli
from tests.peers import processes_with

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# The kernel delivers the parent-death signal at once; the bound only absorbs a loaded machine. It
# must stay well below what is left of a killed job (orphans that finish on their own prove nothing).
DEATH_BOUND_S = 5.0
JOB_STEPS, JOB_STEP_S = 400, 0.05  # >= 20 s of steps: an orphan cannot finish within the bound
START_BOUND_S = 120.0


def _kill_all(marker: str) -> None:
    for proc in processes_with(marker):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _checkpoint_steps(search_root: Path) -> list[int]:
    """The published checkpoints' steps under ``search_root``, read while the job writes: os.walk skips
    a directory that vanishes under it (a checkpoint's temp folder renamed into place), rglob raises."""
    steps = []
    for folder, subfolders, _ in os.walk(search_root):
        if Path(folder).name == "checkpoints":
            steps += [int(d.split("-")[1]) for d in subfolders if d.startswith("step-")]
    return sorted(steps)


def _wait_for_job(marker: str, search_root: Path) -> tuple[psutil.Process, list[psutil.Process]]:
    """torchrun and its two ranks, once a first checkpoint under ``search_root`` proves they work."""
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        job = [p for p in processes_with(marker) if JOB_MODULE in " ".join(p.cmdline())]
        pids = {p.pid for p in job}
        agents = [p for p in job if p.ppid() not in pids]  # torchrun: the one no other job process started
        if len(agents) == 1 and _checkpoint_steps(search_root):
            ranks = [p for p in job if p.ppid() == agents[0].pid]
            if len(ranks) == 2:
                return agents[0], ranks
        time.sleep(0.2)
    raise AssertionError(f"the torchrun job did not start within {START_BOUND_S} s")


def _survivors(procs: list[psutil.Process]) -> list[str]:
    """Command lines of ``procs`` still running after the bound (psutil checks start times: no reused pid)."""
    _, alive = psutil.wait_procs(procs, timeout=DEATH_BOUND_S)
    return [" ".join(p.cmdline()) for p in alive if p.is_running()]


class _KillTorchrun(threading.Thread):
    """Waits for the job's first checkpoint, SIGKILLs torchrun and watches its ranks die."""

    def __init__(self, runs_root: Path):
        super().__init__(daemon=True)
        self.runs_root = runs_root
        self.killed_at_step: int | None = None
        self.survivors: list[str] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            torchrun, ranks = _wait_for_job(str(self.runs_root), self.runs_root)
            torchrun.kill()
            self.killed_at_step = _checkpoint_steps(self.runs_root)[-1]
            self.survivors = _survivors(ranks)
        except BaseException as e:  # reported by the test thread
            self.error = e


def test_sigkill_of_torchrun_kills_its_ranks(tmp_path):
    """Outside Dagster nothing else stops orphaned ranks: they would run (and checkpoint) for ever."""
    run_dir = tmp_path / "runs" / "cluster_check"
    cfg = load_config(
        "tiny", {"paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path / "runs")}}
    )
    job_args = ["--config", str(write_resolved(cfg, run_dir)), "--run-dir", str(run_dir)]
    command = TorchrunLauncher(nproc_per_node=2).command(
        JOB_MODULE, [*job_args, "--steps", "100000", "--step-seconds", str(JOB_STEP_S)], run_dir / "logs"
    )
    with open(tmp_path / "torchrun.log", "wb") as log:
        torchrun_proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        torchrun, ranks = _wait_for_job(str(run_dir), run_dir)
        assert torchrun.pid == torchrun_proc.pid
        torchrun_proc.kill()
        torchrun_proc.wait(timeout=DEATH_BOUND_S)
        assert _survivors(ranks) == [], "ranks outlived their torchrun"
        assert processes_with(str(run_dir)) == []
    finally:
        torchrun_proc.kill()
        _kill_all(str(run_dir))


def test_retry_after_sigkill_of_torchrun_resumes_in_the_same_run_folder(tmp_path):
    """Through Dagster: the killed attempt's ranks die by themselves, the retry resumes beside no one.

    (Under Dagster an orphaned rank 0 dies sooner or later anyway, when its Pipes session is torn
    down; the test above is the one that shows orphans on unfixed code.)
    """
    runs_root = tmp_path / "runs"
    killer = _KillTorchrun(runs_root)
    try:
        killer.start()
        with dg.instance_for_test() as instance:
            result = materialize_cluster_check(  # in this thread: this process is the step process
                tmp_path, instance, TorchrunLauncher(nproc_per_node=2), JOB_STEPS, JOB_STEP_S
            )
            killer.join(timeout=START_BOUND_S + DEATH_BOUND_S)
            assert killer.error is None, killer.error
            assert killer.survivors == [], f"ranks outlived their torchrun: {killer.survivors}"
            logs = [r.user_message for r in instance.all_logs(result.run_id)]
        assert not any("leftover processes" in m for m in logs)  # they died on their own, not by the guard
        assert result.success
        assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
        (mat,) = [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
        md = mat.event_specific_data.materialization.metadata
        assert killer.killed_at_step is not None
        assert md["resumed_from_step"].value >= killer.killed_at_step  # the retry went on from the kill
        assert md["total"].value == JOB_STEPS * 3.0  # and the state carried over exactly
        roles = {json.loads(p.read_text())["role"] for p in runs_root.rglob(".lifeline/*.json")}
        assert roles == {"launcher", "torchrun", "rank"}  # every layer recorded itself for the guard
        assert processes_with(str(runs_root)) == []
    finally:
        _kill_all(str(runs_root))


def test_sigkill_of_the_step_process_kills_torchrun_and_its_ranks(tmp_path):
    runs_root = tmp_path / "runs"
    with open(tmp_path / "dagster.log", "wb") as log:
        run = start_cluster_check_cli(tmp_path, runs_root, stdout=log)
    try:
        torchrun, ranks = _wait_for_job(str(runs_root), runs_root)
        step = torchrun.parent()
        assert step is not None and JOB_MODULE not in " ".join(step.cmdline())
        step.kill()  # the process that runs the Pipes client, i.e. the Dagster step
        assert _survivors([torchrun, *ranks]) == [], "torchrun or its ranks outlived the step process"
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        _kill_all(str(runs_root))


# A subreaper adopts the orphan, so the test can read how the orphan ended.
_ORPHAN_SCRIPT = textwrap.dedent(
    r"""
    import ctypes, os, subprocess, sys
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    child = (
        "import time; time.sleep(1.5)\n"  # the parent dies while the child still starts up
        "from gc25d_core.lifeline import die_with_parent\n"
        "die_with_parent()\n"
        "print('survived', flush=True)\n"
    )
    parent = (
        "import os, subprocess, sys\n"
        "env = {**os.environ, 'GC25D_LIFELINE_PARENT': str(os.getpid())}\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}], env=env)\n"
    )
    subprocess.run([sys.executable, "-c", parent], check=True)  # returns at once: the child is orphaned
    pid, status = os.waitpid(-1, 0)
    print("signal" if os.WIFSIGNALED(status) else "exit", os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    """
)


def test_a_process_whose_parent_died_before_it_armed_kills_itself():
    out = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "survived" not in out.stdout
    assert out.stdout.split()[-2:] == ["signal", str(int(signal.SIGKILL))], out.stdout + out.stderr


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _record(proc: subprocess.Popen, role: str, start_shift_s: float = 0.0):
    from gc25d_core.lifeline import ProcessRecord

    create_time = psutil.Process(proc.pid).create_time() + start_shift_s
    return ProcessRecord(pid=proc.pid, create_time=create_time, host=socket.gethostname(), role=role)


def test_relaunch_guard_kills_recorded_survivors_but_never_a_reused_pid(tmp_path):
    from gc25d_core.lifeline import current_record, read_records, reap_and_claim, write_record

    folder = tmp_path / ".lifeline"
    survivor, stranger, dead_launcher = _sleeper(), _sleeper(), _sleeper()
    try:
        dead = _record(dead_launcher, "launcher")
        dead_launcher.kill()
        dead_launcher.wait(timeout=10)
        write_record(folder, dead)  # the previous launcher is gone: its processes are leftovers
        write_record(folder, _record(survivor, "rank"))
        write_record(folder, _record(stranger, "rank", start_shift_s=-100.0))  # same pid, other process
        survivor_proc = psutil.Process(survivor.pid)
        killed = reap_and_claim(folder)
        assert [r.pid for r in killed] == [survivor.pid]
        assert not survivor_proc.is_running()  # reap_and_claim waited for (and reaped) it
        assert stranger.poll() is None
        assert read_records(folder) == [current_record("launcher")]
    finally:
        for proc in (survivor, stranger, dead_launcher):
            proc.kill()
            proc.wait(timeout=10)


def test_relaunch_guard_refuses_a_folder_owned_by_a_live_launcher(tmp_path):
    from gc25d_core.lifeline import RunFolderBusy, reap_and_claim, write_record

    folder = tmp_path / ".lifeline"
    other_launcher, its_rank = _sleeper(), _sleeper()
    try:
        write_record(folder, _record(other_launcher, "launcher"))
        write_record(folder, _record(its_rank, "rank"))
        with pytest.raises(RunFolderBusy, match=f"live launcher pid {other_launcher.pid}"):
            reap_and_claim(folder)
        assert its_rank.poll() is None  # a live run's ranks are not ours to kill
    finally:
        for proc in (other_launcher, its_rank):
            proc.kill()
            proc.wait(timeout=10)


def test_a_malformed_record_names_its_file_and_field(tmp_path):
    from gc25d_core.lifeline import reap_and_claim

    folder = tmp_path / ".lifeline"
    folder.mkdir()
    bad = folder / "host-12.json"
    bad.write_text(json.dumps({"pid": "12", "create_time": 1.0, "host": "host", "role": "rank"}))
    with pytest.raises(ValueError, match=f"{bad}: field 'pid'"):
        reap_and_claim(folder)


# Plain torchrun (no lifeline wrapper, so no pid handed down), killed while its ranks still start up.
# The driver is a subreaper: the orphans come to it, so it can see each one end (and reap it).
# "Starting up" is observable: a rank maps libtorch while importing torch, which the entry module
# does only after the gc25d_core.jobs package (where the rank arms its parent-death signal) and
# seconds before jobs.common.run_job (where it armed before the fix).
_PLAIN_TORCHRUN_DRIVER = textwrap.dedent(
    r"""
    import ctypes, json, os, signal, subprocess, sys, time
    import psutil

    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    command, trials, bound = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

    def importing_torch(pid):
        try:
            with open(f"/proc/{pid}/maps") as f:
                return "libtorch" in f.read()
        except OSError:
            return False

    survivors = []
    for _ in range(trials):
        agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline, ranks = time.monotonic() + 120, []
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [p.pid for p in psutil.Process(agent.pid).children() if importing_torch(p.pid)]
            time.sleep(0.01)
        assert len(ranks) == 2, "the ranks did not start"
        agent.kill()  # SIGKILL of the torchrun agent while both ranks are importing torch
        agent.wait()
        alive, end = set(ranks), time.monotonic() + bound
        while alive and time.monotonic() < end:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)  # orphans are ours to reap
            except ChildProcessError:
                break  # no child left at all
            alive.discard(pid)
            if not pid:
                time.sleep(0.05)
        survivors.append(sorted(alive))
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    print(json.dumps(survivors))
    """
)


def test_sigkill_of_plain_torchrun_during_rank_start_up_kills_the_ranks(tmp_path):
    """Under a plain torchrun nothing hands the agent's pid down; before the fix a rank armed its
    parent-death signal only after torch's imports, so an agent killed meanwhile left both ranks
    running (re-parented, bound to their new parent, waiting on the dead agent's store)."""
    run_dir = tmp_path / "runs" / "cluster_check"
    cfg = load_config(
        "tiny", {"paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path / "runs")}}
    )
    job_args = ["--config", str(write_resolved(cfg, run_dir)), "--run-dir", str(run_dir)]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        f"--log-dir={tmp_path / 'logs'}", "-m", JOB_MODULE, *job_args, "--steps", "100000",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GC25D_LIFELINE_PARENT"}
    out = subprocess.run(
        [sys.executable, "-c", _PLAIN_TORCHRUN_DRIVER, json.dumps(command), "3", str(DEATH_BOUND_S)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == [[], [], []], f"ranks outlived their torchrun: {out.stdout}"
