"""What the launcher tests share: the tiny project, cluster_check materialized in this process or
through the ``dagster`` command line (waited for and interrupted), and the messages of a chained
step error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import dagster as dg
import psutil
import pytest
import yaml

from gc25d_pipeline.defs.ops.assets import cluster_check
from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from tests.peers import processes_with

ROOT = Path(__file__).resolve().parent.parent
JOB_MODULE = "gc25d_core.jobs.cluster_check"
# long enough to be stopped from outside while it runs
ENDLESS_CLUSTER_CHECK = '{"ops": {"cluster_check": {"config": {"steps": 100000, "step_seconds": 0.05}}}}'


def tiny_project(tmp_path: Path) -> Gc25dProject:
    (tmp_path / "data").mkdir(exist_ok=True)  # a data root the user names must exist
    store = ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs"))
    return Gc25dProject(preset="tiny", store=store)


def materialize_cluster_check(
    tmp_path: Path,
    instance: dg.DagsterInstance,
    launcher: JobLauncher,
    steps: int = 5,
    step_seconds: float = 0.0,
) -> dg.ExecuteInProcessResult:
    """cluster_check in this process (the step process), runs under ``tmp_path/runs``."""
    return dg.materialize(
        [cluster_check],
        resources={"project": tiny_project(tmp_path), "torchrun": launcher},
        instance=instance,
        run_config={"ops": {"cluster_check": {"config": {"steps": steps, "step_seconds": step_seconds}}}},
        raise_on_error=False,
    )


def start_cluster_check_cli(
    tmp_path: Path,
    runs_root: Path,
    launcher_config: dict[str, Any] | None = None,
    stdout: int | IO[bytes] = subprocess.PIPE,
) -> subprocess.Popen:
    """``dagster asset materialize`` of an endless cluster_check in a session of its own, with a
    DAGSTER_HOME under ``tmp_path``, runs under ``runs_root`` and, when given, the launcher that
    ``launcher_config`` describes (GC25D_LAUNCHER_CONFIG)."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "data").mkdir(exist_ok=True)  # a data root the user names must exist
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC25D_PRESET": "tiny",
        "GC25D_OVERRIDES": f"paths.runs_root={runs_root};paths.data_root={tmp_path / 'data'}",
    }
    if launcher_config is not None:
        path = tmp_path / "launcher.yaml"
        path.write_text(yaml.safe_dump(launcher_config))
        env["GC25D_LAUNCHER_CONFIG"] = str(path)
    cmd = [
        str(Path(sys.executable).parent / "dagster"),
        "asset",
        "materialize",
        "-m",
        "gc25d_pipeline.definitions",
        "--select",
        "cluster_check",
        "--config-json",
        ENDLESS_CLUSTER_CHECK,
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
    )


def error_messages(error: Any) -> list[str]:
    """The messages of a step's error and of its causes ("Exceeded max_retries" wraps the launcher's)."""
    out = []
    while error is not None:
        out.append(error.message)
        error = error.cause
    return out


def wait_for_cluster_check(runs_root: Path, count: int, timeout_s: float, what: str) -> list[psutil.Process]:
    """The cluster_check processes under ``runs_root`` once there are ``count`` of them (agents and
    ranks) and a first checkpoint proves the ranks are working."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = [p for p in processes_with(str(runs_root)) if JOB_MODULE in " ".join(p.cmdline())]
        if len(job) >= count and list(runs_root.rglob("step-*")):
            return job
        time.sleep(0.5)
    pytest.fail(f"{what} did not start within {timeout_s:.0f} s")


def interrupt_run_worker(proc: subprocess.Popen, runs_root: Path, timeout_s: float) -> list[psutil.Process]:
    """SIGINT to the run worker only (the launcher must stop the job itself); the processes under
    ``runs_root`` still alive ``timeout_s`` after it exited."""
    pids = [p.pid for p in processes_with(str(runs_root))]
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=90)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=timeout_s)
    return alive


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    """Poll ``check`` until it returns something true (returned); an exception means "not yet",
    and the last one is raised at the deadline (else an AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if value := check():
                return value
        except Exception:  # not up yet: keep polling until the deadline
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)
