"""A published snapshot is readable by whoever the umask lets read it: files get the mode a plain
``open()`` gives (0644 under umask 022), folders that of ``mkdir``, and a web server running as
another user can read the manifest, the shards and the receipts. The umask is followed, not
replaced: under 077 everything stays owner-only."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gc25d_core.cache import LocalStore, read_snapshot
from gc25d_core.cache.manifest import POINTER_PATH, version_path
from gc25d_core.hashing import sha256_file


@pytest.fixture
def umask() -> Iterator[object]:
    """Set the process umask for one test (``umask.set(0o022)``); the old one comes back after."""
    before = os.umask(0o022)
    os.umask(before)

    class Setter:
        @staticmethod
        def set(mask: int) -> None:
            os.umask(mask)

    yield Setter
    os.umask(before)


@pytest.fixture
def world_traversable() -> Iterator[Path]:
    """A folder under /tmp whose parents another user can traverse (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gc25d-modes-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def modes(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder below ``root`` (``root`` excluded): relative path -> (kind, permission bits)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        out[str(path.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


def published_files(store: LocalStore) -> list[Path]:
    """The manifest (pointer and version), one shard and its receipt of the store's snapshot."""
    snap = read_snapshot(store)
    shard = snap.manifest.shards[0]
    return [store.root / p for p in (POINTER_PATH, version_path(snap.ref.version), shard.path, shard.receipt)]


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_snapshot_files_follow_the_umask(tmp_path, kit, umask, mask, file_mode, dir_mode):
    umask.set(mask)
    store, _ = kit.build_store(tmp_path / "store", n_shards=2, per_shard=3)
    found = modes(store.root)
    assert {p.relative_to(store.root).as_posix() for p in published_files(store)} <= set(found)
    wrong = {p: (k, oct(m)) for p, (k, m) in found.items() if m != (dir_mode if k == "dir" else file_mode)}
    assert not wrong, f"under umask {mask:03o} expected files {file_mode:o}, folders {dir_mode:o}: {wrong}"


def test_umask_077_keeps_the_snapshot_owner_only(tmp_path, kit, umask):
    umask.set(0o077)
    store, _ = kit.build_store(tmp_path / "store", n_shards=2, per_shard=3)
    found = modes(store.root)
    wrong = {p: (k, oct(m)) for p, (k, m) in found.items() if m != (0o700 if k == "dir" else 0o600)}
    assert not wrong, f"umask 077 must give files 600 and folders 700: {wrong}"


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another uid needs root to switch to 'nobody'")
def test_another_user_reads_the_published_snapshot(world_traversable, kit, umask):
    """What a web server running as ``nobody`` sees: it can read (and hash) the manifest, a shard
    and its receipt. Its groups are dropped too, so the root group's bits grant it nothing."""
    umask.set(0o022)
    store, _ = kit.build_store(world_traversable / "store", n_shards=2, per_shard=3)
    files = published_files(store)
    reader = subprocess.run(
        ["sha256sum", *map(str, files)],
        user="nobody",
        group=pwd.getpwnam("nobody").pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    assert reader.returncode == 0, f"'nobody' could not read the snapshot: {reader.stderr.strip()}"
    seen = {line.split(None, 1)[1].strip(): line.split()[0] for line in reader.stdout.splitlines()}
    assert seen == {str(p): sha256_file(p) for p in files}
