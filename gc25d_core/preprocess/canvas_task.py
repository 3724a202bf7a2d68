"""SPEC §8 stage 3: the per-clip task that writes ``cond_ext_canvas/<clip_id>.npz``.

Inputs come from the processed layout, not the raw frames: ``cond/<clip_id>.npz`` (frames s..s+80),
``meta/<clip_id>.npz`` (F = 109: cameras and capsules of the clip and its extension) and the
``blocks`` / ``prompts`` members of ``cond_ext/<clip_id>.npz`` (read without decompressing its ids),
so the canvas file carries exactly the raw cond_ext's blocks and prompts. Where cond_ext is not
there yet, blocks and prompts are computed from the raw run's actions (the same functions the
cond_ext builder uses; no frames are read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gc25d_core.canvas import CanvasParams, build_ext_canvas
from gc25d_core.config import Gc25dConfig
from gc25d_core.index import ClipRow
from gc25d_core.layout import (
    Layout,
    Shapes,
    cond_ext_expected,
    npz_matches,
    read_cond,
    read_meta,
    write_cond_ext,
)
from gc25d_core.preprocess.clips import ext_block_prompts
from gc25d_core.preprocess.runner import ClipTask
from gc25d_core.preprocess.tasks import RunCache


def ext_text(
    lay: Layout, shapes: Shapes, row: ClipRow, runs: RunCache, cfg: Gc25dConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [7,5], prompts [7]) of a clip's extension: from its cond_ext file when that is
    complete, else from the raw run's actions."""
    path = lay.cond_ext(row.clip_id)
    if npz_matches(path, cond_ext_expected(shapes)):
        with np.load(path, allow_pickle=False) as z:  # members load lazily: ids stay compressed
            return z["blocks"], z["prompts"]
    return ext_block_prompts(runs(row), row.start, cfg)


def ext_canvas_task(cfg: Gc25dConfig, params: CanvasParams | None = None) -> ClipTask:
    """``cond_ext_canvas`` for a row with an extension (meant for rows with ``ext_look_change``)."""
    lay, shapes, runs = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), RunCache(Path(cfg.raw.root))
    params = params or CanvasParams()

    def build(row: ClipRow) -> int:
        if not row.has_ext:
            raise ValueError(f"clip {row.clip_id} has no extension (has_ext is false)")
        meta = read_meta(lay, row.clip_id, shapes, True)
        cond = read_cond(lay, row.clip_id, shapes)
        blocks, prompts = ext_text(lay, shapes, row, runs, cfg)
        arrays = build_ext_canvas(cond, meta, blocks, prompts, cfg.geometry, cfg.timeline, params)
        path = write_cond_ext(lay.cond_ext_canvas(row.clip_id), arrays, shapes)
        return path.stat().st_size

    return ClipTask(
        name="ext_canvas",
        outputs=lambda row: [lay.cond_ext_canvas(row.clip_id)],
        is_done=lambda row: npz_matches(lay.cond_ext_canvas(row.clip_id), cond_ext_expected(shapes)),
        build=build,
    )
