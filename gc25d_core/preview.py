"""Small previews for dashboards: colour-coded semantic ids as PNG bytes."""

from __future__ import annotations

import cv2
import numpy as np

from gc25d_core.vocab import valid_raw_ids

# one distinct colour per parts-vocab raw id (RGB); UNKNOWN is black
_PALETTE = np.zeros((256, 3), np.uint8)
for _i, _raw in enumerate(valid_raw_ids("parts")[:-1]):
    _hue = int(180 * _i / 19)
    _PALETTE[_raw] = cv2.cvtColor(np.array([[[_hue, 200, 230]]], np.uint8), cv2.COLOR_HSV2RGB)[0, 0]


def colorize_ids(ids: np.ndarray) -> np.ndarray:
    """uint8 ids [...,H,W] → RGB uint8 [...,H,W,3]."""
    return _PALETTE[np.asarray(ids, dtype=np.uint8)]


def ids_strip_png(ids_THW: np.ndarray, num: int = 5, max_width: int = 1024) -> bytes:
    """``num`` evenly spaced frames side by side, colour-coded, as PNG bytes (at most ``max_width`` wide)."""
    t = ids_THW.shape[0]
    picks = np.linspace(0, t - 1, num).round().astype(int)
    strip = np.concatenate([colorize_ids(ids_THW[i]) for i in picks], axis=1)
    if strip.shape[1] > max_width:
        scale = max_width / strip.shape[1]
        strip = cv2.resize(
            strip, (max_width, max(1, int(strip.shape[0] * scale))), interpolation=cv2.INTER_NEAREST
        )
    ok, buf = cv2.imencode(".png", cv2.cvtColor(strip, cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()
