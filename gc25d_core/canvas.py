"""SPEC §8 stage 3: the extension canvas (``cond_ext_canvas/<clip_id>.npz``).

For clips whose look changes at s+81 (``ClipRow.ext_look_change``) the raw extension condition
pops; stage 3 uses a condition re-rendered from what frames s…s+80 showed instead.

1. **Canvas.** Every static pixel (raw 0..6) of the 81 clip frames of ``cond`` is placed in the world
   by its frame's camera (``meta``); the latest frame wins. Three layers (docs/decisions.md,
   "extension canvas: pop-up"):

   * **ground plane** z = z₀ (median of ``meta.ground_z`` over the clip frames): pixels of the ground
     ids (terrain, paving) whose ray meets it in front of the camera, within ``radius_cm`` of the mean
     eye, go to cell (x, y) cm. Rock and vegetation are flat patches or standing objects: a pixel of
     theirs is ground unless the frames ``vote_offsets`` before and after see other static ids at its
     ground point (a flat patch re-projects onto itself, a standing object's plane point does not);
   * **pop-up points**: upright pixels (architecture, props, standing rock / vegetation) stand on a
     vertical billboard facing the camera through their contact point, found by scanning each
     column bottom-up (``upright_points``). Each frame then removes the earlier points its own
     view sees through (its ground, sky or pop-up depth is farther than the point: latest wins
     along the rays), and one point per voxel remains, the latest;
   * **sky dome** (perspective frames): sky pixels by direction (content at infinity).

   Ortho frames use the ground and the pop-up points; their sky stays unseen.

2. **Re-render.** Each extension frame s+81…s+108 reads the ground under its rays and the dome
   above the horizon, and splats the pop-up points (nearest depth bin wins, inside it the latest);
   a point covers the ground behind it. Cells never filled give 255 (UNKNOWN, the code world's
   unseen semantics). Characters are drawn on top from the meta capsules with
   ``capsules.render_capsules`` (no scene occlusion).

Resolution and extent. The ground and the dome are **mip pyramids** of ``levels`` dense uint16 grids
with cell ``cell_cm · 2^l`` (default 2 cm … 65 km: the levels in use are set by the data), cells
aligned to world multiples so that level l+1 cell = level l cell // 2. A destination pixel covers an
anisotropic patch on the ground (short across, long in depth when foreshortened): the singular values
of the pixel → plane Jacobian (analytic from the plane homography) give its shortest and longest
extent; on the dome they are R·(smallest / largest adjacent-pixel ray angle). A ground pixel is
written to the level whose cell is the largest ≤ its shortest extent, a dome pixel to the level of its
longest extent. After all frames every filled cell is propagated to the coarser levels (latest
wins). A re-rendered pixel reads from the level of its shortest extent up to the level of its longest
extent plus ``max_fallback``, the first filled cell winning. Pop-up points keep their source pixel's
extent; a point is splatted as a square of that extent's projected size (≤ ``max_splat`` pixels).

Values are packed uint16 ``(stamp << 8) | id`` with stamp = source frame + 1, combined with
``np.maximum.at``: a later frame always wins, ties inside one frame go to the larger id
(deterministic). Everything is vectorised numpy over pixels; loops run over frames, levels and (for
the pop-up contact scan) rows.

Measured on the code world with bench/probes/ext_canvas_stats.py and docs/benchmarks.md (beside the SPEC's
97–98 % static agreement on in-look frames and ~17 % unknown in extension frames): 93–94 % in-look;
ground and sky agree up to resolution, upright ids carry the error of their one-frame depth. A clip's
canvas takes ≈ 21 s on one idle core at 832×480 (the pop-up scan and the carving), each re-rendered
frame ≈ 0.15 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gc25d_core.capsules import PixelRays, as_matrix, dst_sample_coords, project_src, render_capsules
from gc25d_core.config import GeometryConfig, TimelineConfig
from gc25d_core.geometry import src_to_dst
from gc25d_core.vocab import NUM_STATIC, UNKNOWN

_EPS = 1e-12


@dataclass(frozen=True)
class CanvasParams:
    """Canvas resolution, extent and pop-up settings (see the module docstring).

    radius_cm: ground disc around the mean eye; dome_cm: the dome's unit (cm per radian);
    vote_offsets: frames before / after that vote on rock and vegetation pixels; depth_tol: relative
    depth bin of the splat (nearest bin wins, then latest); carve_tol: a later frame removes a point
    it sees more than this (relative) beyond; max_splat: largest splat side in pixels."""

    radius_cm: float = 5000.0
    cell_cm: float = 2.0
    levels: int = 16
    max_fallback: int = 1
    dome_cm: float = 100000.0
    vote_offsets: tuple[int, ...] = (10, 20)
    depth_tol: float = 0.03
    max_splat: int = 8
    carve_tol: float = 0.0
    splat_scale: float = 1.0
    carve_votes: float = 0.5
    fill_iters: int = 2
    carve_all_tol: float = 0.1

    def __post_init__(self) -> None:
        if (
            min(self.radius_cm, self.cell_cm, self.dome_cm, self.depth_tol) <= 0
            or self.levels < 1
            or self.max_fallback < 0
            or self.max_splat < 1
            or self.carve_tol < 0
        ):
            raise ValueError(f"invalid canvas parameters {self}")


# --- cameras ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameCamera:
    """Plane and ray geometry of one frame's camera in source pixel coordinates."""

    world_to_clip: np.ndarray  # f64 [4,4]
    world_to_view: np.ndarray  # f64 [4,4]
    src_to_plane: np.ndarray  # f64 [3,3]: (sx, sy, 1) → (x, y, 1)/w on the plane z
    orthographic: bool
    eye: np.ndarray  # f64 [3]: the view origin (the eye of a perspective camera)
    z: float
    width: int
    height: int

    @classmethod
    def of(cls, world_to_clip: Any, world_to_view: Any, z: float, width: int, height: int) -> FrameCamera:
        m = as_matrix(world_to_clip, "world_to_clip")
        v = as_matrix(world_to_view, "world_to_view")
        return cls(
            world_to_clip=m,
            world_to_view=v,
            src_to_plane=np.linalg.inv(plane_to_src(m, z, width, height)),
            orthographic=bool(np.abs(m[3, :3]).max() < 1e-9),
            eye=np.linalg.inv(v)[:3, 3],
            z=float(z),
            width=width,
            height=height,
        )

    def rays(self, sx: np.ndarray, sy: np.ndarray) -> PixelRays:
        """The world rays through source pixels (sx, sy) [N] (capsules.PixelRays)."""
        return PixelRays.through(sx, sy, self.world_to_clip, self.world_to_view, self.width, self.height)


def plane_to_src(world_to_clip: Any, z: float, width: int, height: int) -> np.ndarray:
    """3×3 homography of the plane z: (x, y, 1) → (sx·w, sy·w, w), w = clip w (> 0 in front for
    perspective cameras), sx, sy source pixel coordinates (centres at integers, capsules.py convention)."""
    m = as_matrix(world_to_clip, "world_to_clip")
    rows = m[[0, 1, 3]]
    p = np.stack([rows[:, 0], rows[:, 1], rows[:, 2] * z + rows[:, 3]], axis=1)
    k = np.array([[width / 2, 0.0, width / 2 - 0.5], [0.0, -height / 2, height / 2 - 0.5], [0.0, 0.0, 1.0]])
    return k @ p


def ray_dirs(cam: FrameCamera, sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """Unit world ray directions f64 [N,3] of source pixels (sx, sy) [N], oriented so that view depth
    grows along them; NaN where the camera has no such ray (``cam.rays``, capsules.PixelRays)."""
    return cam.rays(sx, sy).direction


def pixel_angles(cam: FrameCamera, geometry: GeometryConfig) -> tuple[float, float]:
    """(smallest, largest) angle in rad between the rays of adjacent destination pixels: at the image
    corners and at the centre (perspective pixels subtend less towards the corners)."""
    sx, sy = dst_sample_coords(geometry)
    w, h = geometry.dst_width, geometry.dst_height
    at = np.array([0, w - 2, (h - 2) * w, (h - 2) * w + w - 2, (h // 2) * w + w // 2])
    pairs = np.concatenate([np.stack([at, at + 1], 1), np.stack([at, at + w], 1)]).ravel()
    d = ray_dirs(cam, sx[pairs], sy[pairs]).reshape(-1, 2, 3)
    ang = np.arccos(np.clip((d[:, 0] * d[:, 1]).sum(1), -1.0, 1.0))
    return float(max(ang.min(), 1e-9)), float(max(ang.max(), 1e-9))


@dataclass(frozen=True)
class GroundHits:
    """Where pixel rays meet the plane z: ``hit`` (in front of the camera), ground point ``coords``
    (x, y) cm, view ``depth`` cm and ``stretch`` (min, max) cm, the shortest and longest ground extent
    of one destination pixel step."""

    hit: np.ndarray  # bool [N]
    coords: np.ndarray  # f64 [N,2]
    depth: np.ndarray  # f64 [N]
    stretch: np.ndarray  # f64 [N,2]

    def on_disc(self, centre: np.ndarray, radius: float) -> np.ndarray:
        """bool [N]: hits within ``radius`` cm of ``centre`` (x, y): the ground canvas's extent."""
        return self.hit & (np.hypot(*(self.coords - centre).T) <= radius)


def ground_hits(cam: FrameCamera, sx: np.ndarray, sy: np.ndarray, geometry: GeometryConfig) -> GroundHits:
    """Rays of source sample positions (sx, sy) [N] against the plane ``cam.z``."""
    h = cam.src_to_plane
    a = h[0, 0] * sx + h[0, 1] * sy + h[0, 2]
    b = h[1, 0] * sx + h[1, 1] * sy + h[1, 2]
    s = h[2, 0] * sx + h[2, 1] * sy + h[2, 2]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x, y = a / s, b / s
        v = cam.world_to_view[2]
        depth = v[0] * x + v[1] * y + v[2] * cam.z + v[3]
        stretch = _plane_stretch(h, x, y, s, geometry)
        hit = (np.abs(s) > _EPS) & (depth > 0) & np.isfinite(x) & np.isfinite(y) & np.isfinite(stretch).all(1)
    return GroundHits(hit, np.stack([x, y], axis=1), np.where(hit, depth, np.inf), stretch)


def _plane_stretch(
    h: np.ndarray, x: np.ndarray, y: np.ndarray, s: np.ndarray, geometry: GeometryConfig
) -> np.ndarray:
    """Singular values (min, max) f64 [N,2] of the Jacobian of destination pixel → plane point: the
    shortest and longest ground extent of one destination pixel step. For (x, y) = (h0·p, h1·p)/(h2·p),
    ∂x/∂sx = (h00 − x·h20)/s etc.; a destination step is (crop_w/dst_w, src_h/dst_h) source pixels."""
    ax = (geometry.crop_x1 - geometry.crop_x0) / geometry.dst_width
    ay = geometry.src_height / geometry.dst_height
    a = (h[0, 0] - x * h[2, 0]) / s * ax
    b = (h[0, 1] - x * h[2, 1]) / s * ay
    c = (h[1, 0] - y * h[2, 0]) / s * ax
    d = (h[1, 1] - y * h[2, 1]) / s * ay
    sq = a * a + b * b + c * c + d * d
    det = a * d - b * c
    root = np.sqrt(np.maximum(sq * sq - 4.0 * det * det, 0.0))
    return np.stack([np.sqrt(np.maximum(sq - root, 0.0) / 2.0), np.sqrt((sq + root) / 2.0)], axis=1)


def dome_coords(
    cam: FrameCamera, sx: np.ndarray, sy: np.ndarray, geometry: GeometryConfig, params: CanvasParams
) -> tuple[np.ndarray, np.ndarray]:
    """Directions of perspective rays on the sky dome: ((azimuth·R, elevation·R) f64 [N,2], stretch
    (min, max) f64 [N,2]) with R = ``params.dome_cm`` (content at infinity: no parallax)."""
    d = ray_dirs(cam, sx, sy)
    r = params.dome_cm
    el = np.arcsin(np.clip(d[:, 2], -1.0, 1.0))
    coords = np.stack([np.arctan2(d[:, 1], d[:, 0]) * r, el * r], axis=1)
    a_min, a_max = pixel_angles(cam, geometry)
    cos_el = np.maximum(np.cos(el), 0.05)
    stretch = np.stack([np.full(len(d), r * a_min), r * a_max / cos_el], axis=1)
    return coords, stretch


def project_dst(
    cam: FrameCamera, points: np.ndarray, geometry: GeometryConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """World points f64 [N,3] → (destination x, y f64 [N], view depth f64 [N], destination pixels per
    cm across the view at the point f64 [N])."""
    src_x, src_y, w = project_src(points, cam.world_to_clip, cam.width, cam.height)
    v = cam.world_to_view
    with np.errstate(invalid="ignore", divide="ignore"):
        # one cm along the view's right axis moves the projection by m0·right / w source pixels
        px_src = np.abs(cam.world_to_clip[0, :3] @ v[0, :3]) / w * cam.width / 2.0
    dx, dy = src_to_dst(src_x, src_y, geometry)
    scale = geometry.dst_width / (geometry.crop_x1 - geometry.crop_x0)
    depth = points @ v[2, :3] + v[2, 3]
    return np.asarray(dx), np.asarray(dy), depth, px_src * scale


# --- which pixels are where -----------------------------------------------------------------------

ROLE_NONE, ROLE_SKY, ROLE_GROUND, ROLE_UPRIGHT = range(4)
_ROLE_OF_ID = np.array(
    [ROLE_SKY, ROLE_GROUND, ROLE_GROUND, ROLE_UPRIGHT, ROLE_GROUND, ROLE_GROUND, ROLE_UPRIGHT]
)
MIXED_IDS = (4, 5)  # rock, vegetation: flat ground patches or standing objects (decided by a vote)


def pixel_roles(
    cond_ids: np.ndarray,
    cams: list[FrameCamera],
    hits: list[GroundHits],
    geometry: GeometryConfig,
    params: CanvasParams,
) -> np.ndarray:
    """Role uint8 [F,H·W] of every pixel: none (not static), sky (raw 0), ground (terrain, paving) or
    upright (architecture, prop); rock and vegetation pixels are ground where their ground point shows
    the same id in the frames ``params.vote_offsets`` before and after (a flat patch re-projects;
    a standing object's plane point lands elsewhere), upright where other static ids outvote it."""
    num, h, w = cond_ids.shape
    flat = cond_ids.reshape(num, -1)
    roles = np.where(flat < NUM_STATIC, _ROLE_OF_ID[np.minimum(flat, NUM_STATIC - 1)], ROLE_NONE)
    for f in range(num):
        mixed = np.flatnonzero(np.isin(flat[f], MIXED_IDS) & hits[f].hit)
        if not len(mixed):
            continue
        pts = np.concatenate([hits[f].coords[mixed], np.full((len(mixed), 1), cams[f].z)], axis=1)
        votes = np.zeros(len(mixed), np.int64)
        refs = sorted({f + s * o for o in params.vote_offsets for s in (-1, 1)} & set(range(num)) - {f})
        for g in refs:
            dx, dy, depth, _ = project_dst(cams[g], pts, geometry)
            with np.errstate(invalid="ignore"):
                ix, iy = np.round(dx), np.round(dy)
                ok = (depth > 0) & (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
            seen = np.full(len(mixed), UNKNOWN, np.uint8)
            seen[ok] = cond_ids[g, iy[ok].astype(np.int64), ix[ok].astype(np.int64)]
            static = seen < NUM_STATIC
            votes += np.where(static, np.where(seen == flat[f, mixed], 1, -1), 0)
        roles[f, mixed[votes < 0]] = ROLE_UPRIGHT
    mixed_off = np.isin(flat, MIXED_IDS) & ~np.stack([hit.hit for hit in hits])
    roles[mixed_off] = ROLE_UPRIGHT  # above the horizon: standing
    return roles.astype(np.uint8)


def upright_points(
    roles: np.ndarray,
    ids: np.ndarray,
    cam: FrameCamera,
    hit: GroundHits,
    sx: np.ndarray,
    sy: np.ndarray,
    geometry: GeometryConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """Pop-up: world points f64 [K,3] of the upright pixels (indices [K] into H·W) of one frame.

    Scanning each destination column bottom-up, a run of one upright id stands on a vertical
    billboard facing the camera through its contact point, the first of: where the ray of the
    boundary between the run and the pixel below meets the ground, when that pixel is ground; the
    contact of the last run of the same id lower in the column (thin objects alias into pieces); the
    billboard of the upright run just below (stacked: its foot is hidden); the run's own lowest
    ground point (hidden by a character or below the frame). Pixels with none of these (above the
    horizon, over sky or a character) take the billboard of the nearest pixel of their row segment
    of the same id that has one, else they are dropped."""
    h, w = geometry.dst_height, geometry.dst_width
    role, cid = roles.reshape(h, w), ids.reshape(h, w).astype(np.int64)
    rays = cam.rays(sx, sy)
    o, d = rays.origin.reshape(h, w, 3), rays.direction.reshape(h, w, 3)
    gxy, gok = hit.coords.reshape(h, w, 2), hit.hit.reshape(h, w)
    # the foot: where the boundary between a pixel and the one below it meets the ground
    sy_edge = (sy.reshape(h, w)[:-1] + sy.reshape(h, w)[1:]) / 2.0
    edge = ground_hits(cam, sx.reshape(h, w)[1:].ravel(), sy_edge.ravel(), geometry)
    exy, eok = edge.coords.reshape(h - 1, w, 2), edge.hit.reshape(h - 1, w)
    cols = np.arange(w)
    cpt = np.full((w, 2), np.nan)  # the current run's contact point (x, y)
    nrm = np.full((w, 2), np.nan)  # and billboard normal (horizontal, away from the camera)
    last = np.full((w, NUM_STATIC, 4), np.nan)  # per column and id: the last run's (contact, normal)
    run_id = np.full(w, -1, np.int64)
    prev_role = np.full(w, ROLE_NONE)
    plane = np.full((h, w, 4), np.nan)  # per upright pixel: its billboard (contact, normal)
    for r in range(h - 1, -1, -1):
        up = role[r] == ROLE_UPRIGHT
        same = up & (prev_role == ROLE_UPRIGHT) & (cid[r] == run_id)
        new = up & ~same
        if new.any():
            c_new = np.full((w, 2), np.nan)
            n_new = np.full((w, 2), np.nan)
            if r + 1 < h:
                below = new & (prev_role == ROLE_GROUND) & eok[r]
                c_new[below] = exy[r, below]
            prior = last[cols, np.minimum(cid[r], NUM_STATIC - 1)]
            use = new & np.isnan(c_new[:, 0]) & np.isfinite(prior[:, 0])
            c_new[use], n_new[use] = prior[use, :2], prior[use, 2:]
            stacked = new & np.isnan(c_new[:, 0]) & (prev_role == ROLE_UPRIGHT) & np.isfinite(cpt[:, 0])
            c_new[stacked], n_new[stacked] = cpt[stacked], nrm[stacked]
            own = new & np.isnan(c_new[:, 0]) & gok[r]
            c_new[own] = gxy[r, own]
            fresh = np.isnan(n_new[:, 0])
            n_f = d[r, :, :2] if cam.orthographic else c_new - o[r, :, :2]
            n_new[fresh] = (n_f / np.maximum(np.linalg.norm(n_f, axis=1, keepdims=True), _EPS))[fresh]
            cpt[new], nrm[new], run_id[new] = c_new[new], n_new[new], cid[r, new]
            ok = new & np.isfinite(c_new[:, 0])
            last[cols[ok], cid[r, ok]] = np.concatenate([c_new, n_new], axis=1)[ok]
        plane[r, up] = np.concatenate([cpt, nrm], axis=1)[up]
        prev_role = role[r]
    plane = _fill_rows(plane, role == ROLE_UPRIGHT, cid)
    with np.errstate(invalid="ignore", divide="ignore"):
        num = np.einsum("hwi,hwi->hw", plane[..., :2] - o[..., :2], plane[..., 2:4])
        den = np.einsum("hwi,hwi->hw", d[..., :2], plane[..., 2:4])
        t = num / den
        flat_t = np.where((den > 0.05) & (t > 0), t, np.nan).reshape(-1)
    idx = np.flatnonzero(np.isfinite(flat_t))
    pts = rays.origin[idx] + flat_t[idx, None] * rays.direction[idx]
    return pts, idx


def _close_holes(zbuf: np.ndarray, iters: int) -> np.ndarray:
    """Forward-warp holes: a pixel of the splat z-buffer (int64 [H,W], key = depth bin << 16 | ~packed,
    max = empty) whose two opposite neighbours (left / right, up / down or a diagonal pair) hold the
    same id at depth bins within one of each other, all nearer than the pixel's own, takes the
    farther neighbour's key; ``iters`` rounds."""
    h, w = zbuf.shape
    empty = np.iinfo(np.int64).max
    for _ in range(iters):
        p = np.pad(zbuf, 1, constant_values=empty)
        best = np.full((h, w), empty)
        for (ay, ax), (by, bx) in (((1, 0), (1, 2)), ((0, 1), (2, 1)), ((0, 0), (2, 2)), ((0, 2), (2, 0))):
            a, b = p[ay : ay + h, ax : ax + w], p[by : by + h, bx : bx + w]
            ok = (
                (a != empty)
                & (b != empty)
                & ((a & 0xFF) == (b & 0xFF))
                & (np.abs((a >> 16) - (b >> 16)) <= 1)
            )
            best = np.where(ok, np.minimum(best, np.maximum(a, b)), best)
        hole = (best != empty) & ((zbuf == empty) | ((zbuf >> 16) > (best >> 16) + 1))
        if not hole.any():
            break
        zbuf = np.where(hole, best, zbuf)
    return zbuf


def _fill_rows(values: np.ndarray, mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``values`` f64 [H,W,C] with NaN rows (``values[..., 0]``) inside ``mask`` filled from the nearest
    finite pixel of the same row segment (contiguous ``mask`` pixels of one id)."""
    h, w = mask.shape
    left = np.zeros_like(mask)
    left[:, 1:] = mask[:, 1:] & mask[:, :-1] & (ids[:, 1:] == ids[:, :-1])
    seg = np.cumsum((mask & ~left).ravel())
    flat = values.reshape(h * w, -1)
    valid = mask.ravel() & np.isfinite(flat[:, 0])
    pos = np.arange(h * w)
    fwd = np.maximum.accumulate(np.where(valid, pos, -1))
    bwd = np.minimum.accumulate(np.where(valid, pos, h * w)[::-1])[::-1]
    fwd_ok = (fwd >= 0) & (seg[np.maximum(fwd, 0)] == seg)
    bwd_ok = (bwd < h * w) & (seg[np.minimum(bwd, h * w - 1)] == seg)
    src = np.where(fwd_ok & (~bwd_ok | (pos - fwd <= bwd - pos)), fwd, np.where(bwd_ok, bwd, -1))
    fill = mask.ravel() & ~valid & (src >= 0)
    out = flat.copy()
    out[fill] = flat[src[fill]]
    return out.reshape(values.shape)


# --- the pyramid --------------------------------------------------------------------------------


class Pyramid:
    """Dense mip levels of packed uint16 cells over 2-D coordinates; the cell of level l is
    cell0 · 2^l and its global index floor(coord / cell), so the level l+1 cell of a level l cell is
    index // 2. Each level is a dense array over the index box written so far; it grows (with a
    margin) when a write falls outside."""

    _MARGIN = 0.25

    def __init__(self, cell0: float, num_levels: int):
        self.cell0 = float(cell0)
        self.lo = np.zeros((num_levels, 2), np.int64)
        self.grids = [np.zeros((0, 0), np.uint16) for _ in range(num_levels)]

    @property
    def num_levels(self) -> int:
        return len(self.grids)

    def cells(self, coords: np.ndarray, level: int) -> np.ndarray:
        return np.floor(coords / (self.cell0 * 2.0**level)).astype(np.int64)

    def _cover(self, level: int, lo: np.ndarray, hi: np.ndarray) -> None:
        """Grow level ``level`` so that it holds the inclusive index box [lo, hi]."""
        g = self.grids[level]
        old_lo, old_hi = self.lo[level], self.lo[level] + np.array(g.shape) - 1
        if g.size and (lo >= old_lo).all() and (hi <= old_hi).all():
            return
        if g.size:
            lo, hi = np.minimum(lo, old_lo), np.maximum(hi, old_hi)
            pad = ((hi - lo + 1) * self._MARGIN).astype(np.int64) + 8
            lo = np.where(lo < old_lo, lo - pad, lo)
            hi = np.where(hi > old_hi, hi + pad, hi)
        grown = np.zeros(tuple(hi - lo + 1), np.uint16)
        if g.size:
            o = old_lo - lo
            grown[o[0] : o[0] + g.shape[0], o[1] : o[1] + g.shape[1]] = g
        self.grids[level], self.lo[level] = grown, lo

    def _put(self, level: int, ij: np.ndarray, packed: np.ndarray) -> None:
        if len(ij) == 0:
            return
        self._cover(level, ij.min(0), ij.max(0))
        ij = ij - self.lo[level]
        np.maximum.at(self.grids[level], (ij[:, 0], ij[:, 1]), packed)

    def write(self, level: int, coords: np.ndarray, packed: np.ndarray) -> None:
        """Cells of ``coords`` [N,2] at ``level`` take the larger of their value and ``packed`` [N]."""
        self._put(level, self.cells(coords, level), packed)

    def propagate(self) -> None:
        """Every filled cell into its coarser ancestors (latest stamp wins)."""
        for level in range(self.num_levels - 1):
            g = self.grids[level]
            i, j = np.nonzero(g)
            if len(i):
                parent = (np.stack([i, j], axis=1) + self.lo[level]) // 2
                self._put(level + 1, parent, g[i, j])

    def read(self, coords: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Packed values uint16 [N] at ``coords`` [N,2]: the first filled level from ``first`` [N] up to
        ``last`` [N] (inclusive); 0 where none is filled."""
        out = np.zeros(len(coords), np.uint16)
        todo = np.ones(len(coords), bool)
        last = np.minimum(last, self.num_levels - 1)
        for k in range(self.num_levels):
            lv = first + k
            for level_k in np.unique(lv[todo & (lv <= last)]):
                sel = np.flatnonzero(todo & (lv == level_k))
                ij = self.cells(coords[sel], int(level_k)) - self.lo[level_k]
                shape = self.grids[level_k].shape
                inside = (ij[:, 0] >= 0) & (ij[:, 0] < shape[0]) & (ij[:, 1] >= 0) & (ij[:, 1] < shape[1])
                sel, ij = sel[inside], ij[inside]
                out[sel] = self.grids[level_k][ij[:, 0], ij[:, 1]]
            todo &= out == 0
            if not todo.any():
                break
        return out

    @property
    def num_cells(self) -> int:
        return sum(g.size for g in self.grids)


# --- canvas -------------------------------------------------------------------------------------


@dataclass
class Uprights:
    """Pop-up points of upright pixels after latest-wins per voxel: ``points`` f32 [M,3] cm,
    ``packed`` uint16 [M], ``size`` f32 [M] (the source pixel's extent across the view, cm)."""

    points: np.ndarray
    packed: np.ndarray
    size: np.ndarray

    @classmethod
    def merge(
        cls, points: np.ndarray, packed: np.ndarray, extent: np.ndarray, params: CanvasParams
    ) -> Uprights:
        """One point per voxel, the latest winning; a point's voxel is the pyramid cell (cell_cm · 2^l,
        aligned to its multiples) just under half its pixel ``extent`` (cm), so that the pixels of
        one frame rarely share one."""
        if not len(points):
            return cls(np.zeros((0, 3), np.float32), np.zeros(0, np.uint16), np.zeros(0, np.float32))
        level = level_of(extent / 2.0, params)
        cell = params.cell_cm * 2.0 ** level.astype(np.float64)
        ijk = np.floor(points / cell[:, None]).astype(np.int64) + (1 << 20)
        ijk = np.clip(ijk, 0, (1 << 21) - 1)
        key = (level.astype(np.int64) << 63 - 4) | (ijk[:, 0] << 38) | (ijk[:, 1] << 17) | ijk[:, 2]
        order = np.lexsort((packed, key))
        last = np.ones(len(order), bool)
        last[:-1] = key[order[1:]] != key[order[:-1]]
        keep = order[last]
        return cls(points[keep].astype(np.float32), packed[keep], extent[keep].astype(np.float32))


@dataclass
class Canvas:
    """Ground pyramid (x, y cm), sky dome pyramid (azimuth, elevation) and pop-up points of packed
    static ids."""

    ground: Pyramid
    dome: Pyramid
    uprights: Uprights
    z: float
    centre: np.ndarray  # f64 [2]
    geometry: GeometryConfig
    params: CanvasParams

    def splat(self, cam: FrameCamera) -> tuple[np.ndarray, np.ndarray]:
        """The pop-up points seen by ``cam``: (packed uint16 [H·W], 0 where none; view depth f64
        [H·W], inf where none). Each point covers a square of its voxel's projected size (≤
        ``max_splat`` pixels); the nearest depth bin (relative width ``depth_tol``) wins, inside it the
        latest frame."""
        g, p = self.geometry, self.params
        h, w = g.dst_height, g.dst_width
        packed_out = np.zeros(h * w, np.uint16)
        depth_out = np.full(h * w, np.inf)
        up = self.uprights
        if not len(up.packed):
            return packed_out, depth_out
        dx, dy, depth, px_per_cm = project_dst(cam, up.points.astype(np.float64), g)
        with np.errstate(invalid="ignore"):
            k = np.clip(np.round(up.size * px_per_cm * self.params.splat_scale), 1, p.max_splat)
            ok = (depth > 1.0) & (dx > -k) & (dx < w + k) & (dy > -k) & (dy < h + k)
        sel = np.flatnonzero(ok)
        if not len(sel):
            return packed_out, depth_out
        k = k[sel].astype(np.int64)
        bins = np.floor(np.log(depth[sel]) / np.log1p(p.depth_tol)).astype(np.int64)
        key_pt = (bins << 16) | (0xFFFF - up.packed[sel].astype(np.int64))
        x0 = np.round(dx[sel] - (k - 1) / 2.0).astype(np.int64)
        y0 = np.round(dy[sel] - (k - 1) / 2.0).astype(np.int64)
        zbuf = np.full(h * w, np.iinfo(np.int64).max, np.int64)
        for kk in np.unique(k):
            m = np.flatnonzero(k == kk)
            oy, ox = np.divmod(np.arange(kk * kk), kk)
            xs = (x0[m, None] + ox[None, :]).ravel()
            ys = (y0[m, None] + oy[None, :]).ravel()
            keys = np.repeat(key_pt[m], kk * kk)
            inside = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
            np.minimum.at(zbuf, ys[inside] * w + xs[inside], keys[inside])
        zbuf = _close_holes(zbuf.reshape(h, w), p.fill_iters).reshape(-1)
        got = zbuf != np.iinfo(np.int64).max
        packed_out[got] = (0xFFFF - (zbuf[got] & 0xFFFF)).astype(np.uint16)
        depth_out[got] = np.exp((zbuf[got] >> 16) * np.log1p(p.depth_tol))
        return packed_out, depth_out

    def _read(self, pyr: Pyramid, coords: np.ndarray, stretch: np.ndarray) -> np.ndarray:
        """``pyr`` at ``coords`` from the level of the shortest extent (``stretch`` [N,2]) up to that of
        the longest plus ``max_fallback``."""
        p = self.params
        return pyr.read(
            coords, level_of(stretch[:, 0], p), level_of(stretch[:, 1], p, up=True) + p.max_fallback
        )

    def render(self, cam: FrameCamera) -> np.ndarray:
        """Static ids uint8 [H·W] seen by ``cam``, 255 where unseen."""
        g, p = self.geometry, self.params
        sx, sy = dst_sample_coords(g)
        hit = ground_hits(cam, sx, sy, g)
        packed = np.zeros(len(sx), np.uint16)
        on = np.flatnonzero(hit.on_disc(self.centre, p.radius_cm))
        packed[on] = self._read(self.ground, hit.coords[on], hit.stretch[on])
        if not cam.orthographic:
            off = np.flatnonzero(~hit.hit)
            coords, stretch = dome_coords(cam, sx[off], sy[off], g, p)
            packed[off] = self._read(self.dome, coords, stretch)
        up_packed, up_depth = self.splat(cam)
        # an upright point shows where nothing nearer is on the plane (its foot is on it: tolerance)
        front = (up_packed > 0) & (up_depth <= hit.depth * (1.0 + 2.0 * p.depth_tol))
        packed = np.where(front, up_packed, packed)
        return np.where(packed > 0, packed & 0xFF, UNKNOWN).astype(np.uint8)


def level_of(extent: np.ndarray, params: CanvasParams, up: bool = False) -> np.ndarray:
    """The pyramid level whose cell is the largest power-of-two multiple of cell_cm ≤ ``extent`` cm
    (``up``: the smallest ≥), clipped to the pyramid."""
    lv = np.log2(np.maximum(extent, _EPS) / params.cell_cm)
    return np.clip(np.ceil(lv) if up else np.floor(lv), 0, params.levels - 1).astype(np.int64)


def _cameras(world_to_clip: np.ndarray, world_to_view: np.ndarray, z: float, geometry: GeometryConfig):
    return [
        FrameCamera.of(m, v, z, geometry.src_width, geometry.src_height)
        for m, v in zip(np.asarray(world_to_clip), np.asarray(world_to_view), strict=True)
    ]


def build_canvas(
    cond_ids: np.ndarray,
    world_to_clip: np.ndarray,
    world_to_view: np.ndarray,
    z: float,
    geometry: GeometryConfig,
    params: CanvasParams = CanvasParams(),
    centre: np.ndarray | None = None,
) -> Canvas:
    """The canvases of frames ``cond_ids`` uint8 [F,H,W] with cameras [F,16] on the plane ``z``;
    frame order is time (later frames win). ``centre`` (xy cm) of the ground disc: default the mean
    eye."""
    cond_ids = np.asarray(cond_ids)
    if cond_ids.ndim != 3 or cond_ids.shape[1:] != (geometry.dst_height, geometry.dst_width):
        raise ValueError(
            f"cond ids: expected [F,{geometry.dst_height},{geometry.dst_width}], got {cond_ids.shape}"
        )
    if not 0 < len(cond_ids) <= 255:
        raise ValueError(f"1..255 canvas frames (stamps are 8 bits), got {len(cond_ids)}")
    cams = _cameras(world_to_clip, world_to_view, z, geometry)
    if len(cams) != len(cond_ids):
        raise ValueError(f"{len(cond_ids)} cond frames but {len(cams)} cameras")
    if centre is None:
        centre = np.mean([c.eye[:2] for c in cams], axis=0)
    centre = np.asarray(centre, np.float64)
    sx, sy = dst_sample_coords(geometry)
    hits = [ground_hits(cam, sx, sy, geometry) for cam in cams]
    roles = pixel_roles(cond_ids, cams, hits, geometry, params)
    ground, dome = Pyramid(params.cell_cm, params.levels), Pyramid(params.cell_cm, params.levels)
    h, w = geometry.dst_height, geometry.dst_width
    pts_all, packed_all, size_all = np.zeros((0, 3)), np.zeros(0, np.uint16), np.zeros(0)
    for f, cam in enumerate(cams):
        flat = cond_ids[f].reshape(-1)
        packed = (((f + 1) << 8) | flat.astype(np.uint16)).astype(np.uint16)
        hit = hits[f]
        # ground: the level of the shortest extent (sharp; foreshortened rows leave gaps that reads
        # fill from coarser levels)
        on = np.flatnonzero((roles[f] == ROLE_GROUND) & hit.on_disc(centre, params.radius_cm))
        _write_levels(ground, hit.coords[on], packed[on], level_of(hit.stretch[on, 0], params))
        if not cam.orthographic:
            sky = np.flatnonzero((roles[f] == ROLE_SKY) & ~hit.hit)
            coords, stretch = dome_coords(cam, sx[sky], sy[sky], geometry, params)
            _write_levels(dome, coords, packed[sky], level_of(stretch[:, 1], params))
        pts, idx = upright_points(roles[f], flat, cam, hit, sx, sy, geometry)
        _, _, pt_depth, px_per_cm = project_dst(cam, pts, geometry)
        # latest wins along the rays: this frame's view replaces earlier points it sees through
        seen = _plane_depth(roles[f], hit)
        seen[idx] = pt_depth
        if len(pts_all):
            keep = ~_through_or_before(cam, pts_all, seen, params.carve_tol, geometry)[0]
            pts_all, packed_all, size_all = pts_all[keep], packed_all[keep], size_all[keep]
        pts_all = np.concatenate([pts_all, pts])
        packed_all = np.concatenate([packed_all, packed[idx]])
        size_all = np.concatenate([size_all, 1.0 / np.maximum(px_per_cm, _EPS)])
    if params.carve_votes > 0 and len(pts_all):
        # free space: the frames whose exact view (ground, sky; away from silhouettes) passes through
        # a point, against those that see something at or before it, vote it out
        through = np.zeros(len(pts_all), np.int64)
        support = np.zeros(len(pts_all), np.int64)
        stamp = packed_all >> 8
        for f, cam in enumerate(cams):
            exact = _plane_depth(roles[f], hits[f])
            eroded = _min3x3(np.nan_to_num(exact, nan=-np.inf).reshape(h, w)).reshape(-1)
            other = stamp != f + 1
            thr, sup = _through_or_before(cam, pts_all, eroded, params.carve_all_tol, geometry)
            through += thr & other
            support += sup & other
        keep = through <= params.carve_votes * (through + support)
        pts_all, packed_all, size_all = pts_all[keep], packed_all[keep], size_all[keep]
    for pyr in (ground, dome):
        pyr.propagate()
    uprights = Uprights.merge(pts_all, packed_all, size_all, params)
    return Canvas(ground, dome, uprights, float(z), centre, geometry, params)


def _plane_depth(role: np.ndarray, hit: GroundHits) -> np.ndarray:
    """View depth f64 [H·W] of what one frame's plane layers show: its ground pixels' plane depth, inf
    for its sky pixels, NaN elsewhere."""
    depth = np.full(len(role), np.nan)
    ground = role == ROLE_GROUND
    depth[ground] = hit.depth[ground]
    depth[role == ROLE_SKY] = np.inf
    return depth


def _through_or_before(
    cam: FrameCamera, points: np.ndarray, seen: np.ndarray, tol: float, geometry: GeometryConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(through, before) bool [N]: ``cam``'s pixel at each point sees farther than the point by more
    than ``tol`` / sees something at most that far. ``seen``: view depth f64 [H·W] of what each pixel
    shows, inf for sky, NaN / −inf where unknown (neither)."""
    h, w = geometry.dst_height, geometry.dst_width
    dx, dy, depth, _ = project_dst(cam, points, geometry)
    with np.errstate(invalid="ignore"):
        ix, iy = np.round(dx), np.round(dy)
        inside = (depth > 0) & (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    pix = (iy[inside] * w + ix[inside]).astype(np.int64)
    through, before = np.zeros(len(points), bool), np.zeros(len(points), bool)
    with np.errstate(invalid="ignore"):
        lim = depth[inside] * (1.0 + tol)
        through[inside] = seen[pix] > lim
        before[inside] = np.isfinite(seen[pix]) & (seen[pix] > 0) & (seen[pix] <= lim)
    return through, before


def _min3x3(a: np.ndarray) -> np.ndarray:
    """Minimum over each pixel's 3×3 neighbourhood (edge pixels over the part inside)."""
    p = np.pad(a, 1, mode="edge")
    h, w = a.shape
    return np.min([p[i : i + h, j : j + w] for i in range(3) for j in range(3)], axis=0)


def _write_levels(pyr: Pyramid, coords: np.ndarray, packed: np.ndarray, levels: np.ndarray) -> None:
    for level in np.unique(levels):
        pyr.write(int(level), coords[levels == level], packed[levels == level])


def render_static(canvas: Canvas, world_to_clip: Any, world_to_view: Any) -> np.ndarray:
    """The canvas seen by one camera: static ids uint8 [H,W], 255 where unseen."""
    geom = canvas.geometry
    cam = FrameCamera.of(world_to_clip, world_to_view, canvas.z, geom.src_width, geom.src_height)
    return canvas.render(cam).reshape(geom.dst_height, geom.dst_width)


def render_frame(canvas: Canvas, world_to_clip: Any, world_to_view: Any, capsules: Any) -> np.ndarray:
    """``render_static`` with both actors' capsules drawn on top: parts ids uint8 [H,W]."""
    bg = render_static(canvas, world_to_clip, world_to_view)
    return render_capsules(capsules, world_to_clip, world_to_view, bg, canvas.geometry)


# --- the clip-level entry points ------------------------------------------------------------------


def canvas_plane_z(meta: dict[str, np.ndarray], timeline: TimelineConfig) -> float:
    """The ground plane of a clip: median of meta ground_z over the clip frames (robust to jumps)."""
    gz = np.asarray(meta["ground_z"][: timeline.num_frames], np.float64)
    gz = gz[np.isfinite(gz)]
    return float(np.median(gz)) if len(gz) else 0.0


def clip_canvas(
    cond_ids: np.ndarray,
    meta: dict[str, np.ndarray],
    geometry: GeometryConfig,
    timeline: TimelineConfig,
    params: CanvasParams = CanvasParams(),
    frames: slice | None = None,
) -> Canvas:
    """The canvas of a clip's frames 0..80 (or ``frames`` of them) from cond ids [81,H,W] and meta."""
    sel = frames or slice(0, timeline.num_frames)
    n = timeline.num_frames
    idx = np.arange(n)[sel]
    return build_canvas(
        np.asarray(cond_ids)[idx],
        np.asarray(meta["world_to_clip"])[idx],
        np.asarray(meta["world_to_view"])[idx],
        canvas_plane_z(meta, timeline),
        geometry,
        params,
    )


def render_frames(canvas: Canvas, meta: dict[str, np.ndarray], frames: Any) -> np.ndarray:
    """Re-render meta frames (indices into meta's F axis) with capsules: uint8 [len(frames),H,W]."""
    frames = list(frames)
    g = canvas.geometry
    out = np.empty((len(frames), g.dst_height, g.dst_width), np.uint8)
    for i, f in enumerate(frames):
        out[i] = render_frame(canvas, meta["world_to_clip"][f], meta["world_to_view"][f], meta["capsules"][f])
    return out


def ext_canvas_ids(
    cond_ids: np.ndarray,
    meta: dict[str, np.ndarray],
    geometry: GeometryConfig,
    timeline: TimelineConfig,
    params: CanvasParams = CanvasParams(),
) -> np.ndarray:
    """Extension frames s+81..s+108 re-rendered from the canvas of frames s..s+80: uint8 [28,H,W].

    ``meta`` must hold the extension frames (F = 81 + 28, a has_ext clip)."""
    n, e = timeline.num_frames, timeline.num_ext_frames
    if len(meta["world_to_clip"]) < n + e:
        raise ValueError(f"meta has {len(meta['world_to_clip'])} frames; the extension needs {n + e}")
    canvas = clip_canvas(cond_ids, meta, geometry, timeline, params)
    return render_frames(canvas, meta, range(n, n + e))


def build_ext_canvas(
    cond_ids: np.ndarray,
    meta: dict[str, np.ndarray],
    blocks: np.ndarray,
    prompts: np.ndarray,
    geometry: GeometryConfig,
    timeline: TimelineConfig,
    params: CanvasParams = CanvasParams(),
) -> dict[str, np.ndarray]:
    """The cond_ext_canvas arrays: ids uint8 [28,H,W], blocks uint8 [7,5], prompts [7] (the raw
    cond_ext's blocks and prompts)."""
    return {
        "ids": ext_canvas_ids(cond_ids, meta, geometry, timeline, params),
        "blocks": np.asarray(blocks, np.uint8),
        "prompts": np.asarray(prompts, dtype=str),
    }


# --- measurement helpers (bench/probes/ext_canvas_stats.py, tests) --------------------------------------


def static_agreement(rendered: np.ndarray, real: np.ndarray) -> dict[str, float]:
    """Compare re-rendered frames with real cond frames on the real frames' static pixels.

    agreement = equal ids among real-static pixels the render shows as static (known, no character);
    coverage = fraction of real-static pixels the render shows as static; unknown = 255 fraction of
    all pixels of the render."""
    r, t = np.asarray(rendered), np.asarray(real)
    real_static = t < NUM_STATIC
    both = real_static & (r < NUM_STATIC)
    nb, ns = int(both.sum()), int(real_static.sum())
    return {
        "agreement": float((r[both] == t[both]).mean()) if nb else float("nan"),
        "coverage": nb / ns if ns else float("nan"),
        "unknown": float((r == UNKNOWN).mean()),
        "num_compared": nb,
    }
