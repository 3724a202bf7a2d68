"""A tiny world for the evaluation: gc25d_core/train/synthetic.py's clips at starts 0, 96, 192 per
run, the val run's clips with an extension (cond_ext: ids of frames s+81..s+108, 7 prompts), packed
into a published snapshot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gc25d_core.cache.from_layout import pack_and_publish
from gc25d_core.config import Gc25dConfig, load_config
from gc25d_core.index import read_index, write_index
from gc25d_core.layout import Layout, Shapes, write_cond_ext, write_meta
from gc25d_core.text import block_to_prompt, text_data
from gc25d_core.timeline import cell_blocks
from tests.train.world import VAL_RUN, _ids, _meta, write_clips

EVAL_STARTS = (0, 96, 192)


def eval_world(root: Path, starts: tuple[int, ...] = EVAL_STARTS) -> Gc25dConfig:
    cfg = load_config(
        "tiny",
        {
            # the runs root is ``root``: hand-offs made under it (random_teacher) name exports inside it
            "paths": {"data_root": str(root / "data"), "runs_root": str(root)},
            "raw": {"root": str(root / "raw")},
            "index": {"val_runs": [VAL_RUN]},
            "cache": {"store": str(root / "cache"), "samples_per_shard": len(starts)},
        },
    )
    write_clips(cfg, starts, latents="from_ids")
    layout, shapes = Layout(cfg.paths.data_root), Shapes.of(cfg)
    data = text_data(cfg.text)
    rows = read_index(layout)
    runs = {r.run: r.split for r in rows}
    out = []
    for i, row in enumerate(rows):
        if row.run == VAL_RUN:
            rng = np.random.default_rng(100 + i)
            ids = _ids(shapes, rng)[: shapes.timeline.num_ext_frames]
            blocks = np.zeros((shapes.timeline.num_ext_cells, 5), np.uint8)
            blocks[:, 0] = rng.integers(0, 9, len(blocks))
            prompts = [block_to_prompt(b, data) for b in cell_blocks(blocks)[1:]]
            write_cond_ext(
                layout.cond_ext(row.clip_id), {"ids": ids, "blocks": blocks, "prompts": prompts}, shapes
            )
            base = _meta(cfg, shapes, row.start)
            ext = {k: np.concatenate([v, v[-shapes.timeline.num_ext_frames :]]) for k, v in base.items()}
            write_meta(layout, row.clip_id, ext, shapes, True)
            row = row.model_copy(update={"has_ext": True})
        out.append(row)
    write_index(layout, out, runs)
    pack_and_publish(cfg)
    return cfg


def with_random_vae(cfg: Gc25dConfig) -> Gc25dConfig:
    """``cfg`` decoding with the seeded random tiny VAE (the tiny preset's fitted one is the tiny_vae
    asset's, which these worlds do not materialize)."""
    fit = cfg.vae.fit.model_copy(update={"enabled": False})
    return cfg.model_copy(update={"vae": cfg.vae.model_copy(update={"fit": fit})})
