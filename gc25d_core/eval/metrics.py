"""Evaluation metrics that need no downloaded network (FVD, LPIPS and VBench's learned scores need
weights this project cannot fetch).

Everything works on one rollout at a time: latents ``[C, N, H, W]`` (N cells) and decoded frames as
uint8 ``[F, h, w, 3]`` with F = 1 + 4(N − 1) (cell 0 = frame 0, cell k = frames 4k−3 … 4k). Frames
are compared as the 8-bit video a viewer would see.

* ``latent_mse_per_cell``: MSE over channels and pixels per cell; NaN where there is no ground truth.
* ``psnr_per_cell``: 10·log10(255² / MSE) over a cell's frames; an exact match (MSE 0) and anything
  above ``PSNR_CAP_DB`` are reported as ``PSNR_CAP_DB`` (100 dB), so identical rollouts give a finite,
  JSON-safe number that still averages; NaN where there is no ground truth.
* ``flicker``: mean absolute frame-to-frame difference (in [0, 1] intensity units) over the frame
  pairs that cross a cell boundary (the last frame of cell k−1 → the first of cell k) and over the
  pairs inside cells, for a set of cells; ``ratio`` = boundary / within (1 for a static video,
  undefined — NaN — when only the boundaries move), ``excess`` = boundary − within.
* ``nan_mean``: the mean of the defined values (NaN when none is).

NaN means "no value" here; ``json_safe`` writes it (and any ±inf) as JSON ``null``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

PSNR_CAP_DB = 100.0
FRAMES_PER_CELL = 4


def cell_frames(cell: int, frames_per_cell: int = FRAMES_PER_CELL) -> range:
    """Frames of latent cell ``cell`` in a rollout's decoded video (cell 0 is the one anchor frame)."""
    if cell < 0:
        raise ValueError(f"cell {cell} < 0")
    if cell == 0:
        return range(0, 1)
    return range(frames_per_cell * (cell - 1) + 1, frames_per_cell * cell + 1)


def num_frames(num_cells: int, frames_per_cell: int = FRAMES_PER_CELL) -> int:
    return 1 + frames_per_cell * (num_cells - 1)


def nan_mean(values: Iterable[float]) -> float:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else math.nan


def psnr_from_mse(mse: float, peak: float = 255.0, cap: float = PSNR_CAP_DB) -> float:
    """PSNR in dB, capped at ``cap`` (an exact match is ``cap``, not inf); NaN for a NaN MSE."""
    if not math.isfinite(mse):
        return math.nan
    if mse <= 0.0:
        return cap
    return min(cap, 10.0 * math.log10(peak * peak / mse))


def latent_mse_per_cell(gen: torch.Tensor, gt: torch.Tensor, has_gt: Sequence[bool]) -> list[float]:
    """[C, N, H, W] × 2 → N values (float64 sums), NaN where ``has_gt`` is False."""
    if gen.shape != gt.shape or gen.ndim != 4 or gen.shape[1] != len(has_gt):
        raise ValueError(f"latents {tuple(gen.shape)} / {tuple(gt.shape)} / {len(has_gt)} cells do not match")
    err = (gen.double() - gt.double()).pow(2).mean(dim=(0, 2, 3)).tolist()
    return [e if ok else math.nan for e, ok in zip(err, has_gt, strict=True)]


def latent_rms_per_cell(latent: torch.Tensor) -> list[float]:
    """Root mean square of each cell of [C, N, H, W]."""
    return latent.double().pow(2).mean(dim=(0, 2, 3)).sqrt().tolist()


def _check_frames(frames: np.ndarray, num_cells: int, name: str) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{name}: expected uint8 [F, h, w, 3], got {frames.dtype} {frames.shape}")
    if frames.shape[0] != num_frames(num_cells):
        raise ValueError(
            f"{name}: {frames.shape[0]} frames for {num_cells} cells (need {num_frames(num_cells)})"
        )


def frame_mse_per_cell(gen: np.ndarray, gt: np.ndarray, has_gt: Sequence[bool]) -> list[float]:
    """MSE (8-bit units²) of each cell's frames; NaN where ``has_gt`` is False."""
    n = len(has_gt)
    _check_frames(gen, n, "generated frames")
    _check_frames(gt, n, "reference frames")
    out = []
    for cell, ok in enumerate(has_gt):
        if not ok:
            out.append(math.nan)
            continue
        fr = cell_frames(cell)
        d = gen[fr.start : fr.stop].astype(np.float64) - gt[fr.start : fr.stop].astype(np.float64)
        out.append(float(np.mean(d * d)))
    return out


def psnr_per_cell(
    gen: np.ndarray, gt: np.ndarray, has_gt: Sequence[bool], cap: float = PSNR_CAP_DB
) -> list[float]:
    return [psnr_from_mse(m, cap=cap) for m in frame_mse_per_cell(gen, gt, has_gt)]


def frame_diffs(frames: np.ndarray) -> np.ndarray:
    """Mean |x_{f+1} − x_f| per consecutive pair, in [0, 1] units: [F − 1] float64. Exact integer
    sums over chunks of frames: a ten-minute session's int16 copy of every frame at once would be
    gigabytes (the sum of a pair is an integer below 2^53, so sum / n is the float64 mean)."""
    n = int(np.prod(frames.shape[1:]))
    out = np.empty(max(0, frames.shape[0] - 1), np.float64)
    for i in range(0, out.shape[0], 64):
        f = frames[i : i + 65].reshape(-1, n).astype(np.int16)
        out[i : i + f.shape[0] - 1] = np.abs(f[1:] - f[:-1]).sum(axis=1, dtype=np.int64) / n
    return out / 255.0


def flicker(frames: np.ndarray, cells: Iterable[int]) -> dict[str, float]:
    """Boundary vs within-cell frame differences over ``cells`` (cells ≥ 1 present in the video): the
    boundary pair entering cell k is (4k−4, 4k−3), its within pairs (4k−3, 4k−2) … (4k−1, 4k)."""
    d = frame_diffs(frames)
    boundary: list[float] = []
    within: list[float] = []
    for k in cells:
        if k < 1:
            continue
        fr = cell_frames(k)
        if fr.stop - 1 > d.shape[0]:
            raise ValueError(f"cell {k} is past the {frames.shape[0]}-frame video")
        boundary.append(d[fr.start - 1])
        within.extend(d[fr.start : fr.stop - 1])
    b = float(np.mean(boundary)) if boundary else math.nan
    w = float(np.mean(within)) if within else math.nan
    if not (math.isfinite(b) and math.isfinite(w)):
        ratio = math.nan
    elif w > 0:
        ratio = b / w
    else:
        ratio = 1.0 if b == 0 else math.nan  # a static video does not flicker; 0 within: undefined
    return {"boundary": b, "within": w, "excess": b - w, "ratio": ratio}


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """A decoded video [3, F, h, w] (or [1, 3, F, h, w]) in [−1, 1] → uint8 [F, h, w, 3]."""
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise ValueError(f"one video at a time, got a batch of {video.shape[0]}")
        video = video[0]
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"decoded video must be [3, F, h, w], got {tuple(video.shape)}")
    x = ((video.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 3, 0).cpu().numpy()


def json_safe(obj: Any) -> Any:
    """Floats NaN / ±inf → None (JSON null: no value), numpy / torch scalars → Python; recursive."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic | torch.Tensor):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ------------------------------------------------------------------------------------------------
# per-frame scores of a live session (gc25d_core.eval.live)


def psnr_per_frame(gen: np.ndarray, gt: np.ndarray, cap: float = PSNR_CAP_DB) -> list[float]:
    """PSNR (dB, capped) of each frame of uint8 [F, h, w, 3] against the same frames of ``gt``."""
    if gen.shape != gt.shape or gen.dtype != np.uint8 or gt.dtype != np.uint8:
        raise ValueError(f"frames {gen.dtype} {gen.shape} / {gt.dtype} {gt.shape}: need equal uint8 shapes")
    # exact integer sums, a chunk of frames at a time: a ten-minute session's float64 copies of
    # every frame at once would be gigabytes
    n = int(np.prod(gen.shape[1:]))
    out: list[float] = []
    for i in range(0, gen.shape[0], 64):
        d = gen[i : i + 64].reshape(-1, n).astype(np.int32) - gt[i : i + 64].reshape(-1, n)
        out += [psnr_from_mse(int(sq) / n, cap=cap) for sq in np.einsum("fp,fp->f", d, d, dtype=np.int64)]
    return out


# Wang et al. 2004 (the reference SSIM): an 11×11 Gaussian window of σ 1.5, K1 = 0.01, K2 = 0.03
_SSIM_C1, _SSIM_C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two uint8 [h, w, 3] images: the mean of the Gaussian-window SSIM map over pixels and
    channels (1.0 for identical images). Written with OpenCV's Gaussian filter (a dependency already):
    scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5)`` computes the same map
    but is not a dependency of this project, and one formula does not justify adding it."""
    import cv2

    if a.shape != b.shape or a.dtype != np.uint8 or b.dtype != np.uint8 or a.ndim != 3:
        raise ValueError(f"images {a.dtype} {a.shape} / {b.dtype} {b.shape}: need equal uint8 [h, w, 3]")
    x, y = a.astype(np.float64), b.astype(np.float64)

    def blur(z: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(z, (11, 11), 1.5, borderType=cv2.BORDER_REFLECT)

    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    num = (2 * mx * my + _SSIM_C1) * (2 * sxy + _SSIM_C2)
    den = (mx * mx + my * my + _SSIM_C1) * (sxx + syy + _SSIM_C2)
    return float(np.mean(num / den))


def ssim_per_frame(gen: np.ndarray, gt: np.ndarray, threads: int | None = None) -> list[float]:
    """``ssim`` of each frame pair, over ``threads`` threads (default: the cores, at most 8):
    OpenCV's filters and numpy's arithmetic on whole frames release the GIL, and each frame's value
    is computed alone, so the threads give the serial values."""
    if gen.shape != gt.shape:
        raise ValueError(f"frames {gen.shape} / {gt.shape} differ")
    threads = threads or min(8, os.cpu_count() or 1)
    if threads <= 1 or len(gen) < 2 * threads:
        return [ssim(g, t) for g, t in zip(gen, gt, strict=True)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(ssim, gen, gt))


def slope_per(xs: Sequence[float], ys: Sequence[float], per: float = 1.0) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (× ``per``: e.g. dB per minute with xs in minutes
    and per = 1); NaN with fewer than two finite points."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True) if math.isfinite(float(y))]
    if len(pts) < 2:
        return math.nan
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0]) * per
