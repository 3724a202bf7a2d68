"""One writer of the project's safetensors files (exports, the tiny VAE, the fast decoder): atomic, and
the same bytes for the same tensors and metadata in every process.

safetensors (0.8) serialises its header's maps in a per-process random order, so the same weights
saved twice can get two SHA256s, and every reader here checks a file by its SHA256. The header is
rewritten with its keys sorted (same length: the same strings reordered; padded with spaces as
safetensors pads it); the tensor bytes are not touched, their offsets being relative to the data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gc25d_core.atomic import atomic_path

_LEN = 8  # the header's length: u64 little-endian before the JSON header


def canonical_header(raw: bytes) -> bytes:
    """The JSON header ``raw`` with every map's keys sorted, padded with spaces to ``len(raw)``."""
    header = json.loads(raw)
    out = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(out) > len(raw):
        raise ValueError(f"safetensors header grew when sorted ({len(raw)} → {len(out)} bytes)")
    return out + b" " * (len(raw) - len(out))


def save_safetensors(tensors: Mapping[str, Any], path: Path | str, metadata: Mapping[str, str]) -> Path:
    """Write ``tensors`` (contiguous torch tensors) and string ``metadata`` to ``path`` atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(dict(tensors), str(tmp), metadata=dict(metadata))
        with open(tmp, "r+b") as f:
            n = int.from_bytes(f.read(_LEN), "little")
            header = canonical_header(f.read(n))
            f.seek(_LEN)
            f.write(header)
    return path
