"""SPEC §7: per-sample dropouts and the UNKNOWN world-anchored half-plane masking.

Dropouts (one draw per sample, ``draw_dropouts``): text p=0.1 → the NULL prompt ×21; cond p=0.05 →
ids all 255; UNKNOWN masking p=0.5, only when the cond is not dropped. Three uniforms are drawn
every time, so the generator's stream does not depend on the outcomes.

UNKNOWN masking (``unknown_mask``), exactly as the SPEC writes it:

1. Planes: 1 (p 0.7, q ~ U(0.05, 0.40)) or 2 (p 0.3, each q ~ U(0.05, 0.25)), each with a direction
   θ ~ U[0, 2π) in world XY.
2. Ground points: ``capsules.ground_points`` on the plane z = ``meta.ground_z[0]`` at the centres of
   the 4×4 pooled grid (destination pixels (4j + 1.5, 4i + 1.5)); a pixel uses its block's point
   (nearest upsampling ×4). NaN where the ray does not meet the plane in front of the camera.
3. Threshold: τ = max over the calibration frames (every 4th frame and the last) of that frame's
   (1 − q)-quantile of the projections g·θ of its static pixels' grid ground points (a quantile over
   static pixels, i.e. over grid points weighted by their static pixel count; NaN points left out).
   So no calibration frame has more than q of its (plane-hit) static pixels beyond the plane.
4. Mask: in every frame, static pixels (raw 0..6) whose ground point lies beyond any plane
   (g·θ > τ) or is NaN become 255. Character pixels are never masked.

Everything is per frame and anchored in the world, so it is cell-local (causal-safe) and slides with
the camera like the code world's unseen canvas. All randomness comes from the ``numpy.random.Generator``
passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gc25d_core.capsules import ground_points
from gc25d_core.config import GeometryConfig
from gc25d_core.vocab import NUM_STATIC, UNKNOWN

POOL = 4

P_ONE_PLANE = 0.7
Q_ONE = (0.05, 0.40)
Q_TWO = (0.05, 0.25)
CALIBRATION_STRIDE = 4

T = TypeVar("T")


# --- per-sample dropouts ------------------------------------------------------------------------


@dataclass(frozen=True)
class DropoutRates:
    text: float = 0.1
    cond: float = 0.05
    unknown_mask: float = 0.5


@dataclass(frozen=True)
class Dropouts:
    """One sample's draw: NULL text, cond all 255, UNKNOWN masking (never together with cond)."""

    text: bool
    cond: bool
    unknown_mask: bool


def draw_dropouts(rng: np.random.Generator, rates: DropoutRates = DropoutRates()) -> Dropouts:
    """Three independent uniforms (always three): text, cond, masking (applies only if cond kept)."""
    u = rng.random(3)
    cond = bool(u[1] < rates.cond)
    return Dropouts(
        text=bool(u[0] < rates.text), cond=cond, unknown_mask=(not cond) and bool(u[2] < rates.unknown_mask)
    )


def apply_dropouts(
    ids: np.ndarray,
    prompts: Sequence[T],
    null_prompt: T,
    ground_xy: np.ndarray | Callable[[], np.ndarray],
    rng: np.random.Generator,
    rates: DropoutRates = DropoutRates(),
) -> tuple[np.ndarray, list[T], Dropouts, HalfPlanes | None]:
    """Draw and apply one sample's dropouts. ``ids`` uint8 [F,H,W] (not modified); ``prompts`` per
    cell (or text keys; replaced by ``null_prompt`` each); ``ground_xy`` the sample's pooled ground
    points (``pooled_ground_xy``) or a callable computing them (called only when masking applies).
    Returns (ids, prompts, the draw, the masking half-planes or None)."""
    d = draw_dropouts(rng, rates)
    out_prompts = [null_prompt] * len(prompts) if d.text else list(prompts)
    planes = None
    if d.cond:
        out = np.full_like(np.asarray(ids), UNKNOWN)
    elif d.unknown_mask:
        xy = ground_xy() if callable(ground_xy) else ground_xy
        out, planes = apply_unknown_masking(ids, xy, rng)
    else:
        out = np.asarray(ids)
    return out, out_prompts, d, planes


# --- half-planes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfPlanes:
    """P world-XY half-planes {g : g·direction > tau}: directions f64 [P,2] (unit), q f64 [P], tau f64 [P]
    (NaN until calibrated)."""

    theta: np.ndarray
    q: np.ndarray
    tau: np.ndarray

    @property
    def directions(self) -> np.ndarray:
        return np.stack([np.cos(self.theta), np.sin(self.theta)], axis=1)

    @property
    def num_planes(self) -> int:
        return len(self.theta)


def draw_half_planes(rng: np.random.Generator) -> HalfPlanes:
    """1 plane (p 0.7, q ~ U(0.05, 0.40)) or 2 (p 0.3, each q ~ U(0.05, 0.25)); θ ~ U[0, 2π)."""
    q = rng.uniform(*Q_ONE, size=1) if rng.random() < P_ONE_PLANE else rng.uniform(*Q_TWO, size=2)
    theta = rng.uniform(0.0, 2.0 * np.pi, size=len(q))
    return HalfPlanes(theta, q, np.full(len(q), np.nan))


def calibration_frames(num_frames: int) -> list[int]:
    """Every 4th frame and the last."""
    return sorted({*range(0, num_frames, CALIBRATION_STRIDE), num_frames - 1})


def pooled_ground_xy(
    world_to_clip: np.ndarray, world_to_view: np.ndarray, z: float, geometry: GeometryConfig, pool: int = POOL
) -> np.ndarray:
    """Ground points (x, y) cm f64 [F, H/pool, W/pool, 2] of the pooled grid centres on the plane z
    (NaN where a centre's ray does not meet it in front of the camera)."""
    h, w = geometry.dst_height // pool, geometry.dst_width // pool
    if h * pool != geometry.dst_height or w * pool != geometry.dst_width:
        raise ValueError(
            f"destination {geometry.dst_width}x{geometry.dst_height} is not a multiple of {pool}"
        )
    gy, gx = np.mgrid[0:h, 0:w].astype(np.float64)
    xy = np.stack([gx * pool + (pool - 1) / 2, gy * pool + (pool - 1) / 2], axis=-1)
    m, v = np.asarray(world_to_clip), np.asarray(world_to_view)
    return np.stack([ground_points(m[f], v[f], z, geometry, xy)[..., :2] for f in range(len(m))])


def masking_ground_xy(
    meta: dict[str, Any], geometry: GeometryConfig, num_frames: int | None = None
) -> np.ndarray:
    """``pooled_ground_xy`` of a clip's meta (first ``num_frames`` frames) at meta.ground_z[0]."""
    n = len(meta["world_to_clip"]) if num_frames is None else num_frames
    return pooled_ground_xy(
        meta["world_to_clip"][:n], meta["world_to_view"][:n], float(meta["ground_z"][0]), geometry
    )


def static_counts(ids: np.ndarray, pool: int = POOL) -> np.ndarray:
    """Static pixels per pooled block: int [F, H/pool, W/pool]."""
    f, hh, ww = ids.shape
    static = (np.asarray(ids) < NUM_STATIC).reshape(f, hh // pool, pool, ww // pool, pool)
    return static.sum(axis=(2, 4))


def weighted_quantile(values: np.ndarray, weights: np.ndarray, level: float) -> float:
    """The smallest value v with weight(values ≤ v) ≥ level · total weight (NaN if no weight)."""
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order], dtype=np.float64)
    if len(cw) == 0 or cw[-1] <= 0:
        return float("nan")
    k = int(np.searchsorted(cw, level * cw[-1], side="left"))
    return float(values[order[min(k, len(order) - 1)]])


def calibrate(
    planes: HalfPlanes, ground_xy: np.ndarray, counts: np.ndarray, frames: Sequence[int]
) -> HalfPlanes:
    """τ per plane = max over ``frames`` of the (1 − q) quantile of static grid projections."""
    dirs = planes.directions
    tau = np.full(planes.num_planes, -np.inf)
    for f in frames:
        finite = np.isfinite(ground_xy[f]).all(-1) & (counts[f] > 0)
        if not finite.any():
            continue
        g, wts = ground_xy[f][finite], counts[f][finite]
        for p in range(planes.num_planes):
            tau[p] = max(tau[p], weighted_quantile(g @ dirs[p], wts, 1.0 - planes.q[p]))
    tau[~np.isfinite(tau)] = np.inf  # no static ground point anywhere: nothing is beyond
    return HalfPlanes(planes.theta, planes.q, tau)


def beyond(planes: HalfPlanes, ground_xy: np.ndarray) -> np.ndarray:
    """Grid points beyond any plane, or NaN: bool [F, h, w]."""
    proj = ground_xy @ planes.directions.T  # [F,h,w,P]
    with np.errstate(invalid="ignore"):
        out = (proj > planes.tau).any(-1)
    return out | ~np.isfinite(ground_xy).all(-1)


def unknown_mask(
    ids: np.ndarray, ground_xy: np.ndarray, rng: np.random.Generator, pool: int = POOL
) -> tuple[np.ndarray, HalfPlanes]:
    """The pixels the UNKNOWN masking sets to 255: bool [F,H,W] (static pixels only) and its planes."""
    ids = np.asarray(ids)
    if ids.ndim != 3 or ground_xy.shape != (ids.shape[0], ids.shape[1] // pool, ids.shape[2] // pool, 2):
        raise ValueError(f"ids {ids.shape} and pooled ground points {ground_xy.shape} do not match")
    counts = static_counts(ids, pool)
    planes = calibrate(draw_half_planes(rng), ground_xy, counts, calibration_frames(len(ids)))
    grid = beyond(planes, ground_xy)
    pixels = np.repeat(np.repeat(grid, pool, axis=1), pool, axis=2)
    return pixels & (ids < NUM_STATIC), planes


def apply_unknown_masking(
    ids: np.ndarray, ground_xy: np.ndarray, rng: np.random.Generator, pool: int = POOL
) -> tuple[np.ndarray, HalfPlanes]:
    """A masked copy of ids uint8 [F,H,W] and the planes used."""
    mask, planes = unknown_mask(ids, ground_xy, rng, pool)
    out = np.array(ids, copy=True)
    out[mask] = UNKNOWN
    return out, planes
