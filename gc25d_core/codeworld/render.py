"""Render one code-world frame: static layer by ray/scene intersection, characters by ray/capsule
intersection (plus mesh extras), scene occlusion by depth, then RGB by shading.

``render_frame`` works at source resolution and returns the UE-style labels (characters as 10 / 11)
next to the ground-truth part labels; ``render_semantic_dst`` is the inference-time code world: the
same "parts" numbers at destination resolution, sampled exactly as ``resample_ids`` would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gc25d_core.capsules import (
    ACTOR_CORE_IDS,
    PixelRays,
    bboxes_src,
    capsule_normals,
    cast_capsules,
    hits_to_part_ids,
    ray_sphere_t,
)
from gc25d_core.codeworld.camera import camera_matrices
from gc25d_core.codeworld.scene import GridRays, StaticScene, render_static
from gc25d_core.codeworld.shade import STYLES, GBuffer, shade
from gc25d_core.codeworld.sim import FrameState
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import index_maps

_EXTRA = -2  # capsule index given to mesh-extra hits (labelled core)


@dataclass(frozen=True)
class CharacterHits:
    """Nearest character surface per ray [N]: t (inf = none), actor (−1), capsule (−1, or −2 = extra),
    normal f64 [N,3]."""

    t: np.ndarray
    actor: np.ndarray
    capsule: np.ndarray
    normal: np.ndarray


def cast_characters(rays: PixelRays, capsules: np.ndarray, extras: tuple[np.ndarray, ...]) -> CharacterHits:
    """Capsules f64 [2,12,7] and extra spheres ([E,4] per actor) against rays."""
    t, actor, capsule = cast_capsules(rays, capsules)
    owners = (
        np.concatenate([np.full(len(e), a) for a, e in enumerate(extras)]) if extras else np.zeros(0, int)
    )
    spheres = (
        np.concatenate([np.asarray(e, np.float64).reshape(-1, 4) for e in extras])
        if extras
        else np.zeros((0, 4))
    )
    if len(spheres):
        boxes = bboxes_src(
            spheres[:, :3] - spheres[:, 3:],
            spheres[:, :3] + spheres[:, 3:],
            rays.world_to_clip,
            rays.width,
            rays.height,
        )
        for (x, y, z, r), a, box in zip(spheres, owners, boxes, strict=True):
            sel = rays.in_box(box)
            if len(sel) == 0:
                continue
            ts = ray_sphere_t(rays.origin[sel], rays.direction[sel], np.array([x, y, z]), float(r))
            better = ts < t[sel]
            hit = sel[better]
            t[hit], actor[hit], capsule[hit] = ts[better], a, _EXTRA
    normal = np.zeros((len(rays), 3))
    hit = actor >= 0
    if hit.any():
        pts = rays.at(t[hit], np.flatnonzero(hit))
        normal[hit] = _normals(pts, actor[hit], capsule[hit], capsules, extras)
    return CharacterHits(t, actor, capsule, normal)


def _normals(
    pts: np.ndarray,
    actor: np.ndarray,
    capsule: np.ndarray,
    capsules: np.ndarray,
    extras: tuple[np.ndarray, ...],
) -> np.ndarray:
    out = np.zeros_like(pts)
    for a in range(capsules.shape[0]):
        for c in range(capsules.shape[1]):
            m = (actor == a) & (capsule == c)
            if m.any():
                out[m] = capsule_normals(pts[m], capsules[a, c])
        m = (actor == a) & (capsule == _EXTRA)
        if m.any():
            sph = extras[a]
            d = pts[m][:, None, :] - sph[None, :, :3]
            k = np.argmin(np.abs(np.linalg.norm(d, axis=2) - sph[None, :, 3]), axis=1)
            nn = d[np.arange(len(k)), k]
            out[m] = nn / np.maximum(np.linalg.norm(nn, axis=1, keepdims=True), 1e-9)
    return out


@dataclass(frozen=True)
class FrameImages:
    """Source-resolution images of a frame: rgb uint8 [H,W,3]; ids uint8 [H,W] (UE labels: static
    0..6, player 10, boss 11); parts uint8 [H,W] (ground truth parts ids); depth f64 [H,W]."""

    rgb: np.ndarray
    ids: np.ndarray
    parts: np.ndarray
    depth: np.ndarray


def _compose(static_t, static_cls, static_n, ch: CharacterHits, shape):
    t_c = ch.t.reshape(shape)
    visible = t_c < static_t
    actor = np.where(visible.reshape(-1), ch.actor, -1).astype(np.int16)
    core = np.where(actor == 0, ACTOR_CORE_IDS[0], ACTOR_CORE_IDS[1]).astype(np.uint8)
    ue = np.where(actor >= 0, core, static_cls.reshape(-1))
    parts_cap = np.where(ch.capsule >= 0, ch.capsule, 0).astype(np.int16)
    parts = np.where((actor >= 0) & (ch.capsule >= 0), hits_to_part_ids(actor, parts_cap, 0), ue)
    depth = np.where(visible, t_c, static_t)
    normal = np.where(visible[..., None], ch.normal.reshape(*shape, 3), static_n)
    return ue.reshape(shape).astype(np.uint8), parts.reshape(shape).astype(np.uint8), depth, normal


def render_frame(
    scene: StaticScene, state: FrameState, width: int, height: int, style: str, texture_seed: int
) -> FrameImages:
    """Render ``state`` at source resolution width × height."""
    cam = camera_matrices(state.camera, width, height)
    grid = GridRays.full(cam.world_to_clip, cam.world_to_view, width, height)
    st = render_static(scene, grid)
    rays = PixelRays(
        np.broadcast_to(grid.gx[None, :], grid.shape).ravel(),
        np.broadcast_to(grid.gy[:, None], grid.shape).ravel(),
        grid.origin.reshape(-1, 3),
        grid.direction.reshape(-1, 3),
        grid.world_to_clip,
        width,
        height,
        grid=(grid.gx, grid.gy),
    )
    ch = cast_characters(rays, state.capsules, state.extras)
    ue, parts, depth, normal = _compose(st.t, st.cls, st.normal, ch, grid.shape)
    finite = np.where(np.isfinite(depth), depth, 0.0)
    pos = grid.origin + finite[..., None] * grid.direction
    gb = GBuffer(parts, depth, pos, normal, grid.direction)
    rgb = shade(gb, STYLES[style], texture_seed, state.feet)
    return FrameImages(rgb, ue, parts, depth)


def render_semantic_dst(
    scene: StaticScene,
    world_to_clip: np.ndarray,
    world_to_view: np.ndarray,
    capsules: np.ndarray,
    geometry: GeometryConfig,
    extras: tuple[np.ndarray, ...] = (),
) -> np.ndarray:
    """The inference-time condition: "parts" ids uint8 [dst_h, dst_w] from the static scene, a camera
    and capsules f64 [2,12,7], on the destination grid (rays through the source pixels resample_ids
    samples). With ``extras`` mesh spheres are drawn as core; without them it is capsules alone."""
    idx_y, idx_x = index_maps(geometry)
    grid = GridRays.build(
        idx_x.astype(np.float64),
        idx_y.astype(np.float64),
        world_to_clip,
        world_to_view,
        geometry.src_width,
        geometry.src_height,
    )
    st = render_static(scene, grid)
    rays = PixelRays(
        np.broadcast_to(grid.gx[None, :], grid.shape).ravel(),
        np.broadcast_to(grid.gy[:, None], grid.shape).ravel(),
        grid.origin.reshape(-1, 3),
        grid.direction.reshape(-1, 3),
        grid.world_to_clip,
        geometry.src_width,
        geometry.src_height,
        grid=(grid.gx, grid.gy),
    )
    ch = cast_characters(
        rays, np.asarray(capsules, np.float64), extras or (np.zeros((0, 4)), np.zeros((0, 4)))
    )
    _, parts, _, _ = _compose(st.t, st.cls, st.normal, ch, grid.shape)
    return parts
