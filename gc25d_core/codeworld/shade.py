"""RGB from ids: per-class procedural textures in world space, sun + sky lighting, blob shadows, fog.

A pixel's colour depends on its class (the look's base colours), the world point it shows (texture),
its surface normal (lighting) and its distance (fog) — so RGB is learnable from the ids yet never a
flat palette. Styles are the looks of v9_stylized runs ("golden", "autumn", "snow", "default") and
"real" for v10_real.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gc25d_core.codeworld.noise import fbm, hash01, value_noise
from gc25d_core.codeworld.scene import ARCHITECTURE, PAVING, PROP, ROCK, SKY, TERRAIN, VEGETATION
from gc25d_core.vocab import BOSS_PART_IDS, PLAYER_PART_IDS

RGB = tuple[float, float, float]


@dataclass(frozen=True)
class Style:
    """Base colours (linear 0..1) and lighting of a look."""

    terrain: tuple[RGB, RGB]
    paving: RGB
    architecture: tuple[RGB, RGB]  # walls, roofs
    rock: RGB
    vegetation: tuple[RGB, RGB]
    prop: RGB
    sky: tuple[RGB, RGB]  # horizon, zenith
    sun_dir: RGB
    sun: RGB
    ambient: float
    fog_cm: float
    player: tuple[RGB, ...]  # core, l_arm, r_arm, l_leg, r_leg, weapon
    boss: tuple[RGB, ...]


_PLAYER = (
    (0.20, 0.30, 0.55),
    (0.55, 0.60, 0.70),
    (0.50, 0.56, 0.68),
    (0.18, 0.20, 0.28),
    (0.22, 0.22, 0.30),
    (0.85, 0.85, 0.90),
)
_BOSS = (
    (0.45, 0.08, 0.06),
    (0.55, 0.42, 0.20),
    (0.50, 0.38, 0.18),
    (0.25, 0.14, 0.10),
    (0.28, 0.15, 0.10),
    (0.35, 0.35, 0.38),
)


def _style(terrain, paving, arch, rock, veg, prop, sky, sun_dir, sun, ambient, fog_cm) -> Style:
    return Style(terrain, paving, arch, rock, veg, prop, sky, sun_dir, sun, ambient, fog_cm, _PLAYER, _BOSS)


STYLES: dict[str, Style] = {
    "real": _style(
        ((0.34, 0.42, 0.16), (0.46, 0.36, 0.22)),
        (0.72, 0.66, 0.52),
        ((0.70, 0.42, 0.30), (0.30, 0.20, 0.18)),
        (0.42, 0.44, 0.50),
        ((0.12, 0.42, 0.10), (0.06, 0.26, 0.06)),
        (0.62, 0.40, 0.16),
        ((0.78, 0.85, 0.93), (0.30, 0.50, 0.85)),
        (0.4, -0.3, 0.85),
        (1.0, 0.96, 0.88),
        0.40,
        14000.0,
    ),
    "golden": _style(
        ((0.70, 0.56, 0.20), (0.78, 0.48, 0.16)),
        (0.88, 0.76, 0.50),
        ((0.92, 0.70, 0.40), (0.62, 0.22, 0.10)),
        (0.60, 0.50, 0.44),
        ((0.55, 0.65, 0.12), (0.30, 0.48, 0.08)),
        (0.74, 0.42, 0.14),
        ((1.00, 0.84, 0.55), (0.50, 0.58, 0.88)),
        (-0.5, 0.3, 0.45),
        (1.0, 0.85, 0.6),
        0.45,
        9000.0,
    ),
    "autumn": _style(
        ((0.58, 0.30, 0.10), (0.46, 0.20, 0.08)),
        (0.58, 0.52, 0.46),
        ((0.62, 0.52, 0.46), (0.26, 0.16, 0.20)),
        (0.40, 0.38, 0.36),
        ((0.90, 0.38, 0.06), (0.70, 0.16, 0.04)),
        (0.45, 0.28, 0.14),
        ((0.88, 0.72, 0.55), (0.42, 0.48, 0.66)),
        (0.3, 0.5, 0.6),
        (1.0, 0.88, 0.72),
        0.42,
        8000.0,
    ),
    "snow": _style(
        ((0.92, 0.94, 0.98), (0.80, 0.85, 0.94)),
        (0.52, 0.54, 0.60),
        ((0.55, 0.58, 0.66), (0.94, 0.96, 1.00)),
        (0.38, 0.40, 0.46),
        ((0.10, 0.28, 0.22), (0.80, 0.88, 0.90)),
        (0.42, 0.30, 0.22),
        ((0.86, 0.89, 0.93), (0.58, 0.66, 0.80)),
        (0.2, -0.6, 0.5),
        (0.95, 0.97, 1.0),
        0.55,
        6000.0,
    ),
    "default": _style(
        ((0.32, 0.52, 0.22), (0.26, 0.42, 0.18)),
        (0.66, 0.64, 0.60),
        ((0.80, 0.76, 0.70), (0.22, 0.28, 0.48)),
        (0.48, 0.46, 0.44),
        ((0.16, 0.58, 0.18), (0.08, 0.40, 0.12)),
        (0.64, 0.42, 0.20),
        ((0.80, 0.88, 0.96), (0.32, 0.54, 0.92)),
        (0.5, 0.5, 0.7),
        (1.0, 1.0, 0.95),
        0.42,
        12000.0,
    ),
}


_TONE_LEVELS = 2048
_TONE = np.round(np.linspace(0.0, 1.0, _TONE_LEVELS) ** 0.8 * 255.0).astype(np.uint8)
"""Display curve: linear 0..1 → uint8 (x^0.8), as a lookup table."""


@dataclass(frozen=True)
class GBuffer:
    """What shading needs per pixel (all [H,W] or [H,W,3]).

    ids: uint8 parts ids (static 0..6, player 10,12..16, boss 11,17..21); t: f64 ray distance (inf for
    sky); pos: f64 world point (any value on sky); normal: f64 unit normal; direction: f64 unit ray.
    """

    ids: np.ndarray
    t: np.ndarray
    pos: np.ndarray
    normal: np.ndarray
    direction: np.ndarray


def _mix(a: RGB, b: RGB, w: np.ndarray) -> np.ndarray:
    a_, b_ = np.asarray(a), np.asarray(b)
    return a_ + (b_ - a_) * w[:, None]


def _tiles(u: np.ndarray, v: np.ndarray, seed: int, mortar: float) -> tuple[np.ndarray, np.ndarray]:
    """Running-bond tiles on (u, v) in tile units → (per-tile random [0,1), mortar mask)."""
    row = np.floor(v)
    uu = u + 0.5 * (row % 2)
    col = np.floor(uu)
    fu, fv = uu - col, v - row
    edge = (fu < mortar) | (fu > 1 - mortar) | (fv < mortar * 2) | (fv > 1 - mortar * 2)
    return hash01(col.astype(np.int64), row.astype(np.int64), seed), edge


def _albedo_static(cls: int, p: np.ndarray, n: np.ndarray, st: Style, seed: int) -> np.ndarray:
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    if cls == TERRAIN:
        w = fbm(x / 350.0, y / 350.0, seed + 1)
        grain = value_noise(x / 25.0, y / 25.0, seed + 2)
        return _mix(*st.terrain, w) * (0.85 + 0.3 * grain)[:, None]
    if cls == PAVING:
        tile, edge = _tiles(x / 90.0, y / 90.0, seed + 3, 0.05)
        col = np.asarray(st.paving)[None, :] * (0.8 + 0.35 * tile)[:, None]
        return np.where(edge[:, None], col * 0.55, col)
    if cls == ARCHITECTURE:
        roof = n[:, 2] > 0.5
        h = x * np.abs(n[:, 1]) + y * np.abs(n[:, 0])
        tile, edge = _tiles(h / 70.0, z / 32.0, seed + 4, 0.04)
        wall = np.asarray(st.architecture[0])[None, :] * (0.8 + 0.3 * tile)[:, None]
        wall = np.where(edge[:, None], wall * 0.6, wall)
        stripes = 0.8 + 0.2 * (np.floor((x + y) / 40.0) % 2)
        return np.where(roof[:, None], np.asarray(st.architecture[1])[None, :] * stripes[:, None], wall)
    if cls == ROCK:
        u = x + y * 0.7 + z * 0.3
        v = z + x * 0.4 - y * 0.2
        w = fbm(u / 60.0, v / 60.0, seed + 5, octaves=3)
        return np.asarray(st.rock)[None, :] * (0.55 + 0.8 * w)[:, None]
    if cls == VEGETATION:
        leaf = value_noise((x + z) / 12.0, (y - z) / 12.0, seed + 6)
        w = fbm(x / 200.0, y / 200.0 + z / 150.0, seed + 7, octaves=2)
        return _mix(*st.vegetation, w) * (0.7 + 0.5 * leaf)[:, None]
    if cls == PROP:
        along = np.where(np.abs(n[:, 2]) > 0.5, x, z)
        plank = (along / 18.0) % 1.0
        grain = value_noise((x + y) / 6.0, z / 40.0, seed + 8)
        base = np.asarray(st.prop)[None, :] * (0.75 + 0.35 * grain)[:, None]
        return np.where((plank < 0.08)[:, None], base * 0.5, base)
    raise ValueError(f"no texture for class {cls}")


def _sky(d: np.ndarray, st: Style, seed: int) -> np.ndarray:
    elev = np.clip(d[:, 2], 0.0, 1.0)
    col = _mix(st.sky[0], st.sky[1], np.sqrt(elev))
    with np.errstate(divide="ignore", invalid="ignore"):
        u = d[:, 0] / np.maximum(d[:, 2], 0.05)
        v = d[:, 1] / np.maximum(d[:, 2], 0.05)
    cloud = np.clip((fbm(u * 1.5, v * 1.5, seed + 9, octaves=3) - 0.5) * 2.5, 0.0, 1.0) * (elev > 0.02)
    return col + (1.0 - col) * (0.8 * cloud)[:, None]


def _character(ids: np.ndarray, p: np.ndarray, st: Style, seed: int) -> np.ndarray:
    table = np.zeros((256, 3))
    for i, c in zip(PLAYER_PART_IDS, st.player, strict=True):
        table[i] = c
    for i, c in zip(BOSS_PART_IDS, st.boss, strict=True):
        table[i] = c
    fine = value_noise((p[:, 0] + p[:, 2]) / 4.0, (p[:, 1] - p[:, 2]) / 4.0, seed + 10)
    band = 0.9 + 0.1 * np.sign(np.sin(p[:, 2] / 6.0))
    return table[ids] * ((0.85 + 0.25 * fine) * band)[:, None]


def shade(gb: GBuffer, st: Style, seed: int, feet: np.ndarray) -> np.ndarray:
    """uint8 [H,W,3] RGB of a G-buffer under a style; ``feet`` f64 [A,3] cast blob shadows."""
    ids = gb.ids.reshape(-1)
    p = gb.pos.reshape(-1, 3)
    n = gb.normal.reshape(-1, 3)
    d = gb.direction.reshape(-1, 3)
    t = gb.t.reshape(-1)
    albedo = np.zeros((len(ids), 3))
    for cls in (TERRAIN, PAVING, ARCHITECTURE, ROCK, VEGETATION, PROP):
        m = ids == cls
        if m.any():
            albedo[m] = _albedo_static(cls, p[m], n[m], st, seed)
    chars = ids >= 10
    if chars.any():
        albedo[chars] = _character(ids[chars], p[chars], st, seed)
    sun = np.asarray(st.sun_dir) / np.linalg.norm(st.sun_dir)
    lambert = np.clip(n @ sun, 0.0, 1.0)
    light = st.ambient * (0.75 + 0.25 * n[:, 2:3]) + (1.0 - st.ambient) * lambert[:, None] * np.asarray(
        st.sun
    )
    col = albedo * light
    col *= _blob_shadows(p, ids, feet)[:, None]
    weapon = (ids == PLAYER_PART_IDS[-1]) | (ids == BOSS_PART_IDS[-1])
    if weapon.any():
        refl = d[weapon] - 2 * (d[weapon] * n[weapon]).sum(1, keepdims=True) * n[weapon]
        col[weapon] += 0.6 * np.clip(refl @ sun, 0.0, 1.0)[:, None] ** 12
    sky = ids == SKY
    fog = 1.0 - np.exp(-np.where(sky, 0.0, t) / st.fog_cm)
    horizon = np.asarray(st.sky[0])
    col = col * (1.0 - fog[:, None]) + horizon * fog[:, None]
    if sky.any():
        col[sky] = _sky(d[sky], st, seed)
    out = _TONE[np.clip(col * (_TONE_LEVELS - 1) + 0.5, 0, _TONE_LEVELS - 1).astype(np.intp)]
    return out.reshape(*gb.ids.shape, 3)


def _blob_shadows(p: np.ndarray, ids: np.ndarray, feet: np.ndarray) -> np.ndarray:
    """Darkening factor [N] of static pixels near the ground under each actor."""
    f = np.ones(len(ids))
    static = (ids < 10) & (ids != SKY) & (p[:, 2] < 5.0)
    if not static.any():
        return f
    q = p[static]
    shade_ = np.ones(len(q))
    for k, foot in enumerate(np.asarray(feet)):
        r = 45.0 if k == 0 else 75.0
        dist = np.hypot(q[:, 0] - foot[0], q[:, 1] - foot[1])
        shade_ *= 1.0 - 0.45 * np.clip(1.0 - dist / r, 0.0, 1.0)
    f[static] = shade_
    return f
