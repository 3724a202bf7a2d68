"""The evaluation's files, each written atomically (gc25d_core.atomic) into the eval run folder:

    <out>/<label>/metrics.json       one export: sampler, config, per-sweep curves, regions, cases
    <out>/<label>/<sweep>_strip.png  ground truth | generated | ids at a few cells of the first case
    <out>/<sweep>_<metric>.png       the per-cell curves of every export on one plot (the drift curve)
    <out>/<label>/live240_drift.png  a live sweep's drift curve: PSNR vs truth per second, own / other ids
    <out>/live240_psnr.png           every export's live PSNR per segment
    <out>/table.md  summary.json     the comparison across exports (table.md: then each live sweep's table)
    <out>/report.md                  the table, the plots, what the numbers mean

JSON holds no NaN or inf: a missing value (no ground truth there) is null; PSNR is capped
(gc25d_core.eval.metrics).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from gc25d_core.atomic import atomic_write_bytes, atomic_write_text
from gc25d_core.eval.metrics import json_safe
from gc25d_core.names import path_under
from gc25d_core.numerics import numerics_line
from gc25d_core.plots import line_plot_png
from gc25d_core.preview import png_bytes

# (sweep, region, key, header): the comparison table's columns
TABLE_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("clip28", "1_20", "latent_mse", "clip28 latent MSE 1–20"),
    ("clip28", "22_27", "latent_mse", "clip28 latent MSE 22–27"),
    ("clip28", "1_20", "psnr", "clip28 PSNR 1–20"),
    ("clip28", "all", "delta_psnr", "clip28 ΔtPSNR"),
    ("clip28", "all", "flicker_ratio", "clip28 flicker"),
    ("clip28", "21_24", "latent_rms_ratio", "clip28 RMS ratio 21–24"),
    ("chain241", "1_20", "latent_mse", "chain241 latent MSE 1–20"),
    ("chain241", "21_60", "latent_mse", "chain241 latent MSE 21–60"),
    ("chain241", "21_60", "psnr", "chain241 PSNR 21–60"),
    ("chain241", "all", "delta_psnr", "chain241 ΔtPSNR"),
    ("chain241", "all", "flicker_ratio", "chain241 flicker"),
)
PLOTTED = (
    ("latent_mse", "latent MSE", True),
    ("psnr", "PSNR (dB)", False),
    ("delta_psnr", "ΔtPSNR (dB)", False),
)


def dumps(obj: Any) -> str:
    return json.dumps(json_safe(obj), indent=1, sort_keys=True, allow_nan=False)


def strip_png(rollout: dict[str, Any], num: int = 6, max_width: int = 1400) -> bytes | None:
    """Rows ground truth (black: none) | generated | ids at ``num`` evenly spaced cells' last frames."""
    from gc25d_core.eval.metrics import cell_frames
    from gc25d_core.preview import colorize_ids

    frames, gt = rollout.get("frames"), rollout.get("gt_frames")
    if frames is None or gt is None:
        return None
    case = rollout["case"]
    cells = np.linspace(0, case.num_cells - 1, num).round().astype(int)
    picks = [cell_frames(int(c)).stop - 1 for c in cells]
    h, w = frames.shape[1:3]

    def row(images: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(
            [cv2.resize(im, (w, h), interpolation=cv2.INTER_NEAREST) for im in images], axis=1
        )

    ids = case.ids.numpy()
    sheet = np.concatenate(
        [
            row([gt[f] for f in picks]),
            row([frames[f] for f in picks]),
            row([colorize_ids(ids[f]) for f in picks]),
        ],
        axis=0,
    )
    if sheet.shape[1] > max_width:
        s = max_width / sheet.shape[1]
        sheet = cv2.resize(sheet, (max_width, max(1, int(sheet.shape[0] * s))), interpolation=cv2.INTER_AREA)
    return png_bytes(sheet)


def strips_of(result: dict[str, Any]) -> dict[str, bytes | None]:
    """Per sweep, the strip PNG of a result: made already (``strips``, by an eval job that kept
    it across ranks and retries) or from the rollouts it kept."""
    if "strips" in result:
        return dict(result["strips"])
    return {sweep: strip_png(roll) for sweep, roll in result.get("rollouts", {}).items()}


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:.4g}"


def table_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "export": r["export"]["label"],
            "step": r["export"]["step"],
            "sampler": r["sampler"]["kind"],
        }
        for sweep, region, key, header in TABLE_COLUMNS:
            row[header] = r["sweeps"].get(sweep, {}).get("regions", {}).get(region, {}).get(key)
        rows.append(row)
    return rows


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["export", "step", "sampler", *(c[3] for c in TABLE_COLUMNS)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [str(row["export"]), str(row["step"]), str(row["sampler"])]
        cells += [_fmt(row[c[3]]) for c in TABLE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


REPORT_NOTES = """\
## What the numbers are

- **latent MSE** per cell against the ground-truth latents (cells 0..20 of the anchor clip; in
  chain241 and, for raw extensions, clip28 also later clips' cells 1..20 at the matching frames).
  Cells without ground truth are blank. Regions: 1–20 the trained length, beyond it the drift.
- **PSNR** (dB) of the decoded 8-bit frames against the decode of the ground-truth latents (so the
  VAE's own reconstruction error is left out), capped at {cap:g} dB (an exact match).
- **ΔtPSNR**: PSNR with the clip's own ids and prompts minus PSNR with another clip's (same anchor,
  same noise); > 0 means the rollout follows its condition.
- **flicker**: mean |frame difference| across cell boundaries / within cells (1 = no seam).
- **RMS ratio**: a generated cell's latent RMS over the ground truth's (where no ground truth
  exists: < 1 fades, > 1 blows up).
- FVD, LPIPS and VBench's learned scores need downloaded networks and are not computed.
"""


LIVE_NOTES = """\
## The live sessions

A seeded action script (walk, turn, run, fight the boss, walk back to places seen earlier, idle)
played by each causal export through the deploy session code, the code world making each cell's
ids; the truth is the same script through the code world's RGB renderer.

- **PSNR / SSIM** per segment: the decoded frames against the truth (8-bit; SSIM with the 11×11
  Gaussian window). **latent MSE**: the session's latents against the VAE's encode of the truth.
- **drift**: least-squares slope of the segments' PSNR, dB per minute (< 0: the picture drifts away).
- **ΔtPSNR**: PSNR against this session's truth minus that of another script's session (same anchor,
  same noise): > 0 means the frames follow the ids they are given.
- **action**: one action changed at a cell; *before* = cells before it whose latents differ (0 for a
  causal model), *sensitivity* = how much the frames after it change over how much the truth's do,
  *follows* = dB nearer the changed truth than the unchanged one.
- **revisit**: PSNR at cells whose camera returns to a view of ≥ 10 s before, minus the PSNR at
  that first visit (0: remembered as well as first drawn).
- **flicker**: boundary / within-cell frame differences (the truth's own beside it).
- **the truth through the VAE** (where measured, `live_ceiling`): the truth encoded and decoded as
  the sessions' frames are, scored the same way: what a model with perfect latents would show. A
  segment where it falls too is harder for the VAE to draw, not a model's drift.
"""

CEILING_LABEL = "the truth through the VAE"


def live_table(results: Sequence[dict[str, Any]], sweep: str) -> str:
    """Per export: PSNR per segment, the drift slope, ΔtPSNR (its lowest segment), SSIM, the probe."""
    rows = [r for r in results if sweep in r["sweeps"]]
    if not rows:
        return ""
    segs = rows[0]["sweeps"][sweep]["segments"]
    heads = [f"PSNR {s['t0_s']:g}–{s['t1_s']:g} s" for s in segs]
    headers = ["export", "step", *heads, "drift dB/min", "ΔtPSNR", "ΔtPSNR min", "SSIM", "latent MSE"]
    headers += ["action before", "sensitivity", "follows dB", "revisit dB", "flicker"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        x = r["sweeps"][sweep]
        sg = x["segments"]

        def mean(key: str, sg: list[dict[str, Any]] = sg) -> float:
            vals = [s[key] for s in sg if isinstance(s[key], int | float) and math.isfinite(s[key])]
            return sum(vals) / len(vals) if vals else math.nan

        a = x["action"]
        cells = [str(r["export"]["label"]), str(r["export"]["step"])]
        cells += [_fmt(s["psnr"]) for s in sg]
        cells += [_fmt(x["drift_slope_db_per_min"]), _fmt(mean("delta_psnr")), _fmt(x["delta_psnr_min"])]
        cells += [_fmt(mean("ssim")), _fmt(mean("latent_mse")), str(a["cells_before_that_differ"])]
        cells += [_fmt(a["sensitivity"]), _fmt(a["follows_change_db"]), _fmt(x["revisit"]["consistency_db"])]
        cells += [_fmt(mean("flicker_ratio"))]
        lines.append("| " + " | ".join(cells) + " |")
    # one truth and one VAE for every export: the first row's ceiling is every row's
    ceiling = next(
        (r["sweeps"][sweep] for r in rows if "ceiling_drift_slope_db_per_min" in r["sweeps"][sweep]), None
    )
    if ceiling is not None:
        cells = [CEILING_LABEL, "–", *(_fmt(s["psnr_ceiling"]) for s in ceiling["segments"])]
        cells += [_fmt(ceiling["ceiling_drift_slope_db_per_min"])] + ["–"] * (len(headers) - len(segs) - 3)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def live_plots(results: Sequence[dict[str, Any]], sweep: str) -> dict[str, bytes]:
    """The drift curve of each export (PSNR vs truth per second: own ids and another session's),
    and every export's segments on one plot."""
    out: dict[str, bytes] = {}
    per_seg: dict[str, list[float | None]] = {}
    xs: dict[str, list[float]] = {}
    ceiling: tuple[list[float | None], list[float]] | None = None  # one truth, one VAE: any row's
    for r in results:
        if sweep not in r["sweeps"]:
            continue
        label, x = r["export"]["label"], r["sweeps"][sweep]
        curves = x["curves"]
        secs = [c / 4 for c in range(len(curves["psnr"]))]
        names = {"own ids": "psnr", "other ids": "psnr_other", CEILING_LABEL: "psnr_ceiling"}
        smooth = {name: _smooth(curves[k], 4) for name, k in names.items() if k in curves}
        out[f"{label}/{sweep}_drift.png"] = line_plot_png(
            smooth,
            f"{label} {sweep}: PSNR vs truth (1 s mean), drift {_fmt(x['drift_slope_db_per_min'])} dB/min",
            "PSNR (dB)",
            x={name: secs for name in smooth},
            xlabel="s",
        )
        per_seg[label] = [s["psnr"] for s in x["segments"]]
        xs[label] = [(s["t0_s"] + s["t1_s"]) / 2 for s in x["segments"]]
        if "psnr_ceiling" in x["segments"][0]:
            ceiling = ([s["psnr_ceiling"] for s in x["segments"]], xs[label])
    if per_seg and ceiling is not None:
        per_seg[CEILING_LABEL], xs[CEILING_LABEL] = ceiling
    if per_seg:
        out[f"{sweep}_psnr.png"] = line_plot_png(
            per_seg, f"{sweep}: PSNR vs truth per segment", "PSNR (dB)", x=xs, xlabel="s"
        )
    return out


def _smooth(values: Sequence[float | None], k: int) -> list[float | None]:
    """Trailing mean over ``k`` values (cell 0 alone)."""
    out: list[float | None] = []
    for i in range(len(values)):
        vals = [v for v in values[max(1, i - k + 1) : i + 1] if v is not None and math.isfinite(v)]
        out.append(sum(vals) / len(vals) if vals and i > 0 else None)
    return out


def _strip_lines(
    results: Sequence[dict[str, Any]], sweep: str, plots: dict[str, bytes], rows: str
) -> list[str]:
    """report.md's lines of each export's strip on ``sweep`` (those written)."""
    out = []
    for r in results:
        strip = f"{r['export']['label']}/{sweep}_strip.png"
        if strip in plots:
            out += [f"{r['export']['label']}: {rows}", "", f"![strip]({strip})", ""]
    return out


@dataclass
class ReportFiles:
    folder: Path
    table: str
    json_files: dict[str, Path] = field(default_factory=dict)
    plots: dict[str, bytes] = field(default_factory=dict)  # name -> PNG bytes (also on disk)


def numerics_note(results: Sequence[dict[str, Any]]) -> str:
    """The numerics the rows' digits came from (gc25d_core.numerics): one line where they agree, else
    one line per record naming its rows (export/sweep), so a table that mixes rows kept from another
    box, or from before rows recorded it, says which ones. Empty without rows."""
    rows_of: dict[str, list[str]] = {}
    for r in results:
        for sweep, record in (r.get("numerics") or {}).items():
            line = numerics_line(record) if record else "numerics: not recorded"
            rows_of.setdefault(line, []).append(f"{r['export']['label']}/{sweep}")
    if len(rows_of) <= 1:
        return next(iter(rows_of), "")
    return "rows computed under other numerics:\n" + "\n".join(
        f"- {line.removeprefix('numerics: ')}: {', '.join(rows)}" for line, rows in rows_of.items()
    )


def write_reports(out_dir: Path, results: Sequence[dict[str, Any]], cap_db: float = 100.0) -> ReportFiles:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = table_rows(results)
    has_clips = any(s in r["sweeps"] for r in results for s in ("clip28", "chain241"))
    table = table_markdown(rows) if has_clips or not results else ""
    numerics = numerics_note(results)
    table = f"{numerics}\n\n{table}" if numerics and table else table or numerics
    files = ReportFiles(out_dir, table)
    md = ["# Evaluation", "", table, ""]
    for r in results:
        label = r["export"]["label"]
        folder = path_under(out_dir, label, "export label")
        folder.mkdir(parents=True, exist_ok=True)
        doc = {k: v for k, v in r.items() if k not in ("rollouts", "strips")}
        files.json_files[label] = atomic_write_text(folder / "metrics.json", dumps(doc))
        for sweep, png in strips_of(r).items():
            if png is not None:
                name = f"{label}/{sweep}_strip.png"
                atomic_write_bytes(out_dir / name, png)
                files.plots[name] = png
    live = sorted({s for r in results for s in r["sweeps"] if s.startswith("live")})
    for sweep in live:
        lt = live_table(results, sweep)
        table += f"\n{sweep}: live sessions against the code world's truth\n\n{lt}"
        md += [f"## {sweep}: live sessions against the code world's truth", "", lt, ""]
        for name, png in live_plots(results, sweep).items():
            atomic_write_bytes(out_dir / name, png)
            files.plots[name] = png
            md += [f"![{name}]({name})", ""]
        md += _strip_lines(results, sweep, files.plots, "truth | generated | ids")
    files.table = table
    sweeps = sorted({s for r in results for s in r["sweeps"] if not s.startswith("live")})
    for sweep in sweeps:
        md += [f"## {sweep}", ""]
        for key, ylabel, log_y in PLOTTED:
            series = {
                r["export"]["label"]: r["sweeps"][sweep]["curves"][key]
                for r in results
                if key in r["sweeps"].get(sweep, {}).get("curves", {})
            }
            if not series:
                continue
            name = f"{sweep}_{key}.png"
            png = line_plot_png(series, f"{sweep}: {ylabel} per cell", ylabel, log_y=log_y)
            atomic_write_bytes(out_dir / name, png)
            files.plots[name] = png
            md += [f"![{sweep} {key}]({name})", ""]
        md += _strip_lines(results, sweep, files.plots, "ground truth | generated | ids")
    md.append(REPORT_NOTES.format(cap=cap_db))
    if live:
        md.append(LIVE_NOTES)
    atomic_write_text(out_dir / "table.md", table)
    summary = {"rows": rows, "exports": [{**r["export"], "sampler": r["sampler"]} for r in results]}
    atomic_write_text(out_dir / "summary.json", dumps(summary))
    atomic_write_text(out_dir / "report.md", "\n".join(md))
    return files
