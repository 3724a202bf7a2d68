"""Atomic file writes: write a temporary file beside the target, fsync, ``os.replace``, fsync the folder.

A crash leaves either the old file or the new one, never a torn one; once a write returns, the
rename itself is durable (the folder is fsynced). Temporary names start with ``.tmp-`` so readers
and resume scans can ignore them, and carry the writer's host and pid
(``.tmp-<label>~<host>~<pid>~<random>``) so that ``sweep_stale_tmp`` can remove the leftovers of a
killed writer without ever touching a live writer's file.

Published files get the mode a plain ``open()`` would give them (``0o666`` less the process umask,
0644 under the usual 022) and temp folders ``0o777`` less the umask: ``mkstemp`` / ``mkdtemp``
create theirs owner-only, and a rename keeps the mode, so without the chmod every manifest, shard,
export and hand-off would be unreadable to a web server or a teammate running as another user.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TMP_PREFIX = ".tmp-"
TAG_SEP = "~"  # not in mkstemp's random part, nor in a sanitised host name, nor in a pid
# A temp file whose writer cannot be checked (another host on a shared filesystem, or a name
# without a writer tag) is stale once untouched this long: a live writer keeps its mtime fresh.
STALE_AFTER_S = 24 * 3600.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "unknown-host"


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it.

    The umask is process-global and ``os.umask`` can only read it by setting it: a round trip lets
    a file another thread creates in between get the temporary value. Linux (4.7+) reports it in
    ``/proc/self/status``, which reads it without touching it, so it is read there on every call (a
    later ``os.umask`` by the application is honoured; the read costs far less than the fsync
    beside it). Elsewhere the round trip runs under a lock with the most restrictive temporary
    value, so a file created concurrently can only come out more private, never more public."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o777)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file under the current umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode ``os.mkdir`` gives a new folder under the current umask."""
    return 0o777 & ~current_umask()


def tmp_prefix(label: str) -> str:
    """The name prefix of this process's temp files for ``label`` (mkstemp appends the random part)."""
    return f"{TMP_PREFIX}{label}{TAG_SEP}{_host()}{TAG_SEP}{os.getpid()}{TAG_SEP}"


def make_tmp_file(folder: Path | str | None, label: str) -> Path:
    """Create an empty temp file in ``folder`` (None: the system temp folder), tagged with this
    writer, with the mode of a plain ``open()`` (it is renamed or linked into place as it is)."""
    fd, name = tempfile.mkstemp(prefix=tmp_prefix(label), dir=folder)
    try:
        os.fchmod(fd, file_mode())
    finally:
        os.close(fd)
    return Path(name)


def make_tmp_dir(folder: Path | str, label: str) -> Path:
    """Create an empty temp folder in ``folder``, tagged with this writer, with the mode of a plain
    ``os.mkdir`` (it is renamed into place as it is)."""
    path = Path(tempfile.mkdtemp(prefix=tmp_prefix(label), dir=folder))
    os.chmod(path, dir_mode())
    return path


def fsync_dir(folder: Path | str) -> None:
    """Make a rename / link / unlink in ``folder`` durable (POSIX: the entry lives in the folder)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success it replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = make_tmp_file(path.parent, path.name)
    try:
        yield tmp_path
        # again after the write: a library may replace the temp file with its own owner-only one
        # (safetensors' save_file does)
        os.chmod(tmp_path, file_mode())
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(fileobj)`` on a temporary file, then move it into place."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
    return Path(path)


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: Path | str, data: bytes) -> bool:
    """Create ``path`` with ``data`` only if it does not exist (atomic, no overwrite). True if created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_tmp_file(path.parent, path.name)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if path exists: create-only semantics
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# ----------------------------------------------------------------------------------------------
# leftovers of killed writers


@dataclass(frozen=True)
class TmpWriter:
    host: str
    pid: int


def tmp_writer(name: str) -> TmpWriter | None:
    """The writer a temp file name records, None for names without a (valid) writer tag."""
    if not name.startswith(TMP_PREFIX):
        return None
    parts = name[len(TMP_PREFIX) :].rsplit(TAG_SEP, 3)
    if len(parts) != 4 or not parts[2].isdigit() or int(parts[2]) <= 0:
        return None
    return TmpWriter(host=parts[1], pid=int(parts[2]))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host is running (a zombie is dead: it writes nothing more)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def is_stale_tmp(path: Path, *, max_age_s: float = STALE_AFTER_S, now: float | None = None) -> bool:
    """A temp file/folder is stale when its writer (this host) is dead, or, when the writer cannot
    be checked (other host, untagged name), when it has not been modified for ``max_age_s``."""
    writer = tmp_writer(path.name)
    if writer is not None and writer.host == _host():
        return not pid_alive(writer.pid)
    try:
        mtime = path.lstat().st_mtime
    except FileNotFoundError:
        return False
    return (time.time() if now is None else now) - mtime > max_age_s


def sweep_stale_tmp(
    folder: Path | str, *, recursive: bool = False, max_age_s: float = STALE_AFTER_S
) -> list[Path]:
    """Remove the stale ``.tmp-*`` files and folders in ``folder`` (``recursive``: and below it).

    Returns what was removed. Safe to run while other writers work, in any number of processes:
    a live writer's temp file is never stale, and a file another sweeper removed first is skipped."""
    root = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        path = Path(entry.path)
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name.startswith(TMP_PREFIX):
            if is_stale_tmp(path, max_age_s=max_age_s):
                with contextlib.suppress(FileNotFoundError):
                    if is_dir:
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                    removed.append(path)
        elif recursive and is_dir:
            removed += sweep_stale_tmp(path, recursive=True, max_age_s=max_age_s)
    if removed:
        with contextlib.suppress(OSError):
            fsync_dir(root)
    return removed
