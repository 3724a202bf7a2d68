"""``make dev``'s supervisor: runs ``dg dev`` and stops it, its runs and every process under it on
SIGINT, SIGTERM or SIGHUP, in the foreground or in the background.

    python -m gc25d_pipeline.lib.dev -- dg dev -h 127.0.0.1 -p 3000

Why a supervisor: a job started in the background by a non-interactive shell (``make dev &`` in a
script, CI, nohup) inherits SIGINT ignored, and ``dagster dev`` maps SIGTERM to whatever SIGINT does
(dagster._utils.interrupts), so it ignored both and its webserver, daemon, code servers and run
workers had to be killed by hand. Here ``dg dev`` starts with both signals at their defaults, in a
session of its own, and a stop goes in this order:

1. runs in flight (started by a code server of this instance) are terminated as the UI's Terminate
   does (``run_launcher.terminate``): the run is marked CANCELING, its step forwards SIGINT to
   torchrun, and it ends CANCELED, which Dagster's run retries never retry. A run merely
   interrupted by the signal would end FAILURE ("unexpected termination") and be retried by the next
   daemon that starts;
2. SIGINT to ``dg dev``'s process group, as a terminal's Ctrl-C does: dagster dev shuts its
   webserver, daemon and code servers down;
3. whatever of the process tree is still alive after the grace period is killed (torch's ranks run
   in sessions of their own but die with torchrun, gc25d_core.lifeline).

A second signal skips the waiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

import psutil

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RUNS_TIMEOUT_S = 60.0  # the runs' own cleanup: torchrun gets 20 s (TorchrunLauncher) after SIGINT
SHUTDOWN_TIMEOUT_S = 30.0  # dagster dev gives its webserver and daemon 10 s each


def _log(msg: str) -> None:
    print(f"[make dev] {msg}", file=sys.stderr, flush=True)


class _Stop:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        _log(f"{signal.Signals(signum).name}: stopping" + (" now" if self.count > 1 else ""))

    @property
    def hurried(self) -> bool:
        return self.count > 1


def _default_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def cancel_runs(stop: _Stop, timeout_s: float = RUNS_TIMEOUT_S) -> list[str]:
    """Terminate this instance's started runs that a code server runs (not in-process ones, e.g. a
    concurrent ``make run``), as the UI's Terminate does; wait until they finish. Returns their ids."""
    import dagster as dg
    from dagster._core.storage.tags import GRPC_INFO_TAG

    try:
        instance = dg.DagsterInstance.get()
    except Exception as e:  # no instance, nothing of ours can be running in it
        _log(f"no Dagster instance to stop runs in ({type(e).__name__}: {e})")
        return []
    with instance:
        active = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
        runs = [r for r in instance.get_runs(dg.RunsFilter(statuses=active)) if GRPC_INFO_TAG in r.tags]
        for run in runs:
            _log(f"terminating run {run.run_id} ({run.job_name})")
            try:
                instance.run_launcher.terminate(run.run_id)
            except Exception as e:  # the code server is gone: the signals below stop the worker
                _log(f"could not terminate {run.run_id}: {type(e).__name__}: {e}")
        deadline = time.monotonic() + timeout_s
        waiting = [r.run_id for r in runs]
        while waiting and time.monotonic() < deadline and not stop.hurried:
            time.sleep(0.5)
            waiting = [i for i in waiting if not (r := instance.get_run_by_id(i)) or not r.is_finished]
        if waiting:
            _log(f"runs still stopping after {timeout_s:.0f} s: {waiting}")
    return [r.run_id for r in runs]


def _tree(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_survivors(procs: Sequence[psutil.Process], pgid: int) -> None:
    alive = [p for p in procs if p.is_running()]  # is_running compares start times: no reused pid
    names = []
    for p in alive:
        with contextlib.suppress(psutil.Error):
            names.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if alive:
        _log(f"killed {len(alive)} processes left after the shutdown: " + "; ".join(names))


def supervise(command: Sequence[str]) -> int:
    stop = _Stop()
    for sig in STOP_SIGNALS:  # also where the parent left them ignored (a background job)
        signal.signal(sig, stop)
    proc = subprocess.Popen(list(command), start_new_session=True, preexec_fn=_default_signals)
    seen: dict[int, psutil.Process] = {}
    while proc.poll() is None and not stop.count:
        for p in _tree(proc):  # remembered: a process re-parented on its parent's death is still ours
            seen.setdefault(p.pid, p)
        time.sleep(1.0)
    if not stop.count:  # dg dev ended by itself
        _kill_survivors(list(seen.values()), proc.pid)
        return proc.returncode
    for p in _tree(proc):
        seen.setdefault(p.pid, p)
    if not stop.hurried:
        cancel_runs(stop)
    for p in _tree(proc):
        seen.setdefault(p.pid, p)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline and not stop.hurried:
        time.sleep(0.2)
    if proc.poll() is None:
        _log(f"dg dev did not stop within {SHUTDOWN_TIMEOUT_S:.0f} s")
    _kill_survivors(list(seen.values()), proc.pid)
    proc.wait()
    _log("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m gc25d_pipeline.lib.dev -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
