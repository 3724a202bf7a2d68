"""SPEC §5 processed data: cond, clip_meta, cond_ext, ext_canvas and latents as sharded, resumable
torchrun jobs; and the tiny VAE that the tiny preset's latents are made with."""

from pathlib import Path

import dagster as dg

from gc25d_core.config import Gc25dConfig, to_yaml
from gc25d_core.index import read_index
from gc25d_core.job_record import finished_job
from gc25d_core.layout import Layout, Shapes, read_cond
from gc25d_core.preview import ids_strip_png
from gc25d_pipeline.defs.data.assets import clips_index, raw_source
from gc25d_pipeline.lib.clip_jobs import clip_job_asset
from gc25d_pipeline.lib.launcher import summary_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


def cond_preview(cfg: Gc25dConfig) -> bytes | None:
    """Five frames of the first clip's condition, colour-coded."""
    layout = Layout(Path(cfg.paths.data_root))
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)
    done = [r for r in rows if layout.cond(r.clip_id).is_file()]
    if not done:
        return None
    return ids_strip_png(read_cond(layout, done[0].clip_id, Shapes.of(cfg)))


@dg.asset(
    group_name="prep",
    deps=[clips_index, raw_source],
    kinds={"torch", "safetensors"},
    pool="cpu",
    retry_policy=dg.RetryPolicy(max_retries=1, delay=5),
)
def tiny_vae(
    context: dg.AssetExecutionContext, project: Gc25dProject, torchrun: TorchrunLauncher
) -> dg.MaterializeResult:
    """<data_root>/models/tiny_vae.safetensors (+ .json: SHA256, inputs key, reconstruction error):
    TinyWanVideoVAE38 fitted to the train split's frames (vae.fit), which the tiny preset's latents
    use. One process; a rerun with the same inputs keeps the file, and while the config, the clips
    index and the fit's files are as the job left them it launches nothing (the raw source is
    immutable, as for the clip jobs). Does nothing where vae.path is
    configured or the fit is off (the v10 preset reads the real Wan2.2 VAE)."""
    from gc25d_core.models.vae_fit import uses_fitted_vae  # torch + DiffSynth: not at definition load

    cfg = project.config()
    if not uses_fitted_vae(cfg):  # no process to start (and no multi-node rendezvous to join)
        why = "vae.path is set" if cfg.vae.path is not None else "vae.tiny / vae.fit.enabled is off"
        context.log.info(f"tiny VAE not used: {why}")
        return dg.MaterializeResult(metadata={"used": False, "reason": why})
    run_dir = project.run_dir(cfg, "tiny_vae", context)
    done = finished_job(run_dir, to_yaml(cfg))
    if done is not None:  # the config, the clips index and the fit's files as the job left them
        context.log.info(f"tiny VAE {done['path']} as fitted before (config, index, files unchanged)")
        return dg.MaterializeResult(
            metadata={**summary_metadata(done), "launched": False, "skipped": True},
            data_version=dg.DataVersion(done["sha256"]),
        )
    one = torchrun.model_copy(update={"nproc_per_node": 1, "nnodes": 1})
    return one.launch(context, "gc25d_core.jobs.tiny_vae", cfg, run_dir).get_materialize_result()


def latents_media(cfg: Gc25dConfig, run_dir: Path) -> dict | None:
    """The first clip decoded back beside its ids (gc25d_core.preprocess.latents.latents_preview)."""
    from gc25d_core.preprocess.latents import latents_preview

    return latents_preview(cfg, run_dir)


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
    [clips_index, raw_source, tiny_vae],
    "latents/<clip_id>.pt: Wan2.2 VAE bf16 [48,21,H/16,W/16] + prompts, actions_block, ids "
    "(tiny preset: the fitted tiny VAE of the tiny_vae asset); the preview is the first clip decoded "
    "back beside its ids",
    pool="gpu",
    media=latents_media,
)
ext_canvas = clip_job_asset(
    "ext_canvas",
    "gc25d_core.jobs.ext_canvas",
    [clips_index, cond, clip_meta, cond_ext],
    "cond_ext_canvas/<clip_id>.npz for rows whose look changes at s+81 (SPEC §8 stage 3): ground-plane "
    "canvas from frames 0..80 re-rendered per extension camera + code-drawn capsules, unseen = 255",
)
