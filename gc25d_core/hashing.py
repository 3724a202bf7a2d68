"""SHA256 of files, read in chunks (weights, text tables, cache shards are verified before use), and
seeds derived from SHA256 of values (the same draw in every process)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path | str, chunk_bytes: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def seed_int(*parts: object) -> int:
    """A 63-bit seed from a tuple of values (stable across processes and Python versions)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
