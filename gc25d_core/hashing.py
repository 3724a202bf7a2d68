"""SHA256 of files, read in chunks (weights, text tables, cache shards are verified before use)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path | str, chunk_bytes: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()
