"""The per-clip tasks of the preprocessing jobs (what to build, where, and when a clip is done)."""

from __future__ import annotations

from pathlib import Path

from gc25d_core.config import Gc25dConfig
from gc25d_core.index import ClipRow
from gc25d_core.layout import (
    Layout,
    Shapes,
    cond_expected,
    cond_ext_expected,
    meta_expected,
    npz_matches,
    write_cond,
    write_cond_ext,
    write_meta,
)
from gc25d_core.preprocess.clips import build_cond, build_cond_ext, build_meta
from gc25d_core.preprocess.runner import ClipTask
from gc25d_core.raw_layout import RawSource, RunDir


class RunCache:
    """RunDir objects per (subset, scene, run), so frames.jsonl and actions load once per run."""

    def __init__(self, raw_root: Path):
        self.raw = RawSource(raw_root)
        self._runs: dict[tuple[str, str, str], RunDir] = {}

    def __call__(self, row: ClipRow) -> RunDir:
        key = (row.subset, row.scene, row.run)
        if key not in self._runs:
            self._runs[key] = self.raw.run(*key)
        return self._runs[key]


def _size(path: Path) -> int:
    return path.stat().st_size


def cond_task(cfg: Gc25dConfig) -> ClipTask:
    lay, shapes, runs = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), RunCache(Path(cfg.raw.root))

    def build(row: ClipRow) -> int:
        return _size(write_cond(lay, row.clip_id, build_cond(runs(row), row.start, cfg), shapes))

    return ClipTask(
        name="cond",
        outputs=lambda row: [lay.cond(row.clip_id)],
        is_done=lambda row: npz_matches(lay.cond(row.clip_id), cond_expected(shapes)),
        build=build,
    )


def cond_ext_task(cfg: Gc25dConfig) -> ClipTask:
    lay, shapes, runs = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), RunCache(Path(cfg.raw.root))

    def build(row: ClipRow) -> int:
        path = lay.cond_ext(row.clip_id)
        return _size(write_cond_ext(path, build_cond_ext(runs(row), row.start, cfg), shapes))

    return ClipTask(
        name="cond_ext",
        outputs=lambda row: [lay.cond_ext(row.clip_id)],
        is_done=lambda row: npz_matches(lay.cond_ext(row.clip_id), cond_ext_expected(shapes)),
        build=build,
    )


def meta_task(cfg: Gc25dConfig) -> ClipTask:
    lay, shapes, runs = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), RunCache(Path(cfg.raw.root))

    def build(row: ClipRow) -> int:
        arrays = build_meta(runs(row), row.start, row.has_ext, cfg)
        return _size(write_meta(lay, row.clip_id, arrays, shapes, row.has_ext))

    return ClipTask(
        name="meta",
        outputs=lambda row: [lay.meta(row.clip_id)],
        is_done=lambda row: npz_matches(lay.meta(row.clip_id), meta_expected(shapes, row.has_ext)),
        build=build,
    )


def latents_task(cfg: Gc25dConfig) -> ClipTask:
    import torch

    from gc25d_core.distributed import barrier, global_rank, local_rank
    from gc25d_core.preprocess.latents import drop_latents_of_another_vae, latents_done, run_latents

    lay, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    if global_rank() == 0:  # before any rank decides which clips are done
        drop_latents_of_another_vae(cfg, lay)
    barrier()
    from gc25d_core.models.vae_fit import resolve_vae_file

    device = torch.device("cuda", local_rank()) if cfg.device == "cuda" else torch.device("cpu")
    vae = resolve_vae_file(cfg)  # None: the seeded random tiny VAE (its weights are the config's)
    return ClipTask(
        name="latents",
        outputs=lambda row: [lay.latents(row.clip_id)],
        is_done=lambda row: latents_done(lay, shapes, row),
        build_many=lambda rows, on_clip, on_error: run_latents(cfg, rows, device, on_clip, on_error),
        inputs=() if vae is None else (vae[0],),
    )
