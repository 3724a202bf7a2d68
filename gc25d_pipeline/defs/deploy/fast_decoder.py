"""The fast decoder deploy can take (``--decoder fast``): distilled from the configured VAE's decoder on
the latents the training cache packs (gc25d_core.jobs.fast_decoder)."""

import dagster as dg

from gc25d_pipeline.defs.cache.assets import training_cache
from gc25d_pipeline.defs.data.assets import raw_source
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


@dg.asset(
    group_name="deploy",
    deps=[training_cache, raw_source],
    kinds={"torch", "safetensors"},
    pool="cpu",
    retry_policy=dg.RetryPolicy(max_retries=1, delay=5),
)
def fast_decoder(
    context: dg.AssetExecutionContext, project: Gc25dProject, torchrun: TorchrunLauncher
) -> dg.MaterializeResult:
    """<data_root>/models/fast_decoder.safetensors (+ .json: SHA256, inputs key, held-out PSNR against
    the VAE decoder and against the frames, ms per cell): a small causal decoder (latent cell -> its
    4 frames) distilled from the VAE's decoder on the processed latents, the raw frames as the
    second reference (gc25d_core.models.fast_decoder). One process; a rerun with the same inputs
    keeps the file, a killed one resumes. Off unless fast_decoder.enabled (the VAE stays deploy's
    decoder)."""
    cfg = project.config()
    if not cfg.fast_decoder.enabled:  # no process to start
        context.log.info("fast decoder not fitted: fast_decoder.enabled is off")
        return dg.MaterializeResult(metadata={"used": False, "reason": "fast_decoder.enabled is off"})
    one = torchrun.model_copy(update={"nproc_per_node": 1, "nnodes": 1})
    run_dir = project.run_dir(cfg, "fast_decoder", context)
    result = one.launch(context, "gc25d_core.jobs.fast_decoder", cfg, run_dir)
    return result.get_materialize_result()
