"""Small previews for dashboards: colour-coded semantic ids as PNG bytes, and short videos.

Videos are H.264 in MP4 (yuv420p, faststart), which Chromium plays inline, written through the
ffmpeg binary that the ``imageio-ffmpeg`` wheel ships, so no system ffmpeg is needed; where that
binary cannot run, an animated GIF (Pillow) is written instead. ``video_info`` decodes a file back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    return png_bytes(strip)


def png_bytes(rgb: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def labelled(panel: np.ndarray, label: str) -> np.ndarray:
    """``[T, H, W, 3]`` with ``label`` drawn in its top-left corner of every frame (a copy)."""
    out = np.ascontiguousarray(panel).copy()
    scale = max(out.shape[1] / 160, 0.3)
    for f in out:
        cv2.putText(f, label, (3, int(12 * scale) + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * scale, (0, 0, 0), 2)
        cv2.putText(
            f, label, (3, int(12 * scale) + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * scale, (255, 255, 255), 1
        )
    return out


def side_by_side(panels: Sequence[np.ndarray], labels: Sequence[str] = (), scale: int = 2) -> np.ndarray:
    """RGB uint8 clips ``[T, H, W, 3]`` (the same T and H) next to each other, each upscaled by
    ``scale`` (nearest: the tiny frames stay crisp) and labelled."""
    if not panels or len({(p.shape[0], p.shape[1]) for p in panels}) != 1:
        raise ValueError(f"panels must share T and H, got {[p.shape for p in panels]}")
    ups = [np.repeat(np.repeat(p, scale, axis=1), scale, axis=2) if scale > 1 else p for p in panels]
    ups = [labelled(u, lab) for u, lab in zip(ups, list(labels) + [""] * len(ups), strict=False)]
    return np.concatenate(ups, axis=2)


def strip_of(video_THWC: np.ndarray, num: int = 5) -> np.ndarray:
    """``num`` evenly spaced frames of a clip stacked top to bottom (an image of a video)."""
    picks = np.linspace(0, video_THWC.shape[0] - 1, num).round().astype(int)
    return np.concatenate([video_THWC[i] for i in picks], axis=0)


def _even(frames: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides: pad the last row / column by repetition where odd."""
    h, w = frames.shape[1:3]
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge") if h % 2 or w % 2 else frames


def _ffmpeg() -> str | None:
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # no wheel binary for this platform and none on PATH
        return None


def write_video(path: Path | str, frames_THWC: np.ndarray, fps: float = 16.0) -> Path:
    """RGB uint8 ``[T, H, W, 3]`` -> ``path`` (written atomically). ``.mp4``: H.264 yuv420p with the
    index up front (plays while loading); without ffmpeg the same frames go to ``<stem>.gif``.
    Returns the path written."""
    from gc25d_core.atomic import atomic_path

    frames = np.asarray(frames_THWC)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(f"frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {frames.shape}")
    path = Path(path)
    if path.suffix == ".mp4" and _ffmpeg() is not None:
        import imageio_ffmpeg

        frames = _even(frames)
        h, w = frames.shape[1:3]
        with atomic_path(path) as tmp:
            writer = imageio_ffmpeg.write_frames(
                str(tmp),
                (w, h),
                fps=fps,
                codec="libx264",
                pix_fmt_out="yuv420p",
                quality=None,
                macro_block_size=1,  # sizes are ours to choose: no silent rescale
                output_params=["-crf", "18", "-preset", "veryfast", "-movflags", "+faststart", "-f", "mp4"],
            )
            writer.send(None)
            for f in frames:
                writer.send(np.ascontiguousarray(f))
            writer.close()
        return path
    from PIL import Image

    gif = path.with_suffix(".gif")
    images = [Image.fromarray(f) for f in frames]
    with atomic_path(gif) as tmp:
        images[0].save(
            tmp, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
        )
    return gif


def video_info(path: Path | str) -> dict[str, Any]:
    """Decode a written preview back: ``{"frames", "width", "height", "first"}`` (``first``: the
    first frame, RGB uint8)."""
    path = Path(path)
    if path.suffix == ".gif":
        from PIL import Image, ImageSequence

        with Image.open(path) as im:
            seq = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]
        return {"frames": len(seq), "width": seq[0].shape[1], "height": seq[0].shape[0], "first": seq[0]}
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path))
    meta = gen.__next__()
    w, h = meta["size"]
    n, first = 0, None
    for buf in gen:
        if first is None:
            first = np.frombuffer(buf, np.uint8).reshape(h, w, 3).copy()
        n += 1
    return {"frames": n, "width": w, "height": h, "first": first, "codec": meta.get("codec")}


def animated_gif(path: Path | str, fps: float = 16.0, max_bytes: int = 4 << 20) -> bytes | None:
    """A written preview (MP4 or GIF) as an animated GIF in memory, for places that show images but
    no video tags (the Dagster UI's markdown drops ``<video>``); None when it would exceed
    ``max_bytes`` (metadata travels through the run storage)."""
    import io

    from PIL import Image

    path = Path(path)
    if path.suffix == ".gif":
        data = path.read_bytes()
        return data if len(data) <= max_bytes else None
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path))
    w, h = gen.__next__()["size"]
    images = [Image.fromarray(np.frombuffer(buf, np.uint8).reshape(h, w, 3)) for buf in gen]
    if not images:
        return None
    out = io.BytesIO()
    images[0].save(
        out, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
    )
    return out.getvalue() if out.tell() <= max_bytes else None
