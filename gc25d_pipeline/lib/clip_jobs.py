"""Factory of per-clip preprocessing assets: each launches one sharded torchrun job of gc25d_core."""

import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from gc25d_core.config import Gc25dConfig, to_yaml
from gc25d_core.job_record import finished_job
from gc25d_pipeline.lib.launcher import JobLauncher, summary_metadata
from gc25d_pipeline.lib.project import Gc25dProject


class ClipJobConfig(dg.Config):
    nproc_per_node: int = Field(
        default=0, ge=0, description="ranks of this job's torchrun; 0: the launcher's (torchrun resource)"
    )
    limit: int = Field(
        default=0, ge=0, description="only the first N clips by clip_id (smoke runs); 0: every clip"
    )


PreviewFn = Callable[[Gc25dConfig], bytes | None]
# (config, the asset's run folder) -> {"video": Path, "png": bytes, ...} or None
MediaFn = Callable[[Gc25dConfig, Path], dict[str, Any] | None]


def png_markdown(png: bytes, alt: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


def video_metadata(media: dict[str, Any], key: str, alt: str) -> dict[str, dg.MetadataValue]:
    """A preview video where a user looks: its path (the MP4 opens in a browser), the same frames as
    an animated GIF inline (the UI's markdown shows images but drops ``<video>`` tags), and a still
    of 5 frames."""
    from gc25d_core.preview import animated_gif

    out: dict[str, dg.MetadataValue] = {}
    video = media.get("video")
    if video is not None:
        video = Path(video)
        out[f"{key}_video"] = dg.MetadataValue.path(str(video.resolve()))
        if (gif := animated_gif(video)) is not None:
            b64 = base64.b64encode(gif).decode()
            out[f"{key}_player"] = dg.MetadataValue.md(f"![{alt}](data:image/gif;base64,{b64})")
    if media.get("png") is not None:
        out[f"{key}_frames"] = png_markdown(media["png"], alt)
    return out


def clip_job_asset(
    name: str,
    module: str,
    deps: Sequence[dg.AssetsDefinition | str],
    description: str,
    pool: str = "cpu",
    preview: PreviewFn | None = None,
    media: MediaFn | None = None,
) -> dg.AssetsDefinition:
    @dg.asset(
        name=name,
        group_name="prep",
        deps=list(deps),
        kinds={"torch"},
        pool=pool,
        description=description,
        retry_policy=dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL),
    )
    def _asset(
        context: dg.AssetExecutionContext,
        config: ClipJobConfig,
        project: Gc25dProject,
        torchrun: JobLauncher,
    ) -> dg.MaterializeResult:
        cfg = project.config()
        launcher = (
            torchrun.model_copy(update={"nproc_per_node": config.nproc_per_node})
            if config.nproc_per_node
            else torchrun
        )
        args = ["--limit", str(config.limit)] if config.limit else []
        run_dir = project.run_dir(cfg, name, context)
        done = None if args else finished_job(run_dir, to_yaml(cfg))
        if done is not None:  # every clip's files as the last full run left them: no launch
            context.log.info(
                f"{name}: {done['num_clips']} clips as built before (index, inputs, files unchanged)"
            )
            mat = dg.MaterializeResult(metadata={"launched": False, **summary_metadata(done)})
        else:
            mat = launcher.launch(context, module, cfg, run_dir, args).get_materialize_result()
        metadata = dict(mat.metadata or {})
        if preview is not None and (png := preview(cfg)) is not None:
            metadata["preview"] = png_markdown(png, name)
        if media is not None and (made := media(cfg, run_dir)) is not None:
            metadata.update(video_metadata(made, "preview", name))
        return dg.MaterializeResult(metadata=metadata, data_version=mat.data_version)

    return _asset
