"""Processes of a launch die with their parent, and a relaunch finds no survivors of the last one.

The chain is Dagster step -> torchrun (this module's ``main``) -> ranks. torch's elastic agent starts
every rank in a new session, so when torchrun is killed with SIGKILL nothing stops its ranks: they
keep running as orphans, holding GPU memory and the launcher's pipes, while the retry starts beside
them. Two mechanisms close that:

- **Parent-death signal.** Each process asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be
  killed when its parent dies. It is chosen over a watchdog thread that polls the parent pid because
  the kernel delivers it even when the interpreter is wedged (a rank blocked in a collective holding
  the GIL never runs a watchdog) and it costs no polling delay. The parent pid is handed down in
  ``GC25D_LIFELINE_PARENT``, so a process can tell that its parent already died between fork and
  prctl (it was then re-parented) and kill itself instead of living on unarmed. Ranks arm it when
  ``gc25d_core.jobs`` is first imported, before torch (``gc25d_core.parent_death``), which under a
  plain ``torchrun`` too leaves only the interpreter's start-up unprotected.
  Caveats the design accepts: the signal follows the parent *thread* that forked (torchrun and
  Dagster's Pipes client both spawn and then wait from one thread), and children of a rank (data
  loader workers) do not inherit it; torch's loader workers watch their parent themselves.
- **Relaunch guard.** The launcher, torchrun and every rank record ``pid`` and process start time in
  ``GC25D_LIFELINE_DIR`` (``<run_dir>/.lifeline``). Before the next launch, ``reap_and_claim`` kills
  every recorded process that is still running (start time compared, so a reused pid is never
  killed), unless the launcher that owns them is itself alive: then the run folder is in use and the
  launch is refused.

    python -m gc25d_core.lifeline --standalone --nproc-per-node=2 -m gc25d_core.jobs.cluster_check ...
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from gc25d_core.atomic import TMP_PREFIX, atomic_write_text
from gc25d_core.parent_death import PARENT_ENV, die_with_parent

DIR_ENV = "GC25D_LIFELINE_DIR"  # folder where each process of a launch records itself
LIFELINE_DIRNAME = ".lifeline"

_HOST_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_START_TIME_TOLERANCE_S = (
    1e-3  # psutil derives start times from clock ticks (10 ms); same process = same value
)
ROLES = ("launcher", "torchrun", "rank")


class RunFolderBusy(RuntimeError):
    """Another live launcher owns processes recorded in this run folder."""


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    create_time: float
    host: str
    role: str

    def process(self) -> psutil.Process | None:
        """The recorded process if it is still running (not a later process that reused the pid)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > _START_TIME_TOLERANCE_S:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None  # dead already, only waiting for its parent to reap it
            return proc
        except psutil.NoSuchProcess:
            return None


def lifeline_dir(run_dir: Path) -> Path:
    return run_dir / LIFELINE_DIRNAME


def _host() -> str:
    host = socket.gethostname()
    if not _HOST_RE.fullmatch(host):
        raise ValueError(f"hostname {host!r} cannot name a lifeline record (expected {_HOST_RE.pattern})")
    return host


def current_record(role: str) -> ProcessRecord:
    if role not in ROLES:
        raise ValueError(f"lifeline role {role!r} is not one of {ROLES}")
    pid = os.getpid()
    return ProcessRecord(pid=pid, create_time=psutil.Process(pid).create_time(), host=_host(), role=role)


# --- relaunch guard ------------------------------------------------------------------------------


def _record_path(folder: Path, record: ProcessRecord) -> Path:
    return folder / f"{record.host}-{record.pid}.json"


def write_record(folder: Path, record: ProcessRecord) -> Path:
    return atomic_write_text(_record_path(folder, record), json.dumps(asdict(record)))


def register(role: str) -> None:
    """Record this process in ``GC25D_LIFELINE_DIR`` (set by the launcher) so a relaunch can find it."""
    raw = os.environ.get(DIR_ENV)
    if not raw:
        return
    folder = Path(raw)
    if not folder.is_absolute() or not folder.is_dir() or folder.name != LIFELINE_DIRNAME:
        raise ValueError(
            f"environment {DIR_ENV}={raw!r}: expected an existing absolute */{LIFELINE_DIRNAME} folder"
        )
    write_record(folder, current_record(role))


def _read_record(path: Path) -> ProcessRecord:
    data = json.loads(path.read_text())
    fields = {"pid": int, "create_time": float, "host": str, "role": str}
    for name, kind in fields.items():
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{path}: field {name!r} must be {kind.__name__}, got {value!r}")
    return ProcessRecord(**{name: data[name] for name in fields})


def read_records(folder: Path) -> list[ProcessRecord]:
    if not folder.is_dir():
        return []
    return [_read_record(p) for p in sorted(folder.glob("*.json")) if not p.name.startswith(TMP_PREFIX)]


def reap_and_claim(folder: Path, timeout_s: float = 10.0) -> list[ProcessRecord]:
    """Kill survivors of earlier launches recorded in ``folder``, then record this process as launcher.

    Returns the processes it killed. Raises RunFolderBusy when another live launcher owns the folder,
    and RuntimeError when a survivor outlives SIGKILL by ``timeout_s``.
    """
    me = current_record("launcher")
    records = [r for r in read_records(folder) if r.host == me.host]  # pids of other nodes mean nothing here
    live = [(r, p) for r in records if (p := r.process()) is not None]
    owners = [r for r, _ in live if r.role == "launcher" and r.pid != me.pid]
    if owners:
        raise RunFolderBusy(
            f"{folder}: run folder in use by live launcher pid {owners[0].pid}; not launching beside it"
        )
    survivors = [(r, p) for r, p in live if r.role != "launcher"]
    for _, proc in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()  # psutil re-checks the start time first: a reused pid is never signalled
    _, still_alive = psutil.wait_procs([p for _, p in survivors], timeout=timeout_s)
    if still_alive:
        raise RuntimeError(
            f"{folder}: pids {[p.pid for p in still_alive]} survived SIGKILL for {timeout_s} s"
        )
    for record in records:
        _record_path(folder, record).unlink(missing_ok=True)
    write_record(folder, me)
    return [r for r, _ in survivors]


# --- torchrun wrapper ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Run torch's elastic launcher in this process, bound to our parent, with its ranks bound to it."""
    die_with_parent()
    register("torchrun")
    os.environ[PARENT_ENV] = str(os.getpid())  # the ranks torchrun spawns must die with it
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv)


if __name__ == "__main__":
    main()
