"""SPEC §3: character capsules, ray-cast part labelling, capsule rendering and ground points.

Capsules
    Each actor (index 0 = player, 1 = boss) carries 12 capsules of 7 floats
    ``(ax, ay, az, bx, by, bz, radius)``: the segment a→b swept by a sphere of ``radius``, world cm,
    z up. Arrays are f32 ``[2, 12, 7]`` per frame and ``[F, 2, 12, 7]`` per clip (meta ``capsules``).
    The capsule order is fixed and maps to the six parts of ``vocab.PART_NAMES``:

        index  capsule        part          player id  boss id
        0      pelvis         core          10         11
        1      torso          core          10         11
        2      head           core          10         11
        3      l_upper_arm    l_arm         12         17
        4      l_forearm      l_arm         12         17
        5      r_upper_arm    r_arm         13         18
        6      r_forearm      r_arm         13         18
        7      l_thigh        l_leg         14         19
        8      l_shin         l_leg         14         19
        9      r_thigh        r_leg         15         20
        10     r_shin         r_leg         15         20
        11     weapon         weapon        16         21

Cameras
    ``world_to_clip`` / ``world_to_view`` follow raw_layout.py: 4×4 row-major (or flat 16), column
    vectors, clip = M @ [x, y, z, 1]; NDC x right, y up; source pixel x = (ndc_x + 1)/2·W − 0.5,
    y = (1 − ndc_y)/2·H − 0.5. View space: x right, y up, z = depth (positive in front of the camera),
    as UE's view space. Nothing else about the projection (reverse-Z, near plane, perspective or
    orthographic) is assumed: a pixel's ray is the intersection of the two clip-space planes
    ``clip_x = ndc_x · clip_w`` and ``clip_y = ndc_y · clip_w``, oriented so depth grows along it.

Pixel rays
    A ray starts at the point of view depth 0 on its line (the eye for perspective cameras, the
    camera plane for orthographic ones) and ``t`` is the distance along its unit direction.
    ``label_parts`` and ``render_capsules`` work on destination-resolution ids (832×480 for v10): the
    ray of destination pixel (i, j) goes through the centre of the source pixel that
    ``geometry.resample_ids`` samples for it (``index_maps``), so the labels agree exactly with a
    labelling done at source resolution followed by ``resample_ids``. ``ground_points`` and
    ``project_points`` use continuous destination coordinates (``geometry.src_to_dst``).

Everything is vectorised numpy; a capsule is only tested against pixels inside its projected
bounding box.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import dst_to_src, index_maps, src_to_dst
from gc25d_core.vocab import BOSS_PART_IDS, PLAYER_PART_IDS, check_ids

V10 = GeometryConfig()
ACTORS: tuple[str, str] = ("player", "boss")
NUM_ACTORS = 2
NUM_CAPSULES = 12
CAPSULE_FLOATS = 7
CAPSULE_NAMES: tuple[str, ...] = (
    "pelvis",
    "torso",
    "head",
    "l_upper_arm",
    "l_forearm",
    "r_upper_arm",
    "r_forearm",
    "l_thigh",
    "l_shin",
    "r_thigh",
    "r_shin",
    "weapon",
)
CAPSULE_PART: tuple[int, ...] = (0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5)
"""capsule index → part index into ``vocab.PART_NAMES`` (core, l_arm, r_arm, l_leg, r_leg, weapon)."""
ACTOR_PART_IDS: tuple[tuple[int, ...], tuple[int, ...]] = (PLAYER_PART_IDS, BOSS_PART_IDS)
ACTOR_CORE_IDS: tuple[int, int] = (PLAYER_PART_IDS[0], BOSS_PART_IDS[0])

CAPSULE_PART_IDS = np.array(
    [[ACTOR_PART_IDS[a][CAPSULE_PART[c]] for c in range(NUM_CAPSULES)] for a in range(NUM_ACTORS)],
    dtype=np.uint8,
)
"""uint8 [2, 12]: raw part id of (actor, capsule)."""
CAPSULE_PART_IDS.setflags(write=False)

_MISS = -1


# --- (de)serialisation --------------------------------------------------------------------------


def check_capsules(arr: Any, where: str = "capsules") -> np.ndarray:
    """Validate one frame's capsules → f32 [2, 12, 7] (finite, radius ≥ 0)."""
    a = np.asarray(arr, dtype=np.float32)
    if a.shape != (NUM_ACTORS, NUM_CAPSULES, CAPSULE_FLOATS):
        raise ValueError(f"{where}: expected shape [2,12,7], got {list(a.shape)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{where}: holds non-finite values")
    if (a[..., 6] < 0).any():
        raise ValueError(f"{where}: negative radius")
    return a


def _capsules_field(frame: Any) -> Any:
    """The ``capsules`` mapping of a FrameJson, a frame.json dict, or the mapping itself."""
    if hasattr(frame, "capsules") and not isinstance(frame, Mapping):
        return frame.capsules
    if isinstance(frame, Mapping) and "capsules" in frame:
        return frame["capsules"]
    return frame


def capsules_from_json(frame: Any) -> np.ndarray:
    """A FrameJson, a parsed frame.json dict, or its ``capsules`` field → f32 [2, 12, 7].

    The mapping holds ``{"player": 12 × [ax, ay, az, bx, by, bz, r], "boss": ...}``.
    """
    field = _capsules_field(frame)
    if not isinstance(field, Mapping):
        raise ValueError(f"capsules: expected a mapping with 'player' and 'boss', got {type(field).__name__}")
    rows = []
    for actor in ACTORS:
        if actor not in field:
            raise ValueError(f"capsules: missing actor {actor!r}")
        a = np.asarray(field[actor], dtype=np.float32)
        if a.shape != (NUM_CAPSULES, CAPSULE_FLOATS):
            raise ValueError(
                f"capsules[{actor!r}]: expected 12 capsules of 7 floats, got shape {list(a.shape)}"
            )
        rows.append(a)
    return check_capsules(np.stack(rows))


def _one_frame(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.ndim == 3:
        return check_capsules(x)
    return capsules_from_json(x)


def capsules_to_array(frames: Iterable[Any]) -> np.ndarray:
    """Per-frame capsules (FrameJson, frame.json dicts, capsule mappings or [2,12,7] arrays) → f32 [F,2,12,7]."""
    out = [_one_frame(x) for x in frames]
    if not out:
        return np.zeros((0, NUM_ACTORS, NUM_CAPSULES, CAPSULE_FLOATS), np.float32)
    return np.stack(out).astype(np.float32)


def capsules_from_array(arr: np.ndarray) -> list[dict[str, list[list[float]]]]:
    """f32 [F,2,12,7] (or one frame [2,12,7]) → per-frame ``capsules`` mappings as written in frame.json."""
    a = np.asarray(arr, dtype=np.float32)
    frames = a[None] if a.ndim == 3 else a
    if frames.ndim != 4 or frames.shape[1:] != (NUM_ACTORS, NUM_CAPSULES, CAPSULE_FLOATS):
        raise ValueError(f"capsules array: expected [F,2,12,7] or [2,12,7], got {list(a.shape)}")
    return [
        {actor: [[float(v) for v in cap] for cap in f[i]] for i, actor in enumerate(ACTORS)} for f in frames
    ]


def as_matrix(m: Any, name: str = "matrix") -> np.ndarray:
    """A flat 16-list (row-major) or a [4,4] array → f64 [4,4]."""
    a = np.asarray(m, dtype=np.float64)
    if a.shape == (16,):
        a = a.reshape(4, 4)
    if a.shape != (4, 4):
        raise ValueError(f"{name}: expected 16 floats (row-major 4x4), got shape {list(a.shape)}")
    bad = np.argwhere(~np.isfinite(a))
    if len(bad):
        r, c = (int(i) for i in bad[0])
        raise ValueError(f"{name}: {len(bad)} non-finite values, first [{r},{c}] = {a[r, c]}")
    return a


# --- rays ---------------------------------------------------------------------------------------


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


@dataclass(frozen=True)
class PixelRays:
    """World rays through source pixel positions.

    src_x, src_y: f64 [N] source pixel coordinates (centres at integers).
    origin:       f64 [N,3] the ray's point at view depth 0 (world cm).
    direction:    f64 [N,3] unit, pointing into the scene (NaN where the camera has no such ray).
    world_to_clip: f64 [4,4]; width, height: the source frame size the NDC mapping uses.
    grid: optional (gx f64 [W'], gy f64 [H']) when the rays are the row-major grid gy × gx of
    non-decreasing coordinates; culling then slices instead of testing every ray.
    """

    src_x: np.ndarray
    src_y: np.ndarray
    origin: np.ndarray
    direction: np.ndarray
    world_to_clip: np.ndarray
    width: int
    height: int
    grid: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def on_grid(
        cls, gx: Any, gy: Any, world_to_clip: Any, world_to_view: Any, width: int, height: int
    ) -> PixelRays:
        """Rays of the row-major grid gy × gx (non-decreasing source pixel coordinates)."""
        gx = np.asarray(gx, dtype=np.float64)
        gy = np.asarray(gy, dtype=np.float64)
        xs = np.broadcast_to(gx[None, :], (len(gy), len(gx)))
        ys = np.broadcast_to(gy[:, None], (len(gy), len(gx)))
        r = cls.through(xs, ys, world_to_clip, world_to_view, width, height)
        return dataclasses.replace(r, grid=(gx, gy))

    @classmethod
    def through(
        cls, src_x: Any, src_y: Any, world_to_clip: Any, world_to_view: Any, width: int, height: int
    ) -> PixelRays:
        """Rays through the given source pixel coordinates (any shape, flattened to [N])."""
        m = as_matrix(world_to_clip, "world_to_clip")
        v = as_matrix(world_to_view, "world_to_view")
        x = np.asarray(src_x, dtype=np.float64).ravel()
        y = np.asarray(src_y, dtype=np.float64).ravel()
        nx = (x + 0.5) * (2.0 / width) - 1.0
        ny = 1.0 - (y + 0.5) * (2.0 / height)
        # The ray is the line of points p with n1·p = h1 and n2·p = h2, where
        #   n1 = A0 − nx·A3, h1 = nx·b3 − b0,   n2 = A1 − ny·A3, h2 = ny·b3 − b1   (A = M[:, :3], b = M[:, 3]).
        # Its direction n1 × n2 = A0×A1 + nx·(A1×A3) + ny·(A3×A0) is affine in (nx, ny), and its point at
        # view depth 0 (f·p = −c, f = V[2,:3], c = V[2,3]) follows from Cramer's rule with det = f·(n1×n2).
        a_, b_ = m[:, :3], m[:, 3]
        f, c = v[2, :3], v[2, 3]
        k0, k1, k2 = np.cross(a_[0], a_[1]), np.cross(a_[1], a_[3]), np.cross(a_[3], a_[0])
        h1 = nx * b_[3] - b_[0]
        h2 = ny * b_[3] - b_[1]
        d = [k0[i] + nx * k1[i] + ny * k2[i] for i in range(3)]
        det = f @ k0 + nx * (f @ k1) + ny * (f @ k2)
        u0, u1 = np.cross(a_[1], f), np.cross(a_[3], f)  # n2 × f = u0 − ny·u1
        w0, w1 = np.cross(f, a_[0]), np.cross(f, a_[3])  # f × n1 = w0 − nx·w1
        with np.errstate(invalid="ignore", divide="ignore"):
            inv_det = 1.0 / det
            origin = np.stack(
                [
                    (h1 * (u0[i] - ny * u1[i]) + h2 * (w0[i] - nx * w1[i]) - c * d[i]) * inv_det
                    for i in range(3)
                ],
                axis=1,
            )
            length = np.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
            scale = np.sign(det) / length
            direction = np.stack([di * scale for di in d], axis=1)
            depth_rate = np.abs(det) / length  # depth change per unit length along the ray
        bad = ~(depth_rate > 1e-12)
        if bad.any():
            origin[bad] = np.nan
            direction[bad] = np.nan
        return cls(x, y, origin, direction, m, int(width), int(height))

    def __len__(self) -> int:
        return len(self.src_x)

    def candidates(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Indices of rays whose pixel lies in the projected bounding box of the world AABB [lo, hi]
        (f64 [3] each)."""
        return self.in_box(bbox_src(lo, hi, self.world_to_clip, self.width, self.height))

    def in_box(self, box: Any, margin: float = 1.5) -> np.ndarray:
        """Indices of rays whose pixel lies in the source-pixel box (x0, y0, x1, y1) ± margin."""
        x0, y0, x1, y1 = (float(v) for v in box)
        x0, y0, x1, y1 = x0 - margin, y0 - margin, x1 + margin, y1 + margin
        if not (x0 <= x1 and y0 <= y1):
            return np.zeros(0, np.intp)
        if self.grid is not None:
            gx, gy = self.grid
            i0, i1 = np.searchsorted(gx, x0), np.searchsorted(gx, x1, side="right")
            j0, j1 = np.searchsorted(gy, y0), np.searchsorted(gy, y1, side="right")
            return (np.arange(j0, j1)[:, None] * len(gx) + np.arange(i0, i1)[None, :]).ravel()
        return np.flatnonzero(
            (self.src_x >= x0) & (self.src_x <= x1) & (self.src_y >= y0) & (self.src_y <= y1)
        )

    def at(self, t: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """World points o + t·d, f64 [N,3] (or of the rays ``idx``)."""
        o = self.origin if idx is None else self.origin[idx]
        d = self.direction if idx is None else self.direction[idx]
        return o + np.asarray(t, dtype=np.float64)[:, None] * d


def project_src(
    points: Any, world_to_clip: Any, width: int, height: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """World points [...,3] → (source pixel x [...], y [...], clip w [...]); w ≤ 0 means behind the camera."""
    m = as_matrix(world_to_clip, "world_to_clip")
    p = np.asarray(points, dtype=np.float64)
    clip = p @ m[:, :3].T + m[:, 3]  # [...,4]
    w = clip[..., 3]
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (clip[..., 0] / w + 1.0) * 0.5 * width - 0.5
        y = (1.0 - clip[..., 1] / w) * 0.5 * height - 0.5
    return x, y, w


_CORNERS = np.array([[i, j, k] for i in (0, 1) for j in (0, 1) for k in (0, 1)], dtype=np.float64)
_EDGES = np.array([(i, j) for i in range(8) for j in range(i + 1, 8) if bin(i ^ j).count("1") == 1])
_W_EPS = 1e-6
EMPTY_BOX = (np.inf, np.inf, -np.inf, -np.inf)


def _clipped_box(corners: np.ndarray, w: np.ndarray, m: np.ndarray, width: int, height: int):
    front = w > _W_EPS
    if not front.any():
        return EMPTY_BOX
    pts = corners[front]
    if not front.all():
        i, j = _EDGES[:, 0], _EDGES[:, 1]
        cross = front[i] != front[j]
        a, b = corners[i[cross]], corners[j[cross]]
        wa, wb = w[i[cross]], w[j[cross]]
        s = (_W_EPS * 2 - wa) / (wb - wa)
        pts = np.concatenate([pts, a + s[:, None] * (b - a)])
    x, y, _ = project_src(pts, m, width, height)
    return float(x.min()), float(y.min()), float(x.max()), float(y.max())


def bboxes_src(lo: Any, hi: Any, world_to_clip: Any, width: int, height: int) -> np.ndarray:
    """Source-pixel bounding boxes f64 [P,4] (x0, y0, x1, y1) of the parts of world AABBs [lo, hi]
    (f64 [P,3] each) in front of the camera plane; ``EMPTY_BOX`` rows for boxes wholly behind it.
    Edges crossing the plane are clipped at clip w ≈ 1e-6, so the boxes stay conservative."""
    m = as_matrix(world_to_clip, "world_to_clip")
    lo, hi = np.asarray(lo, np.float64).reshape(-1, 3), np.asarray(hi, np.float64).reshape(-1, 3)
    corners = lo[:, None, :] + _CORNERS[None] * (hi - lo)[:, None, :]  # [P,8,3]
    x, y, w = project_src(corners, m, width, height)
    out = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)
    front = w > _W_EPS
    out[~front.any(1)] = EMPTY_BOX
    for k in np.flatnonzero(front.any(1) & ~front.all(1)):
        out[k] = _clipped_box(corners[k], w[k], m, width, height)
    return out


def bbox_src(
    lo: Any, hi: Any, world_to_clip: Any, width: int, height: int
) -> tuple[float, float, float, float]:
    """``bboxes_src`` of one AABB."""
    x0, y0, x1, y1 = bboxes_src(lo, hi, world_to_clip, width, height)[0]
    return float(x0), float(y0), float(x1), float(y1)


# --- ray / capsule intersection -----------------------------------------------------------------


def ray_sphere_t(origin: np.ndarray, direction: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """Entry distance of rays (o [N,3], unit d [N,3]) into a sphere; inf where missed or behind."""
    oc = origin - centre
    b = _rowdot(oc, direction)
    disc = b * b - (_rowdot(oc, oc) - radius * radius)
    with np.errstate(invalid="ignore"):
        t = -b - np.sqrt(disc)
    return np.where((disc >= 0) & (t > 0), t, np.inf)


def ray_capsules_t(origin: np.ndarray, direction: np.ndarray, capsules: np.ndarray) -> np.ndarray:
    """Entry distances f64 [N,K] of rays (o [N,3], unit d [N,3]) into K capsules [K,7]; inf where a
    ray misses a capsule or meets it behind its origin.

    A capsule is the union of a cylinder (a→b, radius r) and spheres at a and b, so its entry is
    the nearest entry of the three pieces (for rays starting outside it).
    """
    c = np.asarray(capsules, dtype=np.float64).reshape(-1, CAPSULE_FLOATS)
    o = np.asarray(origin, dtype=np.float64)
    d = np.asarray(direction, dtype=np.float64)
    a, b, r2 = c[:, 0:3], c[:, 3:6], (c[:, 6] * c[:, 6])[None, :]
    axis = b - a
    length = np.sqrt((axis * axis).sum(1))
    u = axis / np.maximum(length, 1e-12)[:, None]
    od = _rowdot(o, d)[:, None]
    oo = _rowdot(o, o)[:, None]
    oa, da = o @ a.T, d @ a.T  # [N,K]
    ob, db = o @ b.T, d @ b.T
    wd = od - da  # (o - a)·d
    ww = oo - 2.0 * oa + (a * a).sum(1)[None, :]  # |o - a|²
    du = d @ u.T
    wu = o @ u.T - (a * u).sum(1)[None, :]  # (o - a)·u
    with np.errstate(invalid="ignore", divide="ignore"):
        qa = 1.0 - du * du
        qb = wd - wu * du
        disc = qb * qb - qa * (ww - wu * wu - r2)
        t = (-qb - np.sqrt(disc)) / qa
        s_ax = wu + t * du
        body = (qa > 1e-12) & (disc >= 0) & (t > 0) & (s_ax >= 0) & (s_ax <= length[None, :])
        best = np.where(body, t, np.inf)
        for bd, bb in ((wd, ww), (od - db, oo - 2.0 * ob + (b * b).sum(1)[None, :])):
            disc = bd * bd - (bb - r2)
            ts = -bd - np.sqrt(disc)
            best = np.minimum(best, np.where((disc >= 0) & (ts > 0), ts, np.inf))
    return best


def ray_capsule_t(origin: np.ndarray, direction: np.ndarray, capsule: np.ndarray) -> np.ndarray:
    """Entry distance f64 [N] of rays (o [N,3], unit d [N,3]) into one capsule [7] (see ray_capsules_t)."""
    return ray_capsules_t(origin, direction, np.asarray(capsule)[None])[:, 0]


def capsule_normals(points: np.ndarray, capsule: np.ndarray) -> np.ndarray:
    """Unit outward normals f64 [N,3] of a capsule [7] at surface points [N,3]."""
    c = np.asarray(capsule, dtype=np.float64)
    a, b = c[0:3], c[3:6]
    axis = b - a
    ll = float(axis @ axis)
    s = np.zeros(len(points)) if ll < 1e-18 else np.clip((points - a) @ axis / ll, 0.0, 1.0)
    n = points - (a + s[:, None] * axis)
    return n / np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)


def cast_capsules(
    rays: PixelRays, capsules: Any, select: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest capsule hit of every ray.

    capsules: [A,12,7] (A actors, normally 2); select: optional bool [A,N] — ray n is only tested
    against actor a's capsules where select[a, n].
    Returns (t f64 [N] (inf = miss), actor int16 [N] (−1 = miss), capsule int16 [N] (−1 = miss)).
    """
    caps = np.asarray(capsules, dtype=np.float64)
    n = len(rays)
    t_best = np.full(n, np.inf)
    actor = np.full(n, _MISS, np.int16)
    capsule = np.full(n, _MISS, np.int16)
    lo = np.minimum(caps[..., 0:3], caps[..., 3:6]) - caps[..., 6:7]
    hi = np.maximum(caps[..., 0:3], caps[..., 3:6]) + caps[..., 6:7]
    boxes = bboxes_src(lo, hi, rays.world_to_clip, rays.width, rays.height).reshape(*caps.shape[:2], 4)
    for a in range(caps.shape[0]):
        allowed = None if select is None else np.asarray(select[a], dtype=bool)
        if allowed is not None and not allowed.any():
            continue
        for c in range(caps.shape[1]):
            sel = rays.in_box(boxes[a, c])  # only rays whose pixel can see this capsule
            if allowed is not None:
                sel = sel[allowed[sel]]
            if len(sel) == 0:
                continue
            t = ray_capsule_t(rays.origin[sel], rays.direction[sel], caps[a, c])
            better = t < t_best[sel]
            hit = sel[better]
            t_best[hit] = t[better]
            actor[hit] = a
            capsule[hit] = c
    return t_best, actor, capsule


def hits_to_part_ids(actor: np.ndarray, capsule: np.ndarray, miss: np.ndarray | int) -> np.ndarray:
    """(actor, capsule) hit indices [N] → raw part ids uint8 [N]; ``miss`` where actor < 0."""
    hit = actor >= 0
    out = np.broadcast_to(np.asarray(miss, dtype=np.uint8), actor.shape).copy()
    out[hit] = CAPSULE_PART_IDS[actor[hit], capsule[hit]]
    return out


# --- destination-resolution entry points --------------------------------------------------------


@lru_cache(maxsize=8)
def _dst_sample_grid(geom: GeometryConfig) -> tuple[np.ndarray, np.ndarray]:
    idx_y, idx_x = index_maps(geom)
    xs = np.broadcast_to(idx_x.astype(np.float64)[None, :], (geom.dst_height, geom.dst_width)).ravel()
    ys = np.broadcast_to(idx_y.astype(np.float64)[:, None], (geom.dst_height, geom.dst_width)).ravel()
    xs.setflags(write=False)
    ys.setflags(write=False)
    return xs, ys


def dst_sample_coords(geometry: GeometryConfig = V10) -> tuple[np.ndarray, np.ndarray]:
    """(src_x, src_y) f64 [H·W] (row-major destination order): the source pixel centre each destination
    pixel samples in ``resample_ids`` — the points label_parts and render_capsules cast rays through."""
    return _dst_sample_grid(geometry)


def _check_dst_ids(ids: Any, geometry: GeometryConfig, name: str) -> np.ndarray:
    a = np.asarray(ids)
    if a.shape != (geometry.dst_height, geometry.dst_width):
        raise ValueError(
            f"{name}: expected destination ids [{geometry.dst_height},{geometry.dst_width}], got {list(a.shape)}"
        )
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.integer) or a.min(initial=0) < 0 or a.max(initial=0) > 255:
            raise ValueError(f"{name}: expected uint8 ids, got {a.dtype}")
        a = a.astype(np.uint8)
    return a


def _actor_capsules(capsules: Any) -> np.ndarray:
    if isinstance(capsules, np.ndarray) or (isinstance(capsules, Sequence) and not isinstance(capsules, str)):
        return check_capsules(capsules).astype(np.float64)
    return capsules_from_json(capsules).astype(np.float64)


def label_parts(
    ids: np.ndarray,
    world_to_clip: Any,
    world_to_view: Any,
    capsules: Any,
    geometry: GeometryConfig = V10,
) -> np.ndarray:
    """Destination ids uint8 [H,W] (UE labels after ``resample_ids``) → "parts" raw ids uint8 [H,W].

    Every player pixel (raw 10, or an already labelled player part) is ray-cast against the player's
    12 capsules, every boss pixel (11 / boss parts) against the boss's; the nearest hit capsule gives
    the part id (see the module table). Pixels whose ray misses keep the actor's core id (10 / 11);
    static and UNKNOWN pixels are unchanged. ``capsules`` is [2,12,7], a FrameJson, a frame.json dict
    or its capsules mapping. The result is checked ⊆ ``valid_raw_ids("parts")``.
    """
    ids = _check_dst_ids(ids, geometry, "label_parts ids")
    caps = _actor_capsules(capsules)
    out = np.ascontiguousarray(ids).copy()
    flat = out.reshape(-1)
    member = [np.isin(flat, ACTOR_PART_IDS[a]) for a in range(NUM_ACTORS)]
    pix = np.flatnonzero(member[0] | member[1])
    if len(pix):
        xs, ys = dst_sample_coords(geometry)
        rays = PixelRays.through(
            xs[pix], ys[pix], world_to_clip, world_to_view, geometry.src_width, geometry.src_height
        )
        select = np.stack([member[0][pix], member[1][pix]])
        _, actor, capsule = cast_capsules(rays, caps, select)
        core = np.where(select[0], ACTOR_CORE_IDS[0], ACTOR_CORE_IDS[1]).astype(np.uint8)
        flat[pix] = hits_to_part_ids(actor, capsule, core)
    check_ids(out, "parts", "label_parts output")
    return out


def render_capsules(
    capsules: Any,
    world_to_clip: Any,
    world_to_view: Any,
    background: np.ndarray,
    geometry: GeometryConfig = V10,
    background_depth: np.ndarray | None = None,
) -> np.ndarray:
    """Draw both actors' part ids from capsules and the camera alone over ``background`` (uint8 [H,W]).

    Capsules are depth-ordered (nearest wins, across actors). With ``background_depth`` (f64 [H,W],
    the ray distance ``t`` of the static surface per pixel, inf for sky) a capsule is drawn only where
    it is nearer than the scene; without it characters are always on top. Returns uint8 [H,W].
    """
    bg = _check_dst_ids(background, geometry, "render_capsules background")
    caps = _actor_capsules(capsules)
    idx_y, idx_x = index_maps(geometry)
    rays = PixelRays.on_grid(
        idx_x, idx_y, world_to_clip, world_to_view, geometry.src_width, geometry.src_height
    )
    t, actor, capsule = cast_capsules(rays, caps)
    if background_depth is not None:
        depth = np.asarray(background_depth, dtype=np.float64)
        if depth.shape != bg.shape:
            raise ValueError(f"background_depth: expected shape {list(bg.shape)}, got {list(depth.shape)}")
        actor = np.where(t < depth.reshape(-1), actor, _MISS).astype(np.int16)
    return hits_to_part_ids(actor, capsule, bg.reshape(-1)).reshape(bg.shape)


def project_points(
    points: Any, world_to_clip: Any, geometry: GeometryConfig = V10
) -> tuple[np.ndarray, np.ndarray]:
    """World points [...,3] → (continuous destination pixel xy f64 [...,2], in_front bool [...])."""
    x, y, w = project_src(points, world_to_clip, geometry.src_width, geometry.src_height)
    dx, dy = src_to_dst(x, y, geometry)
    return np.stack([dx, dy], axis=-1), w > 0


def ground_points(
    world_to_clip: Any,
    world_to_view: Any,
    z: float,
    geometry: GeometryConfig = V10,
    xy: np.ndarray | None = None,
) -> np.ndarray:
    """Destination pixels → world points on the plane ``z`` (cm): f64 [...,3].

    ``xy``: continuous destination coordinates [...,2] (pixel centres at integers); default every
    destination pixel centre ([H,W,2]). NaN where the ray is parallel to the plane or meets it behind
    the camera.
    """
    if xy is None:
        gy, gx = np.mgrid[0 : geometry.dst_height, 0 : geometry.dst_width]
        xy = np.stack([gx, gy], axis=-1).astype(np.float64)
    xy = np.asarray(xy, dtype=np.float64)
    if xy.shape[-1] != 2:
        raise ValueError(f"ground_points xy: expected [...,2], got {list(xy.shape)}")
    sx, sy = dst_to_src(xy[..., 0], xy[..., 1], geometry)
    rays = PixelRays.through(sx, sy, world_to_clip, world_to_view, geometry.src_width, geometry.src_height)
    dz = rays.direction[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (float(z) - rays.origin[:, 2]) / dz
    ok = np.isfinite(t) & (t > 0) & (np.abs(dz) > 1e-12)
    pts = np.full((len(rays), 3), np.nan)
    pts[ok] = rays.at(t[ok], np.flatnonzero(ok))
    pts[ok, 2] = float(z)
    return pts.reshape(*xy.shape[:-1], 3)
