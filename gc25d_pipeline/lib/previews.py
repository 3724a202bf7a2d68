"""Dagster metadata of the previews gc25d_core makes (videos, stills, plotted curves)."""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from gc25d_core.config import Gc25dConfig
from gc25d_pipeline.lib.clip_jobs import png_markdown, video_metadata

if TYPE_CHECKING:
    from gc25d_core.eval.report import ReportFiles


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


# The plot the eval asset shows first: the drift curve of the long rollouts where they ran.
MAIN_EVAL_PLOTS = ("chain241_latent_mse.png", "clip28_latent_mse.png")


def eval_metadata(
    files: ReportFiles,
    results: Sequence[dict[str, Any]],
    measured: str,
    exports: list[str],
    skipped: list[str],
) -> dict[str, dg.MetadataValue]:
    """The eval asset's metadata, in the order the asset page lists it: the comparison table (a table
    entry, which the UI draws inline), the main plot, what was measured (short enough to show
    inline), then the whole report with every plot and strip inline (one link instead of one per
    plot), and the files on the server last."""
    from gc25d_core.eval.report import TABLE_COLUMNS, table_rows

    headers = ["export", "step", "sampler", *(c[3] for c in TABLE_COLUMNS)]
    records = []
    for row in table_rows(results):  # the rows table.md and summary.json hold
        records.append(
            dg.TableRecord(
                {h: _rounded(row[h]) if h not in ("export", "sampler") else str(row[h]) for h in headers}
            )
        )
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(h, "string" if h in ("export", "sampler") else "int" if h == "step" else "float")
            for h in headers
        ]
    )
    out: dict[str, dg.MetadataValue] = {"table": dg.MetadataValue.table(records, schema)}
    main = next((n for n in MAIN_EVAL_PLOTS if n in files.plots), next(iter(files.plots), None))
    if main is not None:
        title = main.removesuffix(".png").replace("_", " ", 1).replace("_", " ")
        out["plot"] = dg.MetadataValue.md(f"**{title} per cell**\n\n{_png_link(files.plots[main], title)}")
    out["measured"] = dg.MetadataValue.md(measured)
    report = (files.folder / "report.md").read_text()
    for name, png in files.plots.items():  # report.md links its plots by file name: inline them
        report = report.replace(f"]({name})", f"]({_png_uri(png)})")
    out["report"] = dg.MetadataValue.md(report)
    out["exports"] = dg.MetadataValue.json(exports)
    out["not_evaluated"] = dg.MetadataValue.json(skipped)
    out["report_file"] = dg.MetadataValue.path(str(files.folder / "report.md"))
    out["json"] = dg.MetadataValue.json({label: str(path) for label, path in files.json_files.items()})
    return out


def _rounded(v: object) -> float | int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    return None


def _png_uri(png: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def _png_link(png: bytes, alt: str) -> str:
    return f"![{alt}]({_png_uri(png)})"
