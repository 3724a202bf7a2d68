"""SPEC §1: source 1280×704 → crop x∈[30,1250) → 832×480.

RGB is resampled with cv2 INTER_AREA; ids with centre-aligned nearest neighbour through precomputed
index maps (every destination pixel centre is mapped into the crop and floored). The constants are a
``GeometryConfig`` so the tiny preset can use smaller frames under the same rules.
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np

from gc25d_core.config import GeometryConfig

V10 = GeometryConfig()


@lru_cache(maxsize=16)
def _index_maps(geom: GeometryConfig) -> tuple[np.ndarray, np.ndarray]:
    crop_w = geom.crop_x1 - geom.crop_x0
    idx_x = np.floor((np.arange(geom.dst_width) + 0.5) * crop_w / geom.dst_width).astype(np.intp)
    idx_y = np.floor((np.arange(geom.dst_height) + 0.5) * geom.src_height / geom.dst_height).astype(np.intp)
    idx_x = np.clip(idx_x, 0, crop_w - 1) + geom.crop_x0
    idx_y = np.clip(idx_y, 0, geom.src_height - 1)
    idx_x.setflags(write=False)
    idx_y.setflags(write=False)
    return idx_y, idx_x


def index_maps(geom: GeometryConfig = V10) -> tuple[np.ndarray, np.ndarray]:
    """(_IDX_Y [dst_h], _IDX_X [dst_w]): the source row/column each destination pixel samples."""
    return _index_maps(geom)


def _check_src(frames: np.ndarray, geom: GeometryConfig, what: str) -> None:
    h, w = frames.shape[-3:-1] if what == "rgb" else frames.shape[-2:]
    if (h, w) != (geom.src_height, geom.src_width):
        raise ValueError(
            f"{what}: expected source frames of {geom.src_width}x{geom.src_height}, got {w}x{h} "
            f"(shape {tuple(frames.shape)})"
        )


def resample_ids(ids: np.ndarray, geom: GeometryConfig = V10) -> np.ndarray:
    """ids [..., src_h, src_w] uint8 → [..., dst_h, dst_w] by centre-aligned nearest inside the crop."""
    ids = np.asarray(ids)
    _check_src(ids, geom, "ids")
    idx_y, idx_x = index_maps(geom)
    return ids[..., idx_y[:, None], idx_x[None, :]]


def resample_rgb(rgb: np.ndarray, geom: GeometryConfig = V10) -> np.ndarray:
    """rgb [src_h, src_w, 3] or [T, src_h, src_w, 3] uint8 → cropped and INTER_AREA-resized to dst."""
    rgb = np.asarray(rgb)
    _check_src(rgb, geom, "rgb")
    size = (geom.dst_width, geom.dst_height)
    if rgb.ndim == 3:
        crop = rgb[:, geom.crop_x0 : geom.crop_x1]
        return cv2.resize(np.ascontiguousarray(crop), size, interpolation=cv2.INTER_AREA)
    out = np.empty((rgb.shape[0], geom.dst_height, geom.dst_width, 3), dtype=rgb.dtype)
    for i, frame in enumerate(rgb):
        crop = np.ascontiguousarray(frame[:, geom.crop_x0 : geom.crop_x1])
        out[i] = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
    return out


def src_to_dst(x: np.ndarray | float, y: np.ndarray | float, geom: GeometryConfig = V10):
    """Continuous pixel coordinates (pixel centres at integers) from source to destination.

    The source image centre ((W-1)/2, (H-1)/2) = (639.5, 351.5) lands on (415.5, 239.5).
    """
    sx = geom.dst_width / (geom.crop_x1 - geom.crop_x0)
    sy = geom.dst_height / geom.src_height
    return (np.asarray(x) - geom.crop_x0 + 0.5) * sx - 0.5, (np.asarray(y) + 0.5) * sy - 0.5


def dst_to_src(x: np.ndarray | float, y: np.ndarray | float, geom: GeometryConfig = V10):
    """Inverse of ``src_to_dst``."""
    sx = geom.dst_width / (geom.crop_x1 - geom.crop_x0)
    sy = geom.dst_height / geom.src_height
    return (np.asarray(x) + 0.5) / sx + geom.crop_x0 - 0.5, (np.asarray(y) + 0.5) / sy - 0.5


def player_anchor_dst(geom: GeometryConfig = V10) -> tuple[float, float]:
    """Where a centred player lands after crop + resize: the destination centre (415.5, 239.5)."""
    return (geom.dst_width - 1) / 2, (geom.dst_height - 1) / 2


def src_to_dst_px(x: np.ndarray | float, y: np.ndarray | float, geom: GeometryConfig = V10) -> np.ndarray:
    """Integer destination pixel (int32 [..., 2] as x, y) containing a source point; clipped to the frame."""
    dx, dy = src_to_dst(x, y, geom)
    px = np.clip(np.floor(np.asarray(dx) + 0.5), 0, geom.dst_width - 1)
    py = np.clip(np.floor(np.asarray(dy) + 0.5), 0, geom.dst_height - 1)
    return np.stack([px, py], axis=-1).astype(np.int32)
