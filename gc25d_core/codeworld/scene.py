"""The static world: a ground-plane semantic layout plus boxes, vertical cylinders and spheres.

Classes are the SPEC's static raw ids (0 sky, 1 terrain, 2 paving, 3 architecture, 4 rock,
5 vegetation, 6 prop). The ground is the plane z = 0 up to ``GROUND_EXTENT_CM`` from the origin;
its class comes from ``ground_class`` (a plaza, paths and a ring road of paving; flat rock and
vegetation patches in the terrain). Architecture (a ring of buildings, low walls, plaza pillars)
depends on the scene seed only; the set dressing (props, rocks, trees, bushes) on the look seed, so a
look change re-scatters it while the architecture stays.

Actors live inside ``ARENA_RADIUS_CM``; buildings stand beyond ``BUILDING_RING_CM`` so that every
camera rig (camera.py) stays outside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gc25d_core.capsules import PixelRays, bboxes_src, ray_sphere_t
from gc25d_core.codeworld.noise import fbm

SKY, TERRAIN, PAVING, ARCHITECTURE, ROCK, VEGETATION, PROP = range(7)
GROUND_EXTENT_CM = 40_000.0
ARENA_RADIUS_CM = 1700.0
BUILDING_RING_CM = 3300.0
WALL_RING_CM = 2450.0
RING_ROAD_CM = 2200.0


@dataclass(frozen=True)
class Boxes:
    """Axis-aligned boxes: lo, hi f64 [B,3]; cls uint8 [B]."""

    lo: np.ndarray
    hi: np.ndarray
    cls: np.ndarray


@dataclass(frozen=True)
class Cylinders:
    """Vertical capped cylinders: xy f64 [C,2], r, z0, z1 f64 [C]; cls uint8 [C]."""

    xy: np.ndarray
    r: np.ndarray
    z0: np.ndarray
    z1: np.ndarray
    cls: np.ndarray


@dataclass(frozen=True)
class Spheres:
    """Spheres: c f64 [S,3], r f64 [S]; cls uint8 [S]."""

    c: np.ndarray
    r: np.ndarray
    cls: np.ndarray


@dataclass(frozen=True)
class StaticScene:
    """One scene under one look: ground layout seed + primitives."""

    scene_seed: int
    look_seed: int
    boxes: Boxes
    cylinders: Cylinders
    spheres: Spheres

    def ground_class(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return ground_class(x, y, self.scene_seed)

    def obstacle_circles(self) -> np.ndarray:
        """f64 [K,3] (x, y, radius) footprints actors cannot enter (cylinders)."""
        c = self.cylinders
        return np.concatenate([c.xy, c.r[:, None]], axis=1)

    def obstacle_rects(self) -> np.ndarray:
        """f64 [K,4] (x0, y0, x1, y1) footprints actors cannot enter (boxes inside the walls)."""
        b = self.boxes
        rects = np.concatenate([b.lo[:, :2], b.hi[:, :2]], axis=1)
        centre_r = np.hypot((rects[:, 0] + rects[:, 2]) / 2, (rects[:, 1] + rects[:, 3]) / 2)
        return rects[centre_r < WALL_RING_CM + 400.0]


def ground_class(x: np.ndarray, y: np.ndarray, scene_seed: int) -> np.ndarray:
    """Semantic class of ground points (f64 arrays, cm) → uint8 of the same shape."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    r = np.hypot(x, y)
    paving = (r < 900.0) | (np.abs(r - RING_ROAD_CM) < 130.0)
    paving |= ((np.abs(x) < 160.0) | (np.abs(y) < 160.0)) & (r < BUILDING_RING_CM + 600.0)
    n = fbm(x / 800.0, y / 800.0, scene_seed * 7 + 1, octaves=2)
    out = np.full(x.shape, TERRAIN, dtype=np.uint8)
    out[n > 0.64] = VEGETATION
    out[n < 0.30] = ROCK
    out[paving] = PAVING
    return out


def _polar(rng: np.random.Generator, n: int, r0: float, r1: float) -> np.ndarray:
    ang = rng.uniform(0, 2 * math.pi, n)
    rad = np.sqrt(rng.uniform(r0 * r0, r1 * r1, n))
    return np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=1)


def _architecture(seed: int) -> tuple[list, list]:
    """Buildings, walls (boxes) and plaza pillars (cylinders) of a scene."""
    rng = np.random.default_rng([seed, 101])
    boxes: list[tuple[np.ndarray, np.ndarray, int]] = []
    n_build = 14
    for k in range(n_build):
        ang = 2 * math.pi * (k + rng.uniform(-0.25, 0.25)) / n_build
        rad = BUILDING_RING_CM + rng.uniform(0, 500)
        w, d = rng.uniform(500, 1000, 2)
        h = rng.uniform(500, 1400)
        cx, cy = rad * math.cos(ang), rad * math.sin(ang)
        boxes.append(
            (np.array([cx - w / 2, cy - d / 2, 0.0]), np.array([cx + w / 2, cy + d / 2, h]), ARCHITECTURE)
        )
    for k in range(6):
        ang = 2 * math.pi * (k + 0.5 + rng.uniform(-0.2, 0.2)) / 6
        cx, cy = WALL_RING_CM * math.cos(ang), WALL_RING_CM * math.sin(ang)
        length, thick, h = rng.uniform(500, 900), 60.0, rng.uniform(180, 300)
        half = (length / 2, thick / 2) if abs(math.cos(ang)) < abs(math.sin(ang)) else (thick / 2, length / 2)
        boxes.append(
            (
                np.array([cx - half[0], cy - half[1], 0.0]),
                np.array([cx + half[0], cy + half[1], h]),
                ARCHITECTURE,
            )
        )
    cyls = []
    for k in range(4):
        ang = math.pi / 4 + k * math.pi / 2 + rng.uniform(-0.15, 0.15)
        cyls.append(
            (1000.0 * math.cos(ang), 1000.0 * math.sin(ang), 55.0, 0.0, rng.uniform(550, 800), ARCHITECTURE)
        )
    return boxes, cyls


def _set_dressing(seed: int) -> tuple[list, list, list]:
    """Props, rocks and vegetation scattered by the look seed."""
    rng = np.random.default_rng([seed, 202])
    boxes: list[tuple[np.ndarray, np.ndarray, int]] = []
    for x, y in _polar(rng, 9, 400, ARENA_RADIUS_CM):
        s = rng.uniform(70, 130, 3)
        boxes.append(
            (np.array([x - s[0] / 2, y - s[1] / 2, 0.0]), np.array([x + s[0] / 2, y + s[1] / 2, s[2]]), PROP)
        )
    for x, y in _polar(rng, 7, 1100, 2300):
        w, d, h = rng.uniform(120, 260), rng.uniform(120, 260), rng.uniform(60, 190)
        boxes.append((np.array([x - w / 2, y - d / 2, 0.0]), np.array([x + w / 2, y + d / 2, h]), ROCK))
    cyls = []
    for x, y in _polar(rng, 6, 500, ARENA_RADIUS_CM):
        cyls.append((x, y, 35.0, 0.0, 95.0, PROP))
    for _k in range(4):
        ang = rng.uniform(0, 2 * math.pi)
        cyls.append((700.0 * math.cos(ang), 700.0 * math.sin(ang), 10.0, 0.0, 380.0, PROP))
    spheres = []
    for x, y in _polar(rng, 10, 2600, 3000):
        cyls.append((x, y, 22.0, 0.0, 300.0, VEGETATION))
        spheres.append((x, y, rng.uniform(320, 420), rng.uniform(140, 190), VEGETATION))
    for x, y in _polar(rng, 8, 1300, 2300):
        spheres.append((x, y, 15.0, rng.uniform(50, 90), VEGETATION))
    return boxes, cyls, spheres


def build_scene(scene_seed: int, look_seed: int) -> StaticScene:
    """The static scene of ``scene_seed`` dressed by ``look_seed`` (both deterministic)."""
    arch_boxes, arch_cyls = _architecture(scene_seed)
    dress_boxes, dress_cyls, spheres = _set_dressing(look_seed)
    boxes = arch_boxes + dress_boxes
    cyls = arch_cyls + dress_cyls
    return StaticScene(
        scene_seed=scene_seed,
        look_seed=look_seed,
        boxes=Boxes(
            lo=np.array([b[0] for b in boxes]),
            hi=np.array([b[1] for b in boxes]),
            cls=np.array([b[2] for b in boxes], np.uint8),
        ),
        cylinders=Cylinders(
            xy=np.array([c[:2] for c in cyls], np.float64),
            r=np.array([c[2] for c in cyls], np.float64),
            z0=np.array([c[3] for c in cyls], np.float64),
            z1=np.array([c[4] for c in cyls], np.float64),
            cls=np.array([c[5] for c in cyls], np.uint8),
        ),
        spheres=Spheres(
            c=np.array([s[:3] for s in spheres], np.float64),
            r=np.array([s[3] for s in spheres], np.float64),
            cls=np.array([s[4] for s in spheres], np.uint8),
        ),
    )


# --- rendering ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridRays:
    """Rays on a separable grid of source pixel coordinates.

    gx f64 [W'] / gy f64 [H'] (non-decreasing source pixel coordinates), origin / direction
    f64 [H',W',3] (see capsules.PixelRays).
    """

    gx: np.ndarray
    gy: np.ndarray
    origin: np.ndarray
    direction: np.ndarray
    world_to_clip: np.ndarray
    width: int
    height: int

    @classmethod
    def build(
        cls,
        gx: np.ndarray,
        gy: np.ndarray,
        world_to_clip: np.ndarray,
        world_to_view: np.ndarray,
        width: int,
        height: int,
    ) -> GridRays:
        gx = np.asarray(gx, np.float64)
        gy = np.asarray(gy, np.float64)
        xs = np.broadcast_to(gx[None, :], (len(gy), len(gx)))
        ys = np.broadcast_to(gy[:, None], (len(gy), len(gx)))
        rays = PixelRays.through(xs, ys, world_to_clip, world_to_view, width, height)
        shape = (len(gy), len(gx), 3)
        return cls(
            gx,
            gy,
            rays.origin.reshape(shape),
            rays.direction.reshape(shape),
            rays.world_to_clip,
            width,
            height,
        )

    @classmethod
    def full(cls, world_to_clip: np.ndarray, world_to_view: np.ndarray, width: int, height: int) -> GridRays:
        """Every source pixel centre."""
        return cls.build(np.arange(width), np.arange(height), world_to_clip, world_to_view, width, height)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.gy), len(self.gx)

    def windows(self, lo: np.ndarray, hi: np.ndarray) -> list[tuple[slice, slice] | None]:
        """Grid slices covering the projections of AABBs [lo, hi] (f64 [P,3] each); None = off screen."""
        box = bboxes_src(lo, hi, self.world_to_clip, self.width, self.height)
        with np.errstate(invalid="ignore"):
            i0 = np.searchsorted(self.gx, box[:, 0] - 1.0)
            i1 = np.searchsorted(self.gx, box[:, 2] + 1.0, side="right")
            j0 = np.searchsorted(self.gy, box[:, 1] - 1.0)
            j1 = np.searchsorted(self.gy, box[:, 3] + 1.0, side="right")
        ok = (box[:, 0] <= box[:, 2]) & (i0 < i1) & (j0 < j1)
        return [
            (slice(int(j0[k]), int(j1[k])), slice(int(i0[k]), int(i1[k]))) if ok[k] else None
            for k in range(len(box))
        ]


@dataclass
class StaticHits:
    """Per-pixel nearest static surface: t f64 [H,W] (inf = sky), cls uint8 [H,W], normal f64 [H,W,3]."""

    t: np.ndarray
    cls: np.ndarray
    normal: np.ndarray


def _ray_box(o: tuple, d: tuple, inv: tuple, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slab test on component planes (o, d, inv each a 3-tuple of f64 [n]) → (t [n], normal [n,3])."""
    tn = np.full(o[0].shape, -np.inf)
    tf = np.full(o[0].shape, np.inf)
    axis = np.zeros(o[0].shape, np.int8)
    with np.errstate(invalid="ignore"):
        for k in range(3):
            t1 = (lo[k] - o[k]) * inv[k]
            t2 = (hi[k] - o[k]) * inv[k]
            near = np.fmin(t1, t2)
            axis = np.where(near > tn, np.int8(k), axis)
            tn = np.fmax(tn, near)
            tf = np.fmin(tf, np.fmax(t1, t2))
    hit = (tf >= tn) & (tn > 0)
    normal = np.zeros((*o[0].shape, 3))
    for k in range(3):
        m = axis == k
        normal[m, k] = -np.sign(d[k][m])
    return np.where(hit, tn, np.inf), normal


def _ray_vcyl(o: tuple, d: tuple, x: float, y: float, r: float, z0: float, z1: float):
    """Vertical capped cylinder on component planes → (t [n], normal [n,3])."""
    ox, oy, oz = o[0] - x, o[1] - y, o[2]
    dx, dy, dz = d
    a = dx * dx + dy * dy
    b = ox * dx + oy * dy
    disc = b * b - a * (ox * ox + oy * oy - r * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        ts = (-b - np.sqrt(disc)) / a
        zs = oz + ts * dz
        side_ok = (a > 1e-12) & (disc >= 0) & (ts > 0) & (zs >= z0) & (zs <= z1)
        tt = np.where(dz < 0, (z1 - oz) / dz, np.where(dz > 0, (z0 - oz) / dz, np.inf))
        cx, cy = ox + tt * dx, oy + tt * dy
        cap_ok = (tt > 0) & (cx * cx + cy * cy <= r * r)
    t_side = np.where(side_ok, ts, np.inf)
    t_cap = np.where(cap_ok, tt, np.inf)
    t = np.minimum(t_side, t_cap)
    normal = np.zeros((*ox.shape, 3))
    side = t_side <= t_cap
    normal[side, 0] = (ox + ts * dx)[side] / r
    normal[side, 1] = (oy + ts * dy)[side] / r
    normal[~side, 2] = -np.sign(dz[~side])
    return t, normal


def _merge(hits: StaticHits, sl: tuple[slice, slice], t: np.ndarray, normal: np.ndarray, cls: int) -> None:
    sub_t = hits.t[sl]
    better = t < sub_t
    if not better.any():
        return
    sub_t[better] = t[better]
    hits.cls[sl][better] = cls
    hits.normal[sl][better] = normal[better]


def render_static(scene: StaticScene, rays: GridRays) -> StaticHits:
    """Nearest static surface per grid ray: ground plane, then every primitive inside its screen box."""
    o = tuple(np.ascontiguousarray(rays.origin[..., k]) for k in range(3))
    d = tuple(np.ascontiguousarray(rays.direction[..., k]) for k in range(3))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = tuple(1.0 / dk for dk in d)
        tg = np.where(d[2] < -1e-9, -o[2] / d[2], np.inf)
    gx = o[0] + tg * d[0]
    gy = o[1] + tg * d[1]
    ground = np.isfinite(tg) & (tg > 0) & (np.hypot(gx, gy) < GROUND_EXTENT_CM)
    t = np.where(ground, tg, np.inf)
    cls = np.zeros(rays.shape, np.uint8)
    cls[ground] = scene.ground_class(gx[ground], gy[ground])
    normal = np.zeros((*rays.shape, 3))
    normal[..., 2] = 1.0
    hits = StaticHits(t, cls, normal)

    def sub(planes: tuple, sl: tuple[slice, slice]) -> tuple:
        return tuple(p[sl] for p in planes)

    b = scene.boxes
    for k, sl in enumerate(rays.windows(b.lo, b.hi)):
        if sl is not None:
            tk, nk = _ray_box(sub(o, sl), sub(d, sl), sub(inv, sl), b.lo[k], b.hi[k])
            _merge(hits, sl, tk, nk, int(b.cls[k]))
    c = scene.cylinders
    c_lo = np.concatenate([c.xy - c.r[:, None], c.z0[:, None]], axis=1)
    c_hi = np.concatenate([c.xy + c.r[:, None], c.z1[:, None]], axis=1)
    for k, sl in enumerate(rays.windows(c_lo, c_hi)):
        x, y, r = c.xy[k, 0], c.xy[k, 1], c.r[k]
        if sl is not None:
            tk, nk = _ray_vcyl(sub(o, sl), sub(d, sl), x, y, r, c.z0[k], c.z1[k])
            _merge(hits, sl, tk, nk, int(c.cls[k]))
    s = scene.spheres
    for k, sl in enumerate(rays.windows(s.c - s.r[:, None], s.c + s.r[:, None])):
        if sl is not None:
            shape = rays.origin[sl].shape
            oo, dd = rays.origin[sl].reshape(-1, 3), rays.direction[sl].reshape(-1, 3)
            tk = ray_sphere_t(oo, dd, s.c[k], float(s.r[k]))
            with np.errstate(invalid="ignore"):
                nk = (oo + np.where(np.isfinite(tk), tk, 0.0)[:, None] * dd - s.c[k]) / s.r[k]
            _merge(hits, sl, tk.reshape(shape[:2]), nk.reshape(shape), int(s.cls[k]))
    return hits
