"""Small PNG line plots drawn with OpenCV (no plotting library is a dependency): eval's per-cell
curves, a training run's curves, anything else a report or an asset's metadata shows.

    png = line_plot_png({"cond": [0.3, 0.2, None, 0.1]}, "val MSE", "MSE", log_y=True)
    png = line_plot_png({"loss": losses}, "loss", "loss", x={"loss": steps}, xlabel="step")
    png = stack_png([png_a, png_b])        # panels one under the other
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from gc25d_core.preview import png_bytes

# matplotlib's tab10, in its order: ten series (an eval of every export and a few variants) before a
# colour repeats
COLORS = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)


def decode_png(png: bytes) -> np.ndarray:
    bgr = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError("not a PNG OpenCV can decode")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def ascii_text(text: str) -> str:
    # OpenCV's Hershey fonts draw ASCII only
    return text.replace("Δ", "d").replace("–", "-").encode("ascii", "replace").decode()


def _tick(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e5 else f"{v:.2e}"


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Tick values in [lo, hi] at a round step (1, 2, 2.5 or 5 × 10^k) giving about ``target``
    ticks, so the axis reads 100, 200, … rather than the range cut in equal parts (30, 84, 138, …)."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / target
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def line_plot_png(
    series: Mapping[str, Sequence[float | None]],
    title: str,
    ylabel: str,
    *,
    x: Mapping[str, Sequence[float]] | None = None,
    log_y: bool = False,
    xlabel: str = "cell",
    size: tuple[int, int] = (760, 380),
) -> bytes:
    """One line per series; ``x[name]`` gives a series' x values (default 0, 1, …). Missing values
    (None / NaN, or ≤ 0 on a log axis) break the line."""
    w, h = size
    left, right, top, bottom = 70, 170, 30, 45
    img = np.full((h, w, 3), 255, np.uint8)
    xs = {name: list(x[name]) if x and name in x else list(range(len(s))) for name, s in series.items()}

    def ok(v: float | None) -> bool:
        return v is not None and math.isfinite(v) and (v > 0 or not log_y)

    def tr(v: float) -> float:
        return math.log10(v) if log_y else v

    vals = [tr(float(v)) for s in series.values() for v in s if v is not None and ok(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    all_x = [float(v) for xv in xs.values() for v in xv]
    x_lo, x_hi = (min(all_x), max(all_x)) if all_x else (0.0, 1.0)
    if x_hi - x_lo < 1e-12:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    pw, ph = w - left - right, h - top - bottom

    def px(xv: float) -> int:
        return int(round(left + (xv - x_lo) / (x_hi - x_lo) * pw))

    def py(v: float) -> int:
        return int(round(top + (1.0 - (tr(v) - lo) / (hi - lo)) * ph))

    font, grey = cv2.FONT_HERSHEY_SIMPLEX, (90, 90, 90)
    cv2.rectangle(img, (left, top), (left + pw, top + ph), grey, 1)
    # a log axis keeps five evenly spaced ticks (its values are powers); a linear one round values
    y_ticks = [lo + (hi - lo) * k / 4 for k in range(5)] if log_y else nice_ticks(lo, hi, 5)
    for v in y_ticks:
        y = int(round(top + (1 - (v - lo) / (hi - lo)) * ph))
        cv2.line(img, (left - 4, y), (left, y), grey, 1)
        cv2.putText(img, _tick(10**v if log_y else v), (4, y + 4), font, 0.38, grey, 1, cv2.LINE_AA)
    integer_x = all(float(v).is_integer() for v in all_x)
    for xv in nice_ticks(x_lo, x_hi):
        if integer_x and not xv.is_integer():  # cells, steps: no tick between two of them
            continue
        xp = px(xv)
        cv2.line(img, (xp, top + ph), (xp, top + ph + 4), grey, 1)
        label = str(int(xv)) if xv.is_integer() else _tick(xv)
        cv2.putText(img, label, (xp - 4 * len(label), top + ph + 18), font, 0.38, grey, 1, cv2.LINE_AA)
    cv2.putText(img, ascii_text(title), (left, 20), font, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, ascii_text(f"{xlabel} / {ylabel}"), (left, h - 8), font, 0.4, grey, 1, cv2.LINE_AA)
    for idx, (name, line) in enumerate(series.items()):
        color = COLORS[idx % len(COLORS)]
        prev: tuple[int, int] | None = None
        for xv, value in zip(xs[name], line, strict=False):
            if value is None or not ok(value):
                prev = None
                continue
            p = (px(float(xv)), py(float(value)))
            if prev is not None:
                cv2.line(img, prev, p, color, 2, cv2.LINE_AA)
            else:
                cv2.circle(img, p, 2, color, -1)
            prev = p
        ly = top + 14 + 18 * idx
        cv2.line(img, (left + pw + 10, ly - 4), (left + pw + 30, ly - 4), color, 2)
        cv2.putText(img, ascii_text(name)[:20], (left + pw + 34, ly), font, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    return png_bytes(img)


def stack_png(panels: Sequence[bytes]) -> bytes:
    """PNG panels one under the other (padded to the widest)."""
    images = [decode_png(p) for p in panels]
    width = max(im.shape[1] for im in images)
    padded = [np.pad(im, ((0, 0), (0, width - im.shape[1]), (0, 0)), constant_values=255) for im in images]
    return png_bytes(np.concatenate(padded, axis=0))
