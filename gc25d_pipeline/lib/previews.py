"""Dagster metadata of the previews gc25d_core makes (videos, stills, plotted curves)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from gc25d_core.config import Gc25dConfig
from gc25d_pipeline.lib.clip_jobs import png_markdown, video_metadata


def sft_preview_metadata(
    run_dir: Path, cfg: Gc25dConfig, log: dg.DagsterLogManager | None = None
) -> dict[str, dg.MetadataValue]:
    """The ``sft`` asset's previews (gc25d_core.train.previews.sft_preview): the validation curves
    as a plotted PNG, a table of cond / uncond gaps at the last validation, and a validation sample
    as a video (ground truth | prediction at t=500 | ids). A preview that fails is logged and left
    out: it must never fail the training asset it decorates."""
    from gc25d_core.train.previews import sft_preview

    try:
        made = sft_preview(run_dir, cfg)
    except Exception as e:  # a preview is decoration, the run's result stands without it
        if log is not None:
            log.warning(f"SFT preview of {run_dir} failed: {type(e).__name__}: {e}")
        return {}
    out: dict[str, dg.MetadataValue] = {}
    if "curves_png" in made:
        out["val_curves"] = png_markdown(made["curves_png"], "SFT validation curves")
    if made.get("gaps"):
        last = made["gaps"][-1]
        lines = ["| t | cond | uncond | null text | cond below uncond |", "|---|---|---|---|---|"]
        for t in (200, 500, 800):
            if (g := last.get(f"t{t}")) is not None:
                lines.append(
                    f"| {t} | {g['cond']:.4f} | {g['uncond']:.4f} | {g['null_text']:.4f} | "
                    f"{100 * g['cond_below_uncond']:.1f} % |"
                )
        out["val_gap"] = dg.MetadataValue.md(f"Last validation, step {last['step']}\n\n" + "\n".join(lines))
    if "sample_video" in made:
        out.update(
            video_metadata(
                {"video": made["sample_video"], "png": made.get("sample_png")}, "val_sample", "sample"
            )
        )
        out["val_sample_step"] = dg.MetadataValue.int(int(made["sample_step"]))
        out["val_sample_clip"] = dg.MetadataValue.text(str(made["sample_clip"]))
    return out
