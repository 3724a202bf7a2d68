"""Deterministic lattice value noise (vectorised numpy), the code world's only source of texture.

Lattice values come from a fixed 256×256 table of a seeded generator (periodic every 256 lattice
units, far beyond any texture scale used), looked up with integer wrapping — much cheaper than
hashing every corner.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_SIZE = 256
_MASK = _SIZE - 1


@lru_cache(maxsize=64)
def _table(seed: int) -> np.ndarray:
    t = np.random.default_rng([seed & 0xFFFFFFFF, 4242]).random((_SIZE, _SIZE))
    t.setflags(write=False)
    return t


def hash01(ix: np.ndarray, iy: np.ndarray, seed: int) -> np.ndarray:
    """Integer lattice points (any int arrays, broadcast) → f64 in [0, 1)."""
    return _table(seed)[np.asarray(iy, np.int64) & _MASK, np.asarray(ix, np.int64) & _MASK]


def value_noise(x: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """Smooth 2-D value noise in [0, 1] at f64 coordinates (lattice spacing 1)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    fx, fy = np.floor(x), np.floor(y)
    u, v = x - fx, y - fy
    u = u * u * (3.0 - 2.0 * u)
    v = v * v * (3.0 - 2.0 * v)
    ix = fx.astype(np.int64) & _MASK
    iy = fy.astype(np.int64) & _MASK
    ix1, iy1 = (ix + 1) & _MASK, (iy + 1) & _MASK
    t = _table(seed)
    a, b = t[iy, ix], t[iy, ix1]
    c, d = t[iy1, ix], t[iy1, ix1]
    top = a + (b - a) * u
    return top + (c + (d - c) * u - top) * v


def fbm(x: np.ndarray, y: np.ndarray, seed: int, octaves: int = 3) -> np.ndarray:
    """Fractal sum of ``octaves`` value-noise layers (×2 frequency, ×0.5 amplitude), in [0, 1]."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    total = np.zeros(np.broadcast(x, y).shape)
    amp, norm, freq = 1.0, 0.0, 1.0
    for k in range(octaves):
        total += amp * value_noise(x * freq + 17.3 * k, y * freq - 9.1 * k, seed + k)
        norm += amp
        amp *= 0.5
        freq *= 2.0
    return total / norm
