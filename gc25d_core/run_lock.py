"""An exclusive lock on a run folder, held by a job for its whole life.

Two jobs in one run folder interleave their logs and overwrite each other's state and exports. The
launcher refuses a folder its own records show in use (gc25d_core.lifeline), but it cannot see a
second plain ``torchrun`` started by hand a few milliseconds after the first. So the job itself
takes the lock: global rank 0 takes ``fcntl.flock`` on ``<run_dir>/.lock`` before anything else
touches the folder and keeps the file open until the job ends; the other ranks learn the outcome
through the process group, and a job that lost fails on every rank, before it wrote anything, with
one line naming the folder and the holder (host, pid and start time, which the holder writes into
the lock file).

Stale-safe by construction: the kernel drops a flock when the last descriptor of it closes, which
happens when the holder dies however it dies (SIGKILL included), so there is no liveness check to
race and nothing to break by hand. A lock file created exclusively (``O_EXCL``) would outlive a
killed holder. Children forked by the holder (data loader workers) close their copy of the
descriptor, so the lock lives exactly as long as the holding process. On a shared filesystem Linux
maps flock to the NFS lock protocol, so the lock also holds between nodes.

Written here on ``fcntl`` rather than with py-filelock: the holder's record must live in the locked
file itself (the loser reads it to name the holder), and filelock does not expose that file.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from gc25d_core.distributed import dist_active, global_rank

LOCK_NAME = ".lock"
# the holder writes its record right after it got the lock: a loser reading in that instant finds
# the file empty (or the last holder's record) and reads again for this long
_RECORD_WAIT_S = 2.0

_held: dict[int, Path] = {}  # descriptor -> run folder, of the locks this process holds
_held_guard = threading.Lock()


class RunFolderLocked(RuntimeError):
    """Another live job holds the run folder."""


def _close_in_forked_child() -> None:
    # a forked child shares the lock with its parent; closing its copy leaves the parent's intact
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_forked_child)


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    create_time: float  # the process's start (psutil), so a reused pid is not taken for the holder

    def describe(self) -> str:
        started = datetime.datetime.fromtimestamp(self.create_time, datetime.UTC)
        return f"pid {self.pid} on {self.host} (started {started:%Y-%m-%d %H:%M:%S} UTC)"

    def alive(self) -> bool:
        """Whether the recorded process still runs; True when it cannot be checked (another host)."""
        if self.host != socket.gethostname():
            return True
        try:
            return abs(psutil.Process(self.pid).create_time() - self.create_time) < 1e-3
        except psutil.NoSuchProcess:
            return False


def _me() -> Holder:
    pid = os.getpid()
    return Holder(host=socket.gethostname(), pid=pid, create_time=psutil.Process(pid).create_time())


def _read_holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0))
        return Holder(host=str(data["host"]), pid=int(data["pid"]), create_time=float(data["create_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RunFolderLock:
    """``<run_dir>/.lock`` held by this process (``acquire``) until ``release`` or its death."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self.fd = run_dir, fd

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_NAME

    @classmethod
    def acquire(cls, run_dir: Path | str) -> RunFolderLock:
        """Take the lock without waiting; RunFolderLocked naming the holder when another has it."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                raise RunFolderLocked(_busy_message(run_dir, fd)) from None
            record = json.dumps(asdict(_me()), sort_keys=True).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        with _held_guard:
            _held[fd] = run_dir
        return cls(run_dir, fd)

    def release(self) -> None:
        """Unlock and close (the record stays: it names the last holder, for whoever looks)."""
        with _held_guard:
            if _held.pop(self.fd, None) is None:
                return
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _busy_message(run_dir: Path, fd: int) -> str:
    deadline = time.monotonic() + _RECORD_WAIT_S
    holder = _read_holder(fd)
    while (holder is None or not holder.alive()) and time.monotonic() < deadline:
        time.sleep(0.05)
        holder = _read_holder(fd)
    who = holder.describe() if holder is not None and holder.alive() else "a job that has not recorded itself"
    return (
        f"{run_dir}: run folder in use by {who}, which holds {run_dir / LOCK_NAME}; "
        "not starting a second job in it"
    )


def _broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (a collective when a process group of several ranks runs)."""
    if not dist_active():
        return text
    import torch.distributed as dist

    box = [text]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


@contextlib.contextmanager
def hold_run_folder(run_dir: Path | str) -> Iterator[None]:
    """Collective: rank 0 locks ``run_dir`` for the body; on every rank RunFolderLocked (one line
    naming the folder and the holder) when another job holds it, before anything touches it."""
    lock: RunFolderLock | None = None
    error = ""
    if global_rank() == 0:
        try:
            lock = RunFolderLock.acquire(run_dir)
        except RunFolderLocked as e:
            error = str(e)
        except OSError as e:  # no folder, no permission: every rank must hear of it, not wait
            error = f"{run_dir}: cannot lock the run folder ({e})"
    error = _broadcast_text(error)
    if error:
        raise RunFolderLocked(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
