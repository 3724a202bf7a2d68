"""The mini world: one code-world v10 run (R10_s1512 of the full preset: 81 + 28 frames, a look
change at frame 81) at the tiny geometry, indexed, with cond, meta and cond_ext built.

Tests get it from the session fixture ``mini_world`` (tests/conftest.py), built once per session.
About 10 s on one core, a tenth of the whole tiny preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gc25d_core.atomic import atomic_write_text
from gc25d_core.codeworld import TINY_GEOMETRY, get_preset
from gc25d_core.codeworld.writer import clips_index, write_run
from gc25d_core.config import Gc25dConfig, load_config
from gc25d_core.index import ClipRow, build_and_write, read_index
from gc25d_core.layout import Layout
from gc25d_core.preprocess.tasks import cond_ext_task, cond_task, meta_task

RUN = "R10_s1512"


@dataclass(frozen=True)
class MiniWorld:
    cfg: Gc25dConfig
    layout: Layout
    row: ClipRow


def build_mini_world(root: Path) -> MiniWorld:
    spec = next(s for s in get_preset("full").runs(0) if s.run == RUN)
    write_run(root / "raw", spec, TINY_GEOMETRY)
    atomic_write_text(root / "raw" / "index" / "clips_81.json", clips_index([spec]).model_dump_json(indent=1))
    cfg = load_config(
        "tiny",
        {
            "paths": {"data_root": str(root / "data"), "runs_root": str(root / "runs")},
            "raw": {"root": str(root / "raw")},
            "index": {"val_runs": [RUN]},
        },
    )
    build_and_write(root / "raw", cfg)
    (row,) = read_index(Layout(root / "data"))
    for factory in (cond_task, meta_task, cond_ext_task):
        factory(cfg).build(row)
    return MiniWorld(cfg, Layout(root / "data"), row)
