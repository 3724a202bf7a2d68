"""The code world's tiny preset generated into a folder.

Tests get it from the session fixture ``tiny_raw`` (tests/conftest.py), generated once per session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gc25d_core.codeworld import generate


@dataclass(frozen=True)
class TinyRaw:
    root: Path
    summary: dict[str, Any]
    wall_s: float


def generate_tiny_raw(root: Path) -> TinyRaw:
    t0 = time.monotonic()
    summary = generate(root, "tiny", seed=0)
    return TinyRaw(root, summary, time.monotonic() - t0)
