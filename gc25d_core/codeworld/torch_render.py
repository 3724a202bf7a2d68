"""The live world's ids on a torch device: the static semantic layer, the capsules and the
seen-world memory of ``deploy.world`` as batched tensor ops over the frames of a cell.

The numpy renderers stay the reference and the data generator (``scene.render_static``,
``capsules.render_capsules``, ``deploy.world.SeenMemory``); this module computes the same numbers
for the live session, where the CPU ray cast (≈ 0.65 s per cell at 832×480) would not fit a
0.25 s cell. It lives beside ``scene.py`` because it is that file's math (the same primitives, the
same ground classes and value-noise table, the same ray definition as ``capsules.PixelRays``) and
deploy only composes it.

Design: per-pixel ray–primitive tests as batched tensor ops over the cell's 4 frames. The per-pixel
source coordinates are fixed for a geometry, so their NDC grid is built once; a frame's rays follow
from its two 4×4 matrices (the closed form of ``PixelRays.through``). On a GPU the static pass (rays,
ground classes, boxes, cylinders, spheres, the seen-grid cell of each pixel) is one
``torch.compile``'d function over fixed shapes — every primitive of the scene against every ray,
fused into a few kernels (≈ 6 ms a cell at 832×480 on an H200, where the eager ops' [rays ×
primitives] intermediates cost 20+ ms) and compiled at load. On a CPU it runs eagerly, and only
against the primitives whose culling box (``capsules.bboxes_src``, the reference's own boxes) meets
the frame. The capsules are tested on one window per frame that holds every capsule's culling box.
Culling is conservative (a ray outside a box cannot hit it), so it changes no id. Nearest-hit ties go
to the earlier primitive in the reference's order (ground, boxes, cylinders, spheres; capsules
actor-major), as its strict ``<`` merges do. float64 by default (the reference's precision: 100 % of
the pixels agree); float32 is an option.

The seen memory is a flat bool grid on the device with one spare slot that absorbs the pixels
with no grid cell, so marking and lookup have fixed shapes (no host sync, CUDA-graph friendly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gc25d_core.capsules import CAPSULE_PART_IDS, NUM_ACTORS, NUM_CAPSULES, bboxes_src
from gc25d_core.codeworld.noise import _table
from gc25d_core.codeworld.scene import (
    BUILDING_RING_CM,
    GROUND_EXTENT_CM,
    PAVING,
    RING_ROAD_CM,
    ROCK,
    TERRAIN,
    VEGETATION,
    StaticScene,
)
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import index_maps
from gc25d_core.vocab import NUM_STATIC, UNKNOWN

SKY_CELL = -2  # seen-grid cell of a pixel without a static surface (always known)
OFF_GRID = -1  # a static surface outside the seen grid (never known)


@dataclass(frozen=True)
class Rays:
    """Per-pixel rays of F frames: origin, direction [F, H, W, 3] (NaN where the camera has none)."""

    origin: torch.Tensor
    direction: torch.Tensor


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.cross(a, b, dim=-1)


def frame_rays(
    nx: torch.Tensor, ny: torch.Tensor, world_to_clip: torch.Tensor, world_to_view: torch.Tensor
) -> Rays:
    """Rays through the NDC grid ny [H] × nx [W] of F cameras (matrices [F, 4, 4]); the closed form
    of ``capsules.PixelRays.through`` (see there), batched over frames."""
    m, v = world_to_clip, world_to_view
    a, b = m[:, :, :3], m[:, :, 3]  # [F,4,3], [F,4]
    f, c = v[:, 2, :3], v[:, 2, 3]  # [F,3], [F]
    k0, k1, k2 = _cross(a[:, 0], a[:, 1]), _cross(a[:, 1], a[:, 3]), _cross(a[:, 3], a[:, 0])
    X = nx[None, None, :]  # [1,1,W]
    Y = ny[None, :, None]  # [1,H,1]

    def fr(t: torch.Tensor) -> torch.Tensor:  # per-frame scalar → [F,1,1]
        return t[:, None, None]

    h1 = X * fr(b[:, 3]) - fr(b[:, 0])
    h2 = Y * fr(b[:, 3]) - fr(b[:, 1])
    d = [fr(k0[:, i]) + X * fr(k1[:, i]) + Y * fr(k2[:, i]) for i in range(3)]
    dot = torch.einsum
    det = fr(dot("fi,fi->f", f, k0)) + X * fr(dot("fi,fi->f", f, k1)) + Y * fr(dot("fi,fi->f", f, k2))
    u0, u1 = _cross(a[:, 1], f), _cross(a[:, 3], f)
    w0, w1 = _cross(f, a[:, 0]), _cross(f, a[:, 3])
    inv_det = 1.0 / det
    origin = torch.stack(
        [
            (h1 * (fr(u0[:, i]) - Y * fr(u1[:, i])) + h2 * (fr(w0[:, i]) - X * fr(w1[:, i])) - fr(c) * d[i])
            * inv_det
            for i in range(3)
        ],
        dim=-1,
    )
    length = torch.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
    scale = torch.sign(det) / length
    direction = torch.stack([di * scale for di in d], dim=-1)
    bad = ~(det.abs() / length > 1e-12)
    nan = torch.full((), float("nan"), dtype=origin.dtype, device=origin.device)
    return Rays(torch.where(bad[..., None], nan, origin), torch.where(bad[..., None], nan, direction))


# --- the static layer ---------------------------------------------------------------------------


def value_noise(x: torch.Tensor, y: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``noise.value_noise`` with its 256×256 lattice table already on the device."""
    fx, fy = torch.floor(x), torch.floor(y)
    u, v = x - fx, y - fy
    u = u * u * (3.0 - 2.0 * u)
    v = v * v * (3.0 - 2.0 * v)
    ix = fx.to(torch.int64) & 255
    iy = fy.to(torch.int64) & 255
    ix1, iy1 = (ix + 1) & 255, (iy + 1) & 255
    flat = table.reshape(-1)
    a, b = flat[iy * 256 + ix], flat[iy * 256 + ix1]
    c, d = flat[iy1 * 256 + ix], flat[iy1 * 256 + ix1]
    top = a + (b - a) * u
    return top + (c + (d - c) * u - top) * v


def ground_classes(x: torch.Tensor, y: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """``scene.ground_class`` with the scene's two fbm noise tables ([2, 256, 256]) on the device."""
    r = torch.hypot(x, y)
    paving = (r < 900.0) | ((r - RING_ROAD_CM).abs() < 130.0)
    paving |= ((x.abs() < 160.0) | (y.abs() < 160.0)) & (r < BUILDING_RING_CM + 600.0)
    x8, y8 = x / 800.0, y / 800.0
    total = torch.zeros_like(x)
    amp, norm, freq = 1.0, 0.0, 1.0
    for k in range(2):  # fbm(..., octaves=2)
        total = total + amp * value_noise(x8 * freq + 17.3 * k, y8 * freq - 9.1 * k, tables[k])
        norm += amp
        amp *= 0.5
        freq *= 2.0
    n = total / norm
    out = torch.full(x.shape, TERRAIN, dtype=torch.uint8, device=x.device)
    out = torch.where(n > 0.64, VEGETATION, out)
    out = torch.where(n < 0.30, ROCK, out)
    return torch.where(paving, PAVING, out).to(torch.uint8)


def noise_tables(scene_seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The two lattice tables ``ground_class``'s fbm reads for ``scene_seed`` → [2, 256, 256]."""
    seed = scene_seed * 7 + 1
    return torch.tensor(np.stack([_table(seed + k) for k in range(2)]), dtype=dtype, device=device)


class SceneTensors:
    """A StaticScene's primitives on a device: boxes lo, hi [B,3]; cylinders [C,5] (x, y, r, z0, z1);
    spheres [S,4] (cx, cy, cz, r); their classes in the reference's merge order. ``bounds`` (host
    f64 [B+C+S, 2, 3]) are the AABBs the reference culls with, in the same order."""

    def __init__(self, scene: StaticScene, device: torch.device, dtype: torch.dtype):
        def t(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.asarray(a, np.float64), dtype=dtype, device=device)

        b, c, s = scene.boxes, scene.cylinders, scene.spheres
        self.lo, self.hi = t(b.lo), t(b.hi)
        self.cyl = t(np.concatenate([c.xy, c.r[:, None], c.z0[:, None], c.z1[:, None]], axis=1))
        self.sph = t(np.concatenate([s.c, s.r[:, None]], axis=1))
        self.counts = (len(b.cls), len(c.cls), len(s.cls))
        # 0 = ground (its class per pixel), then every primitive's class
        cls = np.concatenate([[0], b.cls, c.cls, s.cls]).astype(np.int64)
        self.cls = torch.as_tensor(cls, device=device)
        self.tables = noise_tables(scene.scene_seed, device, dtype)
        lo = np.concatenate([b.lo, np.c_[c.xy - c.r[:, None], c.z0], s.c - s.r[:, None]])
        hi = np.concatenate([b.hi, np.c_[c.xy + c.r[:, None], c.z1], s.c + s.r[:, None]])
        self.bounds = np.stack([lo, hi], axis=1)

    def select(self, keep: torch.Tensor) -> SceneTensors:
        """The same scene restricted to the primitives ``keep`` (ascending global indices)."""
        out = object.__new__(SceneTensors)
        nb, nc, _ = self.counts
        kb = keep[keep < nb]
        kc = keep[(keep >= nb) & (keep < nb + nc)] - nb
        ks = keep[keep >= nb + nc] - nb - nc
        out.lo, out.hi, out.cyl, out.sph = self.lo[kb], self.hi[kb], self.cyl[kc], self.sph[ks]
        out.counts = (len(kb), len(kc), len(ks))
        out.cls = torch.cat([self.cls[:1], self.cls[1:][keep]])
        out.tables, out.bounds = self.tables, self.bounds[keep.cpu().numpy()]
        return out


def _box_t(o: torch.Tensor, d: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Slab test (``scene._ray_box``): o, d [N,3], lo, hi [B,3] → entry t [N,B] (inf = miss)."""
    inv = 1.0 / d
    tn = tf = None
    for k in range(3):
        ok, ik = o[:, k : k + 1], inv[:, k : k + 1]
        t1 = (lo[None, :, k] - ok) * ik
        t2 = (hi[None, :, k] - ok) * ik
        near, far = torch.fmin(t1, t2), torch.fmax(t1, t2)
        tn = near if tn is None else torch.fmax(tn, near)
        tf = far if tf is None else torch.fmin(tf, far)
    assert tn is not None and tf is not None
    hit = (tf >= tn) & (tn > 0)
    return torch.where(hit, tn, torch.inf)


def _cyl_t(o: torch.Tensor, d: torch.Tensor, cyl: torch.Tensor) -> torch.Tensor:
    """Vertical capped cylinders (``scene._ray_vcyl``): cyl [C,5] → entry t [N,C]."""
    x, y, r, z0, z1 = (cyl[None, :, i] for i in range(5))
    ox, oy, oz = o[:, 0:1] - x, o[:, 1:2] - y, o[:, 2:3]
    dx, dy, dz = d[:, 0:1], d[:, 1:2], d[:, 2:3]
    a = dx * dx + dy * dy
    b = ox * dx + oy * dy
    disc = b * b - a * (ox * ox + oy * oy - r * r)
    ts = (-b - torch.sqrt(disc)) / a
    zs = oz + ts * dz
    side_ok = (a > 1e-12) & (disc >= 0) & (ts > 0) & (zs >= z0) & (zs <= z1)
    inf = torch.full((), torch.inf, dtype=o.dtype, device=o.device)
    tt = torch.where(dz < 0, (z1 - oz) / dz, torch.where(dz > 0, (z0 - oz) / dz, inf))
    cx, cy = ox + tt * dx, oy + tt * dy
    cap_ok = (tt > 0) & (cx * cx + cy * cy <= r * r)
    return torch.minimum(torch.where(side_ok, ts, inf), torch.where(cap_ok, tt, inf))


def _sphere_t(o: torch.Tensor, d: torch.Tensor, sph: torch.Tensor) -> torch.Tensor:
    """``capsules.ray_sphere_t`` for S spheres [S,4] → entry t [N,S]."""
    oc = o[:, None, :] - sph[None, :, :3]  # [N,S,3]
    b = (oc * d[:, None, :]).sum(-1)
    disc = b * b - ((oc * oc).sum(-1) - sph[None, :, 3] ** 2)
    t = -b - torch.sqrt(disc)
    return torch.where((disc >= 0) & (t > 0), t, torch.inf)


def static_hits(
    origin: torch.Tensor,
    direction: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    cyl: torch.Tensor,
    sph: torch.Tensor,
    prim_cls: torch.Tensor,
    tables: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scene.render_static``'s classes and depths for rays o, d [..., 3] (inf = sky, class 0)."""
    shape = origin.shape[:-1]
    o, d = origin.reshape(-1, 3), direction.reshape(-1, 3)
    tg = torch.where(d[:, 2] < -1e-9, -o[:, 2] / d[:, 2], torch.inf)
    gx, gy = o[:, 0] + tg * d[:, 0], o[:, 1] + tg * d[:, 1]
    ground = torch.isfinite(tg) & (tg > 0) & (torch.hypot(gx, gy) < GROUND_EXTENT_CM)
    t_all = torch.cat(
        [
            torch.where(ground, tg, torch.inf)[:, None],
            _box_t(o, d, lo, hi),
            _cyl_t(o, d, cyl),
            _sphere_t(o, d, sph),
        ],
        dim=1,
    )
    t, which = t_all.min(dim=1)  # ties: the first primitive, as the reference's strict merges
    zero = torch.zeros((), dtype=gx.dtype, device=gx.device)
    gcls = ground_classes(torch.where(ground, gx, zero), torch.where(ground, gy, zero), tables)
    cls = torch.where(which == 0, torch.where(ground, gcls, 0), prim_cls[which]).to(torch.uint8)
    cls = torch.where(torch.isfinite(t), cls, 0)  # nothing hit: sky (class 0)
    return t.reshape(shape), cls.to(torch.uint8).reshape(shape)


def static_pass(
    nx: torch.Tensor,
    ny: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    cyl: torch.Tensor,
    sph: torch.Tensor,
    prim_cls: torch.Tensor,
    tables: torch.Tensor,
    extent_cm: float,
    cell_cm: float,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rays, the static layer and each pixel's seen-grid cell of a batch of frames: (origin,
    direction [F,H,W,3], t [F,H,W], class uint8 [F,H,W], cell int64 [F,H,W])."""
    rays = frame_rays(nx, ny, m, v)
    t_static, cls = static_hits(rays.origin, rays.direction, lo, hi, cyl, sph, prim_cls, tables)
    finite = torch.isfinite(t_static)
    tz = torch.where(finite, t_static, 0.0)[..., None]
    xy = (rays.origin + tz * rays.direction)[..., :2]
    ij = torch.floor((xy + extent_cm) / cell_cm)
    ok = torch.isfinite(ij).all(-1) & (ij >= 0).all(-1) & (ij < n).all(-1)
    ij = torch.where(ok[..., None], ij, 0.0).to(torch.int64)
    cells = torch.where(ok, ij[..., 0] * n + ij[..., 1], OFF_GRID)
    cells = torch.where(finite, cells, SKY_CELL)
    return rays.origin, rays.direction, t_static, cls, cells


# --- the capsules -------------------------------------------------------------------------------


def capsules_t(o: torch.Tensor, d: torch.Tensor, caps: torch.Tensor) -> torch.Tensor:
    """``capsules.ray_capsules_t`` per frame: rays o, d [F,N,3], caps [F,K,7] → entry t [F,N,K]
    (inf = miss)."""
    a, b, r2 = caps[..., 0:3], caps[..., 3:6], (caps[..., 6] ** 2)[:, None, :]  # [F,K,3], [F,1,K]
    axis = b - a
    length = torch.sqrt((axis * axis).sum(-1))  # [F,K]
    u = axis / torch.clamp(length, min=1e-12)[..., None]
    od = (o * d).sum(-1)[..., None]  # [F,N,1]
    oo = (o * o).sum(-1)[..., None]
    at, bt, ut = a.transpose(1, 2), b.transpose(1, 2), u.transpose(1, 2)
    oa, da = torch.bmm(o, at), torch.bmm(d, at)  # [F,N,K]
    ob, db = torch.bmm(o, bt), torch.bmm(d, bt)
    wd = od - da
    ww = oo - 2.0 * oa + (a * a).sum(-1)[:, None, :]
    du = torch.bmm(d, ut)
    wu = torch.bmm(o, ut) - (a * u).sum(-1)[:, None, :]
    qa = 1.0 - du * du
    qb = wd - wu * du
    disc = qb * qb - qa * (ww - wu * wu - r2)
    t = (-qb - torch.sqrt(disc)) / qa
    s_ax = wu + t * du
    body = (qa > 1e-12) & (disc >= 0) & (t > 0) & (s_ax >= 0) & (s_ax <= length[:, None, :])
    best = torch.where(body, t, torch.inf)
    for bd, bb in ((wd, ww), (od - db, oo - 2.0 * ob + (b * b).sum(-1)[:, None, :])):
        disc = bd * bd - (bb - r2)
        ts = -bd - torch.sqrt(disc)
        best = torch.minimum(best, torch.where((disc >= 0) & (ts > 0), ts, torch.inf))
    return best


# --- the renderer -------------------------------------------------------------------------------


class TorchWorldRenderer:
    """Ids of a geometry's destination pixels for batches of frames, on ``device``.

    ``render(scene, world_to_clip, world_to_view, capsules)`` (f64 numpy [F,4,4], [F,4,4],
    [F,2,12,7]) → (ids uint8 [F,H,W] unmasked, t [F,H,W], seen-grid cell int64 [F,H,W]: ``SKY_CELL``
    where no static surface, ``OFF_GRID`` outside the grid). ``SeenGrid`` turns them into the
    session's masked ids."""

    def __init__(
        self,
        geometry: GeometryConfig,
        device: Any = "cpu",
        dtype: torch.dtype = torch.float64,
        seen_cell_cm: float = 100.0,
        extent_cm: float = GROUND_EXTENT_CM,
        compile: bool | None = None,
    ):
        self.geometry, self.device, self.dtype = geometry, torch.device(device), dtype
        # on a GPU the static pass is one torch.compile'd function over fixed shapes (every primitive
        # of the scene, 4 frames: no culling, no recompiles); eager on a CPU (inductor's C++ builds
        # cost minutes there) with the frame-level culling instead
        self.compiled = self.device.type == "cuda" if compile is None else compile
        self._static_pass: Any = torch.compile(static_pass, dynamic=False) if self.compiled else None
        g = geometry
        idx_y, idx_x = index_maps(g)
        # NDC of the source pixel centre each destination pixel samples, in f64 as the reference
        nx = (idx_x.astype(np.float64) + 0.5) * (2.0 / g.src_width) - 1.0
        ny = 1.0 - (idx_y.astype(np.float64) + 0.5) * (2.0 / g.src_height)
        self.gx, self.gy = idx_x.astype(np.float64), idx_y.astype(np.float64)  # for the windows
        self.nx = torch.as_tensor(nx, dtype=dtype, device=self.device)
        self.ny = torch.as_tensor(ny, dtype=dtype, device=self.device)
        self.part_ids = torch.as_tensor(
            CAPSULE_PART_IDS.reshape(-1).astype(np.int64), device=self.device
        )  # [A·12] actor-major, the reference's scan order
        self.cell_cm, self.extent_cm = seen_cell_cm, extent_cm
        self.n = int(np.ceil(2 * extent_cm / seen_cell_cm))
        self._scenes: dict[int, SceneTensors] = {}

    def scene(self, scene: StaticScene) -> SceneTensors:
        key = id(scene)
        if key not in self._scenes:
            self._scenes[key] = SceneTensors(scene, self.device, self.dtype)
        return self._scenes[key]

    def upload(self, world_to_clip: np.ndarray, world_to_view: np.ndarray, capsules: np.ndarray):
        """One host → device copy of a batch's cameras and capsules."""
        F = len(world_to_clip)
        packed = np.concatenate(
            [
                np.asarray(world_to_clip, np.float64).reshape(F, 16),
                np.asarray(world_to_view, np.float64).reshape(F, 16),
                np.asarray(capsules, np.float64).reshape(F, NUM_ACTORS * NUM_CAPSULES * 7),
            ],
            axis=1,
        )
        x = torch.from_numpy(packed).to(self.device, self.dtype, non_blocking=False)
        return x[:, :16].reshape(F, 4, 4), x[:, 16:32].reshape(F, 4, 4), x[:, 32:].reshape(F, -1, 7)

    def visible(self, scene: SceneTensors, world_to_clip: np.ndarray, margin: float = 2.0) -> np.ndarray:
        """Global indices of the primitives whose culling box meets the source frame (± ``margin``
        pixels) in some frame of the batch (the reference tests only pixels inside those boxes)."""
        g = self.geometry
        lo, hi = scene.bounds[:, 0], scene.bounds[:, 1]
        keep = np.zeros(len(lo), bool)
        for m in world_to_clip:
            box = bboxes_src(lo, hi, m, g.src_width, g.src_height)
            keep |= (
                (box[:, 0] <= g.src_width - 1 + margin)
                & (box[:, 2] >= -margin)
                & (box[:, 1] <= g.src_height - 1 + margin)
                & (box[:, 3] >= -margin)
            )
        return np.flatnonzero(keep)

    def capsule_window(
        self, capsules: np.ndarray, world_to_clip: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Destination rows [F, h] and columns [F, w] of one window size per batch that holds, in
        each frame, every pixel inside a capsule's culling box (``capsules.cast_capsules``'s boxes
        and margin): the capsule test runs on those rays only. Rays outside a box cannot hit it, and
        testing extra rays changes nothing, so a window clamped into the frame stays exact."""
        g = self.geometry
        caps = np.asarray(capsules, np.float64).reshape(len(capsules), -1, 7)
        spans = []
        for m, c in zip(world_to_clip, caps, strict=True):
            lo = np.minimum(c[:, 0:3], c[:, 3:6]) - c[:, 6:7]
            hi = np.maximum(c[:, 0:3], c[:, 3:6]) + c[:, 6:7]
            box = bboxes_src(lo, hi, m, g.src_width, g.src_height)
            box = box[box[:, 0] <= box[:, 2]]
            if not len(box):
                spans.append((0, 0, 0, 0))
                continue
            x0, y0 = box[:, 0].min() - 1.5, box[:, 1].min() - 1.5
            x1, y1 = box[:, 2].max() + 1.5, box[:, 3].max() + 1.5
            i0, i1 = np.searchsorted(self.gx, x0), np.searchsorted(self.gx, x1, side="right")
            j0, j1 = np.searchsorted(self.gy, y0), np.searchsorted(self.gy, y1, side="right")
            spans.append((int(j0), int(j1), int(i0), int(i1)))
        h = max(max(j1 - j0 for j0, j1, _, _ in spans), 1)
        w = max(max(i1 - i0 for _, _, i0, i1 in spans), 1)
        r0 = np.array([min(j0, g.dst_height - h) for j0, _, _, _ in spans])
        c0 = np.array([min(i0, g.dst_width - w) for _, _, i0, _ in spans])
        return r0[:, None] + np.arange(h)[None], c0[:, None] + np.arange(w)[None]

    def render(
        self,
        scene: StaticScene,
        world_to_clip: np.ndarray,
        world_to_view: np.ndarray,
        capsules: np.ndarray,
        cull: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids uint8 [F,H,W] unmasked, seen-grid cell int64 [F,H,W])."""
        st = self.scene(scene)
        if cull and not self.compiled:
            keep = self.visible(st, world_to_clip)
            st = st.select(torch.from_numpy(keep).to(self.device))
        F = len(world_to_clip)
        if cull:
            rows, cols = self.capsule_window(capsules, world_to_clip)
        else:
            rows = np.broadcast_to(np.arange(self.geometry.dst_height), (F, self.geometry.dst_height))
            cols = np.broadcast_to(np.arange(self.geometry.dst_width), (F, self.geometry.dst_width))
        m, v, caps = self.upload(world_to_clip, world_to_view, capsules)
        window = torch.from_numpy(np.concatenate([rows, cols], axis=1)).to(self.device)
        return self.render_tensors(st, m, v, caps, window[:, : rows.shape[1]], window[:, rows.shape[1] :])

    def render_tensors(
        self,
        scene: SceneTensors,
        m: torch.Tensor,
        v: torch.Tensor,
        caps: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch on the device: cameras m, v [F,4,4], capsules [F,K,7], the capsule window's
        rows [F,h] / columns [F,w] (``capsule_window``)."""
        F = m.shape[0]
        fn = self._static_pass if self._static_pass is not None and F == 4 else static_pass
        args = (scene.lo, scene.hi, scene.cyl, scene.sph, scene.cls, scene.tables)
        origin, direction, t_static, cls, cells = fn(
            self.nx, self.ny, m, v, *args, self.extent_cm, self.cell_cm, self.n
        )
        # characters: the nearest capsule, drawn where it is nearer than the scene (window only)
        fi = torch.arange(F, device=m.device)[:, None, None]
        win = (fi, rows[:, :, None], cols[:, None, :])
        o, d = origin[win].reshape(F, -1, 3), direction[win].reshape(F, -1, 3)
        t_cap, which = capsules_t(o, d, caps).min(dim=-1)  # [F,h·w]
        drawn = t_cap < t_static[win].reshape(F, -1)
        sub = cls[win].reshape(F, -1).to(torch.int64)
        ids = cls.clone()
        ids[win] = (
            torch.where(drawn, self.part_ids[which], sub).to(torch.uint8).reshape(rows.shape + cols.shape[1:])
        )
        return ids, cells


class SeenGrid:
    """``deploy.world.SeenMemory`` on a device: a flat bool grid plus one spare slot (index n·n)
    that pixels without a grid cell write to and nothing reads (fixed shapes, no host sync)."""

    def __init__(self, n: int, device: torch.device):
        self.n = n
        self.seen = torch.zeros(n * n + 1, dtype=torch.bool, device=device)

    def _slot(self, cells: torch.Tensor) -> torch.Tensor:
        return torch.where(cells >= 0, cells, self.n * self.n)

    def known(self, cells: torch.Tensor) -> torch.Tensor:
        return (cells >= 0) & self.seen[self._slot(cells)]

    def mark(self, cells: torch.Tensor) -> None:
        self.seen[self._slot(cells).reshape(-1)] = True

    def mask(self, ids: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """Static pixels whose surface no earlier frame showed → UNKNOWN (characters and sky stay)."""
        unseen = (ids < NUM_STATIC) & (cells != SKY_CELL) & ~self.known(cells)
        return torch.where(unseen, UNKNOWN, ids).to(torch.uint8)
