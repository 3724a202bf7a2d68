"""SPEC §8 stage 3: the extension canvas (``cond_ext_canvas/<clip_id>.npz``).

For clips whose look changes at s+81 (``ClipRow.ext_look_change``) the raw extension condition
pops; stage 3 uses a condition re-rendered from what frames s…s+80 showed instead.

1. **Canvas.** Every static pixel (raw 0..6) of the 81 clip frames of ``cond`` is placed in the world
   by its frame's camera (``meta``); where several land on one cell the latest frame wins. The world
   model is a ground plane inside a vertical cylinder (``radius_cm`` around the mean eye of the
   canvas frames, xy):

   * **ground**: a pixel whose ray meets the plane z = z₀ (median of ``meta.ground_z`` over the
     clip frames: the player's feet; robust to jumps) in front of the camera and inside the cylinder
     goes to cell (x, y) cm. Upright things (walls, trees, props) are smeared onto the ground behind
     them; that re-projects exactly from the same camera and approximately from nearby ones;
   * **wall** (perspective frames): every other ray (above the horizon, or meeting the ground beyond
     the cylinder: sky, distant buildings, far ground) goes to where it leaves the cylinder, cell
     (arc θ·R, z) cm. A finite wall keeps the parallax of distant content that a direction-only
     dome (content at infinity) loses when the camera travels metres in a clip.

   Ortho frames only use the ground (their rays are parallel; in the SPEC's ortho rig all of them
   meet the ground); their misses stay unseen.

2. **Re-render.** Each extension frame s+81…s+108 places its pixels the same way and reads the
   canvases; cells never filled give 255 (UNKNOWN, the code world's unseen semantics). Characters
   are drawn on top from the meta capsules with ``capsules.render_capsules`` (no scene occlusion).

Resolution and extent. Each canvas is a **mip pyramid** of ``levels`` dense uint16 grids with cell
``cell_cm · 2^l`` (default 2 cm … 65 km: the levels in use are set by the data), cells aligned to
world multiples so that level l+1 cell = level l cell // 2. A destination pixel covers an
anisotropic patch on the ground (short across, long in depth when foreshortened): the singular values
of the pixel → plane Jacobian (analytic from the plane homography) give its shortest and longest
extent; on the wall they are t·(smallest / largest adjacent-pixel ray angle), the largest divided by
the cosine of incidence. A ground pixel is written to the level whose cell is the largest ≤ its
shortest extent, so distinct pixels rarely share a cell; a wall pixel to the level of its longest
extent, so that each frame covers the wall region it sees completely (finer wall cells fill as a
mosaic of frames whose parallax differs: speckle). After all frames every filled cell is propagated
to the coarser levels (latest wins). A re-rendered pixel reads from the level of its
shortest extent up to the level of its longest extent plus ``max_fallback``, the first filled cell
winning: this fills the gaps between foreshortened rows and bounds how far the seen region bleeds
into the unseen (about 2^max_fallback of the pixel's own extent). Each level is a dense array over
the index box written so far, grown with a margin when a write falls outside; the ground is bounded
by the cylinder, so a clip's canvas is ~20–25 M cells (40–50 MB) at 832×480; building it takes
~7 s on one core, each re-rendered frame ~0.1 s.

Values are packed uint16 ``(stamp << 8) | id`` with stamp = source frame + 1, combined with
``np.maximum.at``: a later frame always wins, ties inside one frame go to the larger id
(deterministic). Everything is vectorised numpy over pixels; loops run over frames and levels.

Measured on the code world with bench/ext_canvas_stats.py (beside the SPEC's 97–98 % static
agreement on in-look frames and ~17 % unknown in extension frames). Ground classes agree up to
resolution; upright ones carry the ground-plane smear, whose error grows with camera travel and
turning, and a later frame's smear overwrites earlier direct views of the ground (latest wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gc25d_core.capsules import as_matrix, render_capsules
from gc25d_core.config import GeometryConfig, TimelineConfig
from gc25d_core.geometry import index_maps
from gc25d_core.vocab import UNKNOWN

NUM_STATIC = 7  # raw 0..6
_EPS = 1e-12


@dataclass(frozen=True)
class CanvasParams:
    """Canvas resolution and extent (see the module docstring)."""

    radius_cm: float = 5000.0
    cell_cm: float = 2.0
    levels: int = 16
    max_fallback: int = 1

    def __post_init__(self) -> None:
        if self.radius_cm <= 0 or self.cell_cm <= 0 or self.levels < 1 or self.max_fallback < 0:
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


def plane_to_src(world_to_clip: Any, z: float, width: int, height: int) -> np.ndarray:
    """3×3 homography of the plane z: (x, y, 1) → (sx·w, sy·w, w), w = clip w (> 0 in front for
    perspective cameras), sx, sy source pixel coordinates (centres at integers, capsules.py convention)."""
    m = as_matrix(world_to_clip, "world_to_clip")
    rows = m[[0, 1, 3]]
    p = np.stack([rows[:, 0], rows[:, 1], rows[:, 2] * z + rows[:, 3]], axis=1)
    k = np.array([[width / 2, 0.0, width / 2 - 0.5], [0.0, -height / 2, height / 2 - 0.5], [0.0, 0.0, 1.0]])
    return k @ p


def sample_grid(geometry: GeometryConfig) -> tuple[np.ndarray, np.ndarray]:
    """(sx, sy) f64 [H·W]: the source pixel each destination pixel samples (as resample_ids does)."""
    idx_y, idx_x = index_maps(geometry)
    sx = np.broadcast_to(idx_x.astype(np.float64)[None, :], (geometry.dst_height, geometry.dst_width))
    sy = np.broadcast_to(idx_y.astype(np.float64)[:, None], (geometry.dst_height, geometry.dst_width))
    return sx.ravel(), sy.ravel()


def ray_dirs(cam: FrameCamera, sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """Unit world ray directions f64 [N,3] of source pixels (sx, sy) [N].

    The ray of NDC (nx, ny) lies in the planes (M0 − nx·M3)·X̃ = 0 and (M1 − ny·M3)·X̃ = 0, so its
    direction is the cross product of their normals, oriented so that view depth grows along it.
    """
    m = cam.world_to_clip
    nx = (np.asarray(sx, np.float64) + 0.5) * 2.0 / cam.width - 1.0
    ny = 1.0 - (np.asarray(sy, np.float64) + 0.5) * 2.0 / cam.height
    c01 = np.cross(m[0, :3], m[1, :3])
    c03 = np.cross(m[0, :3], m[3, :3])
    c31 = np.cross(m[3, :3], m[1, :3])
    d = c01[None, :] - ny[:, None] * c03[None, :] - nx[:, None] * c31[None, :]
    sign = np.sign(d @ cam.world_to_view[2, :3])
    d = d * np.where(sign == 0, 1.0, sign)[:, None]
    return d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), _EPS)


def pixel_angles(cam: FrameCamera, geometry: GeometryConfig) -> tuple[float, float]:
    """(smallest, largest) angle in rad between the rays of adjacent destination pixels: at the image
    corners and at the centre (perspective pixels subtend less towards the corners)."""
    sx, sy = sample_grid(geometry)
    w, h = geometry.dst_width, geometry.dst_height
    at = np.array([0, w - 2, (h - 2) * w, (h - 2) * w + w - 2, (h // 2) * w + w // 2])
    pairs = np.concatenate([np.stack([at, at + 1], 1), np.stack([at, at + w], 1)]).ravel()
    d = ray_dirs(cam, sx[pairs], sy[pairs]).reshape(-1, 2, 3)
    ang = np.arccos(np.clip((d[:, 0] * d[:, 1]).sum(1), -1.0, 1.0))
    return float(max(ang.min(), 1e-9)), float(max(ang.max(), 1e-9))


@dataclass(frozen=True)
class PixelPlacement:
    """Where pixels land: the ground canvas (x, y) cm or the wall canvas (arc, z) cm, each with the
    (min, max) ground / wall extent of one destination pixel step (cm)."""

    ground: np.ndarray  # bool [N]
    wall: np.ndarray  # bool [N]
    coords: np.ndarray  # f64 [N,2]: (x, y) where ground, (arc length θ·R, z) where wall
    stretch: np.ndarray  # f64 [N,2] (min, max) cm


def place_pixels(
    cam: FrameCamera,
    sx: np.ndarray,
    sy: np.ndarray,
    geometry: GeometryConfig,
    centre: np.ndarray,
    radius: float,
) -> PixelPlacement:
    """Ground points inside the cylinder (``centre`` xy, ``radius`` cm), else wall points (perspective
    cameras only), of source sample positions (sx, sy) [N]."""
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
        ground = hit & (np.hypot(x - centre[0], y - centre[1]) <= radius)
    coords = np.stack([x, y], axis=1)
    wall = np.zeros_like(ground)
    if not cam.orthographic and not ground.all():
        far = np.flatnonzero(~ground)
        w_ok, w_coords, w_stretch = _wall(cam, sx[far], sy[far], geometry, centre, radius)
        wall[far[w_ok]] = True
        coords[far[w_ok]] = w_coords[w_ok]
        stretch[far[w_ok]] = w_stretch[w_ok]
    return PixelPlacement(ground, wall, coords, stretch)


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


def _wall(
    cam: FrameCamera,
    sx: np.ndarray,
    sy: np.ndarray,
    geometry: GeometryConfig,
    centre: np.ndarray,
    radius: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eye rays against the vertical cylinder (centre xy, radius): (ok bool [N], (θ·R, z) f64 [N,2],
    stretch (min, max) f64 [N,2]). From inside the cylinder a ray leaves through its far root; from
    outside it enters through the near one."""
    d = ray_dirs(cam, sx, sy)
    o = cam.eye[:2] - centre[:2]
    qa = d[:, 0] ** 2 + d[:, 1] ** 2
    qb = o[0] * d[:, 0] + o[1] * d[:, 1]
    qc = float(o @ o) - radius * radius
    with np.errstate(invalid="ignore", divide="ignore"):
        disc = np.sqrt(qb * qb - qa * qc)
        t = (-qb + disc) / qa if qc <= 0 else (-qb - disc) / qa
    ok = np.isfinite(t) & (t > 0) & (qa > _EPS)
    t = np.where(ok, t, 0.0)
    p = cam.eye[None, :] + t[:, None] * d
    theta = np.arctan2(p[:, 1] - centre[1], p[:, 0] - centre[0])
    coords = np.stack([theta * radius, p[:, 2]], axis=1)
    normal = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    cos_inc = np.abs((d[:, :2] * normal).sum(1))
    a_min, a_max = pixel_angles(cam, geometry)
    stretch = np.stack([t * a_min, t * a_max / np.maximum(cos_inc, 0.05)], axis=1)
    return ok, coords, stretch


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
class Canvas:
    """Ground pyramid (x, y cm) + wall pyramid (arc θ·R, z cm) of packed static ids."""

    ground: Pyramid
    wall: Pyramid
    z: float
    centre: np.ndarray  # f64 [2]
    geometry: GeometryConfig
    params: CanvasParams

    def read(self, pl: PixelPlacement) -> np.ndarray:
        """Static ids uint8 [N] of placed pixels, 255 where unseen."""
        packed = np.zeros(len(pl.ground), np.uint16)
        for which, pyr in ((pl.ground, self.ground), (pl.wall, self.wall)):
            i = np.flatnonzero(which)
            first = level_of(pl.stretch[i, 0], self.params)
            last = level_of(pl.stretch[i, 1], self.params, up=True) + self.params.max_fallback
            packed[i] = pyr.read(pl.coords[i], first, last)
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
    frame order is time (later frames win). ``centre`` (xy cm) of the cylinder: default the mean eye."""
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
    sx, sy = sample_grid(geometry)
    pyramids = [Pyramid(params.cell_cm, params.levels), Pyramid(params.cell_cm, params.levels)]
    for f, cam in enumerate(cams):
        flat = cond_ids[f].reshape(-1)
        pix = np.flatnonzero(flat < NUM_STATIC)
        pl = place_pixels(cam, sx[pix], sy[pix], geometry, centre, params.radius_cm)
        packed = (((f + 1) << 8) | flat[pix].astype(np.uint16)).astype(np.uint16)
        # ground: the level of the shortest extent (sharp; foreshortened rows leave gaps that reads
        # fill from coarser levels); wall: of the longest (its pixels are nearly isotropic, and full
        # coverage keeps one frame per region instead of a mosaic of frames with parallax)
        for which, pyr, col in ((pl.ground, pyramids[0], 0), (pl.wall, pyramids[1], 1)):
            lv = level_of(pl.stretch[which, col], params)
            coords, pk = pl.coords[which], packed[which]
            for level in np.unique(lv):
                pyr.write(int(level), coords[lv == level], pk[lv == level])
    for pyr in pyramids:
        pyr.propagate()
    return Canvas(pyramids[0], pyramids[1], float(z), centre, geometry, params)


def render_static(canvas: Canvas, world_to_clip: Any, world_to_view: Any) -> np.ndarray:
    """The canvas seen by one camera: static ids uint8 [H,W], 255 where unseen."""
    geom = canvas.geometry
    cam = FrameCamera.of(world_to_clip, world_to_view, canvas.z, geom.src_width, geom.src_height)
    sx, sy = sample_grid(geom)
    pl = place_pixels(cam, sx, sy, geom, canvas.centre, canvas.params.radius_cm)
    return canvas.read(pl).reshape(geom.dst_height, geom.dst_width)


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


# --- measurement helpers (bench/ext_canvas_stats.py, tests) --------------------------------------


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
