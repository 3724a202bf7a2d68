"""Scores of the live sessions (gc25d_core.eval.live) against the code world's truth.

A rollout is scored on the rank that played it (``score_rollout``: per-frame numbers, small), and
rank 0 puts an export's three rollouts together (``assemble_live``): per segment PSNR / SSIM vs
truth, latent MSE vs the VAE's encode of the truth, ΔtPSNR, boundary flicker (and the truth's own);
the drift slope (dB per minute, least squares over the segments); the action-sensitivity probe;
revisit consistency.

Per-frame metrics from elsewhere join through ``FRAME_METRICS``: a factory ``cfg -> metric or
None`` (None: not available for this preset, e.g. nothing fitted yet) whose metric maps the own
rollout's (generated frames uint8 [F, h, w, 3], truth frames, conditioning ids uint8 [F, h, w]) to
one value per frame; each segment reports its mean under ``frame_metrics[name]``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.eval import metrics as M
from gc25d_core.eval.live import CELLS_PER_SECOND, LiveSweep, Played, Truth

FrameMetric = Callable[[np.ndarray, np.ndarray, np.ndarray], Sequence[float]]
FRAME_METRICS: dict[str, Callable[[Gc25dConfig], FrameMetric | None]] = {}
REVISIT_CM, REVISIT_YAW = 150.0, 0.35  # camera within 1.5 m and 20° of where it was


def register_frame_metric(name: str, factory: Callable[[Gc25dConfig], FrameMetric | None]) -> None:
    FRAME_METRICS[name] = factory


def digests(items: np.ndarray) -> list[str]:
    """One short SHA256 per item along the first axis."""
    return [hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16] for x in items]


def _frames_of(cells: range) -> slice:
    return slice(M.cell_frames(cells.start).start, M.cell_frames(cells.stop - 1).stop)


def revisits(truth: Truth, gap: int) -> list[tuple[int, int]]:
    """(cell, the earlier cell ≥ ``gap`` before it whose view it returns to): the camera within
    ``REVISIT_CM`` and ``REVISIT_YAW`` of it (the nearest such earlier cell)."""
    out = []
    for c in range(1 + gap, len(truth.eye)):
        d = np.linalg.norm(truth.eye[1 : c - gap + 1, :2] - truth.eye[c, :2], axis=1)
        dyaw = np.abs(np.angle(np.exp(1j * (truth.yaw[1 : c - gap + 1] - truth.yaw[c]))))
        ok = (d < REVISIT_CM) & (dyaw < REVISIT_YAW)
        if ok.any():
            out.append((c, 1 + int(np.argmin(np.where(ok, d, np.inf)))))
    return out


def score_rollout(
    sweep: LiveSweep,
    kind: str,
    played: Played,
    truth: Truth,
    *,
    truth_latent: torch.Tensor | None = None,
    changed_truth: np.ndarray | None = None,
    cap: float = M.PSNR_CAP_DB,
    frame_metrics: dict[str, FrameMetric] | None = None,
    ceiling_psnr: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Per-frame numbers of one rollout against its truth (own, other: the own truth; changed: both
    the own truth and ``changed_truth``, the truth of the changed script). ``ceiling_psnr``: the
    truth through the VAE, per frame (``live.ceiling_psnr``), kept with the own rollout's."""
    f = played.frames
    n = f.shape[0]
    # the model's output per cell: the action probe's causality check (the decode is a fixed
    # causal function of it, and a batched decode may round a row's frames differently)
    cells = played.latents.float().permute(1, 0, 2, 3).numpy()  # [N, 48, H, W]: cells 1..N
    out: dict[str, Any] = {"kind": kind, "digests": digests(cells)}
    gt = truth.frames[:n]
    out["psnr"] = M.psnr_per_frame(f, gt, cap)
    if kind == "other":
        return out
    k, a = sweep.change_cell, sweep.after_cells
    post = _frames_of(range(k, k + a))
    if kind == "changed":
        assert changed_truth is not None
        out["post_frames"] = f[post]
        out["truth_change"] = float(np.abs(changed_truth[post].astype(np.int16) - gt[post]).mean() / 255.0)
        out["psnr_changed_truth"] = M.nan_mean(M.psnr_per_frame(f[post], changed_truth[post], cap))
        out["psnr_own_truth"] = M.nan_mean(out["psnr"][post])
        return out
    out["ssim"] = M.ssim_per_frame(f, gt)
    if ceiling_psnr is not None:
        out["psnr_ceiling"] = list(ceiling_psnr[:n])
    out["post_frames"] = f[post]
    if truth_latent is not None:
        z = played.latents
        out["latent_mse"] = M.latent_mse_per_cell(z, truth_latent[:, 1 : 1 + z.shape[1]], [True] * z.shape[1])
    out["diffs"] = M.frame_diffs(f).tolist()
    out["gt_diffs"] = M.frame_diffs(gt).tolist()
    for name, metric in (frame_metrics or {}).items():
        out.setdefault("frame_metrics", {})[name] = [float(v) for v in metric(f, gt, played.ids)]
    # the report's strip: truth | generated | ids at a few cells
    picks = [M.cell_frames(int(c)).stop - 1 for c in np.linspace(0, sweep.cells, 6).round()]
    out["strip"] = {"truth": gt[picks], "frames": f[picks], "ids": played.ids[picks]}
    return out


def _flicker_ratio(diffs: Sequence[float], cells: range) -> float:
    boundary = [diffs[M.cell_frames(c).start - 1] for c in cells]
    within = [d for c in cells for d in diffs[M.cell_frames(c).start : M.cell_frames(c).stop - 1]]
    b, w = float(np.mean(boundary)), float(np.mean(within))
    return b / w if w > 0 else (1.0 if b == 0 else math.nan)


def _seg(values: Sequence[float], cells: range) -> float:
    return M.nan_mean(values[_frames_of(cells)])


def per_cell(sweep: LiveSweep, per_frame: Sequence[float]) -> list[float]:
    """A per-frame series' mean over each cell 0 … N (a drift curve)."""
    return [_seg(per_frame, range(c, c + 1)) for c in range(sweep.cells + 1)]


def per_segment(sweep: LiveSweep, per_frame: Sequence[float]) -> list[float]:
    """A per-frame series' mean over each of the sweep's segments."""
    return [_seg(per_frame, range(lo, hi + 1)) for lo, hi in sweep.segments()]


def drift_slope(sweep: LiveSweep, segment_values: Sequence[float]) -> float:
    """dB per minute: the least-squares slope of per-segment values over the segments' midpoints."""
    minutes = [((lo - 1) / CELLS_PER_SECOND + hi / CELLS_PER_SECOND) / 120.0 for lo, hi in sweep.segments()]
    return M.slope_per(minutes, segment_values)


def assemble_live(sweep: LiveSweep, rolls: dict[str, dict[str, Any]], truth: Truth) -> dict[str, Any]:
    """An export's result on ``sweep`` from its three scored rollouts."""
    own, other, changed = rolls["own"], rolls["other"], rolls["changed"]
    lat = own.get("latent_mse")
    segments = []
    for lo, hi in sweep.segments():
        cells = range(lo, hi + 1)
        seg: dict[str, Any] = {
            "cells": [lo, hi],
            "t0_s": (lo - 1) / CELLS_PER_SECOND,
            "t1_s": hi / CELLS_PER_SECOND,
            "psnr": _seg(own["psnr"], cells),
            "ssim": _seg(own["ssim"], cells),
            "psnr_other": _seg(other["psnr"], cells),
            "latent_mse": M.nan_mean(lat[c - 1] for c in cells) if lat is not None else None,
            "flicker_ratio": _flicker_ratio(own["diffs"], cells),
            "gt_flicker_ratio": _flicker_ratio(own["gt_diffs"], cells),
        }
        seg["delta_psnr"] = seg["psnr"] - seg["psnr_other"]
        if "psnr_ceiling" in own:
            seg["psnr_ceiling"] = _seg(own["psnr_ceiling"], cells)
        for name, vals in own.get("frame_metrics", {}).items():
            seg.setdefault("frame_metrics", {})[name] = _seg(vals, cells)
        segments.append(seg)
    k, a = sweep.change_cell, sweep.after_cells
    pre = k - 1  # cells 1 … k−1 come before the changed action (the digests start at cell 1)
    differs = sum(x != y for x, y in zip(changed["digests"][:pre], own["digests"][:pre], strict=True))
    gen_change = float(np.abs(changed["post_frames"].astype(np.int16) - own["post_frames"]).mean() / 255.0)
    action = {
        "change_cell": k,
        "after_cells": a,
        "cells_before_that_differ": differs,  # 0: nothing before the change moves (causal)
        "change_after": gen_change,  # mean |changed − own| after it, [0, 1] units
        "truth_change_after": changed["truth_change"],
        "sensitivity": gen_change / changed["truth_change"] if changed["truth_change"] > 0 else math.nan,
        # > 0: the changed frames are nearer the changed truth than the unchanged one
        "follows_change_db": changed["psnr_changed_truth"] - changed["psnr_own_truth"],
    }
    pairs = revisits(truth, sweep.revisit_gap)
    revisit = {
        "cells": len(pairs),
        "psnr": M.nan_mean(M.nan_mean(own["psnr"][_frames_of(range(c, c + 1))]) for c, _ in pairs),
        "psnr_first_visit": M.nan_mean(
            M.nan_mean(own["psnr"][_frames_of(range(e, e + 1))]) for _, e in pairs
        ),
    }
    revisit["consistency_db"] = revisit["psnr"] - revisit["psnr_first_visit"]
    result = {
        "sweep": sweep.definition(),
        "segments": segments,
        "drift_slope_db_per_min": drift_slope(sweep, [s["psnr"] for s in segments]),
        "psnr_first": segments[0]["psnr"],
        "psnr_last": segments[-1]["psnr"],
        "delta_psnr_min": min(s["delta_psnr"] for s in segments),
        "action": action,
        "revisit": revisit,
        "curves": {
            "psnr": per_cell(sweep, own["psnr"]),
            "psnr_other": per_cell(sweep, other["psnr"]),
            "latent_mse": [math.nan, *(lat or [])],
        },
    }
    if "psnr_ceiling" in own:  # the truth through the VAE: where its segments are harder to draw
        result["curves"]["psnr_ceiling"] = per_cell(sweep, own["psnr_ceiling"])
        result["ceiling_drift_slope_db_per_min"] = drift_slope(sweep, [s["psnr_ceiling"] for s in segments])
    return result
