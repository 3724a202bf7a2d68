"""Checkpoint folders: ``<root>/step-000100/`` saved atomically (temp folder + rename).

Resume is the default path: ``latest()`` is the newest complete step folder (a folder is complete
once renamed into place; temp folders start with ``.tmp-``). ``keep`` rotates old ones away.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gc25d_core.atomic import TMP_PREFIX

_STEP = re.compile(r"^step-(\d{6,})$")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


class CheckpointDir:
    def __init__(self, root: Path | str, keep: int | None = None):
        self.root = Path(root)
        self.keep = keep

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP.match(p.name)
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def save(self, step: int, write: Callable[[Path], object]) -> Path:
        """``write(tmp_dir)`` fills a temp folder that then becomes ``step-N`` atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(step)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=self.root))
        try:
            write(tmp)
            return self.commit(tmp, step)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def shared_tmp(self, step: int) -> Path:
        """A temp folder name every rank of a collective save can compute (filled, then ``commit``)."""
        return self.root / f"{TMP_PREFIX}{step_name(step)}"

    def commit(self, tmp: Path, step: int) -> Path:
        """``tmp`` (a filled temp folder in ``root``) becomes ``step-N``; old ones rotate away."""
        final = self.path(step)
        if final.exists():  # a re-run of the same step: replace the older save
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._rotate()
        return final

    def clean_tmp(self) -> None:
        """Remove temp folders of saves that were killed."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(TMP_PREFIX):
                    shutil.rmtree(p, ignore_errors=True)

    def save_json(self, step: int, state: dict[str, Any], name: str = "state.json") -> Path:
        return self.save(step, lambda d: (d / name).write_text(json.dumps(state, sort_keys=True)))

    def load_json(self, step: int, name: str = "state.json") -> dict[str, Any]:
        path = self.path(step) / name
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: unreadable checkpoint state ({e})") from e

    def _rotate(self) -> None:
        if self.keep is None:
            return
        for step in self.steps()[: -self.keep]:
            shutil.rmtree(self.path(step), ignore_errors=True)
