"""SHA256 of files, read in chunks (weights, text tables, cache shards are verified before use), and
seeds derived from SHA256 of values (the same draw in every process)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path


def sha256_file(path: Path | str, chunk_bytes: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def file_identities(paths: Iterable[Path | str]) -> dict[str, list[int]]:
    """Each file by (size, modification time in ns), named as given: what a record of a finished job
    keeps of the files it read and wrote, checked without reading them (a rewritten file changes its
    mtime). Raises OSError for a missing file."""
    out: dict[str, list[int]] = {}
    for p in paths:
        st = Path(p).stat()
        out[str(p)] = [st.st_size, st.st_mtime_ns]
    return out


def seed_int(*parts: object) -> int:
    """A 63-bit seed from a tuple of values (stable across processes and Python versions)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
