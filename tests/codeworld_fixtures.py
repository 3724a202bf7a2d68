"""Session fixture: the code world's tiny preset generated once into a tmp folder.

Import the fixture into a test module (``from .codeworld_fixtures import tiny_raw``) to use it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gc25d_core.codeworld import generate


@dataclass(frozen=True)
class TinyRaw:
    root: Path
    summary: dict[str, Any]
    wall_s: float


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> TinyRaw:
    root = tmp_path_factory.mktemp("codeworld") / "raw"
    t0 = time.monotonic()
    summary = generate(root, "tiny", seed=0)
    return TinyRaw(root, summary, time.monotonic() - t0)
