"""One job per run folder: the job itself locks ``<run_dir>/.lock`` (gc25d_core.run_lock) before it
touches the folder. Two plain torchrun launches of a tiny SFT started together into one folder: one
trains, the other fails on every rank naming the holder, and metrics.jsonl holds each step once. A
lock whose holder was SIGKILLed blocks nobody; neither does a child the holder forked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gc25d_core.run_lock import LOCK_NAME, RunFolderLock, RunFolderLocked
from tests.train.resume_checks import ROOT, records, small_sft
from tests.train.world import sft_world, write_config

STEPS = 12
# DDP on CPU: long enough for the two launches to overlap, short enough for CI
SFT = small_sft(STEPS, 6, 100)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("GC25D_FAULT", None)
    return env


def _start(config: Path, run_dir: Path, nproc: int = 2) -> subprocess.Popen[str]:
    """``torchrun --standalone`` of the SFT job, not waited for (its own session: killable as a whole)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "gc25d_core.jobs.sft",
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _holder(run_dir: Path) -> dict:
    return json.loads((run_dir / LOCK_NAME).read_text())


@pytest.fixture(scope="module")
def sft_config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run_lock")
    return write_config(sft_world(root, SFT), root / "run.yaml")


# ------------------------------------------------------------------------------------ in-process


def test_second_lock_names_the_holder_and_the_first_release_frees_it(tmp_path):
    lock = RunFolderLock.acquire(tmp_path / "run")
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from gc25d_core.run_lock import RunFolderLock as L; "
             "L.acquire(sys.argv[1])", str(tmp_path / "run")],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert probe.returncode != 0
        last = probe.stderr.strip().splitlines()[-1]
        assert (
            "RunFolderLocked" in last and f"pid {os.getpid()} on " in last and str(tmp_path / "run") in last
        )
    finally:
        lock.release()
    RunFolderLock.acquire(tmp_path / "run").release()  # free once released


_HOLD_AND_FORK = textwrap.dedent(
    """
    import os, sys, time
    from gc25d_core.run_lock import RunFolderLock
    RunFolderLock.acquire(sys.argv[1])
    if os.fork() == 0:  # a child that outlives its parent (a loader worker would)
        time.sleep(600)
        os._exit(0)
    open(sys.argv[2], "w").write("locked")
    time.sleep(600)
    """
)


def test_a_sigkilled_holder_leaves_no_lock_even_with_a_forked_child_alive(tmp_path):
    run, ready = tmp_path / "run", tmp_path / "ready"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_FORK, str(run), str(ready)],
        cwd=ROOT,
        env=_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline and holder.poll() is None, "the holder did not start"
            time.sleep(0.05)
        with pytest.raises(RunFolderLocked, match=f"pid {holder.pid} on "):
            RunFolderLock.acquire(run)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        RunFolderLock.acquire(run).release()  # the child still runs; the lock went with its parent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)  # the forked child


_EVERY_RANK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gc25d_core.distributed import global_rank, process_group
    from gc25d_core.run_lock import RunFolderLocked, hold_run_folder

    with process_group("gloo"):
        try:
            with hold_run_folder(sys.argv[1]):
                outcome = "held"
        except RunFolderLocked as e:
            outcome = str(e)
        Path(sys.argv[2], f"rank{global_rank()}").write_text(outcome)
    """
)


@pytest.mark.slow
def test_every_rank_of_a_job_learns_that_the_folder_is_taken(tmp_path):
    """Only rank 0 tries the lock; the outcome reaches rank 1 through the process group."""
    script, out = tmp_path / "every_rank.py", tmp_path / "out"
    script.write_text(_EVERY_RANK)
    out.mkdir()

    def job() -> dict[str, str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(script), str(tmp_path / "run"), str(out)]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return {p.name: p.read_text() for p in sorted(out.iterdir())}

    lock = RunFolderLock.acquire(tmp_path / "run")
    try:
        taken = job()
    finally:
        lock.release()
    named = f"{tmp_path / 'run'}: run folder in use by pid {os.getpid()} on "
    assert sorted(taken) == ["rank0", "rank1"] and all(t.startswith(named) for t in taken.values()), taken
    assert job() == {"rank0": "held", "rank1": "held"}


# ---------------------------------------------------------------------------------- real launches


@pytest.mark.slow
def test_two_launches_started_together_one_trains_the_other_names_it(sft_config, tmp_path):
    run = tmp_path / "run"
    first, second = _start(sft_config, run), _start(sft_config, run)
    outs = [p.communicate(timeout=900) for p in (first, second)]
    codes = [first.returncode, second.returncode]
    assert sorted(c == 0 for c in codes) == [False, True], (codes, [err[-3000:] for _, err in outs])
    loser_err = outs[codes.index(next(c for c in codes if c != 0))][1]
    holder = _holder(run)  # the winner's rank 0 wrote it; the loser never did
    named = f"{run}: run folder in use by pid {holder['pid']} on {holder['host']}"
    assert named in loser_err, loser_err[-3000:]
    assert [r["step"] for r in records(run / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert json.loads((run / "done.json").read_text())["final_step"] == STEPS


@pytest.mark.slow
def test_a_launch_whose_holder_was_sigkilled_does_not_block_the_next(sft_config, tmp_path):
    run = tmp_path / "run"
    first = _start(sft_config, run)
    deadline = time.monotonic() + 600
    while not (run / "metrics.jsonl").is_file() or not records(run / "metrics.jsonl"):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first launch did not start training"
        time.sleep(0.2)
    holder = _holder(run)
    os.kill(holder["pid"], signal.SIGKILL)  # rank 0, holding the lock mid-run
    first.communicate(timeout=300)
    assert first.returncode != 0
    second = _start(sft_config, run)
    _, err = second.communicate(timeout=900)
    assert second.returncode == 0, err[-3000:]
    assert _holder(run)["pid"] != holder["pid"]
    assert [r["step"] for r in records(run / "metrics.jsonl")] == list(range(1, STEPS + 1))
