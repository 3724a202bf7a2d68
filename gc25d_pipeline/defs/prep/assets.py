"""SPEC §5 processed data: cond, clip_meta, cond_ext, ext_canvas and latents as sharded, resumable torchrun jobs."""

from pathlib import Path

from gc25d_core.config import Gc25dConfig
from gc25d_core.index import read_index
from gc25d_core.layout import Layout, Shapes, read_cond
from gc25d_core.preview import ids_strip_png
from gc25d_pipeline.defs.data.assets import clips_index, raw_source
from gc25d_pipeline.lib.clip_jobs import clip_job_asset


def cond_preview(cfg: Gc25dConfig) -> bytes | None:
    """Five frames of the first clip's condition, colour-coded."""
    layout = Layout(Path(cfg.paths.data_root))
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)
    done = [r for r in rows if layout.cond(r.clip_id).is_file()]
    if not done:
        return None
    return ids_strip_png(read_cond(layout, done[0].clip_id, Shapes.of(cfg)))


cond = clip_job_asset(
    "cond",
    "gc25d_core.jobs.cond",
    [clips_index, raw_source],
    "cond/<clip_id>.npz: parts-vocab ids uint8 [81,H,W] (resample_ids → label_parts)",
    preview=cond_preview,
)
# "meta" is reserved in Dagster; the asset is clip_meta, its files are meta/<clip_id>.npz
clip_meta = clip_job_asset(
    "clip_meta",
    "gc25d_core.jobs.meta",
    [clips_index, raw_source],
    "meta/<clip_id>.npz: cameras, capsules, actor state per frame (F = 81, +28 with has_ext)",
)
cond_ext = clip_job_asset(
    "cond_ext",
    "gc25d_core.jobs.cond_ext",
    [clips_index, raw_source],
    "cond_ext/<clip_id>.npz for has_ext clips: ids [28,H,W], blocks [7,5], 7 prompts",
)
latents = clip_job_asset(
    "latents",
    "gc25d_core.jobs.latents",
    [clips_index, raw_source],
    "latents/<clip_id>.pt: Wan2.2 VAE bf16 [48,21,H/16,W/16] + prompts, actions_block, ids",
    pool="gpu",
)
ext_canvas = clip_job_asset(
    "ext_canvas",
    "gc25d_core.jobs.ext_canvas",
    [clips_index, cond, clip_meta, cond_ext],
    "cond_ext_canvas/<clip_id>.npz for rows whose look changes at s+81 (SPEC §8 stage 3): ground-plane "
    "canvas from frames 0..80 re-rendered per extension camera + code-drawn capsules, unseen = 255",
)
