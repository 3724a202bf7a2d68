"""Preview media: the video writer's file decodes back to the frames it was given (count, size),
the GIF fallback where ffmpeg is missing, and the SFT validation curves / gap table."""

from __future__ import annotations

import numpy as np

from gc25d_core import preview
from gc25d_core.preview import colorize_ids, side_by_side, strip_of, video_info, write_video


def _clip(t: int = 9, h: int = 33, w: int = 50) -> np.ndarray:
    """A smooth gradient that moves: easy for H.264, so decoded pixels stay close to the input."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack(
        [np.stack([(xx * 5 + 8 * k) % 256, yy * 7 % 256, np.full_like(xx, 128)], -1) for k in range(t)]
    ).astype(np.uint8)


def test_mp4_decodes_back_to_the_frame_count_and_size(tmp_path):
    clip = _clip()  # odd height: yuv420p needs even sides, the writer pads one row
    path = write_video(tmp_path / "p.mp4", clip, fps=8)
    assert path.suffix == ".mp4" and path.stat().st_size > 0
    info = video_info(path)
    assert info["codec"] == "h264"
    assert (info["frames"], info["width"], info["height"]) == (9, 50, 34)
    assert np.abs(info["first"][:33].astype(int) - clip[0]).mean() < 8
    assert not list(tmp_path.glob(".*"))  # written atomically: no temporary left


def test_gif_fallback_without_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setattr(preview, "_ffmpeg", lambda: None)
    path = write_video(tmp_path / "p.mp4", _clip(t=5, h=16, w=24))
    assert path.name == "p.gif"
    info = video_info(path)
    assert (info["frames"], info["width"], info["height"]) == (5, 24, 16)


def test_the_ui_player_is_an_animated_gif_of_every_frame(tmp_path):
    """The Dagster UI shows images in markdown but drops <video>: the player is the MP4's frames as
    an inline animated GIF (and nothing where it would be too large for run storage)."""
    import base64
    import io

    from PIL import Image, ImageSequence

    from gc25d_pipeline.lib.clip_jobs import video_metadata

    path = write_video(tmp_path / "p.mp4", _clip(t=7, h=16, w=24), fps=8)
    md = video_metadata({"video": path, "png": None}, "preview", "clip")
    assert set(md) == {"preview_video", "preview_player"}
    text = md["preview_player"].value
    assert text.startswith("![clip](data:image/gif;base64,") and "<video" not in text
    gif = base64.b64decode(text.split("base64,", 1)[1].rstrip(")"))
    with Image.open(io.BytesIO(gif)) as im:
        frames = [f.convert("RGB").size for f in ImageSequence.Iterator(im)]
    assert frames == [(24, 16)] * 7
    assert preview.animated_gif(path, max_bytes=10) is None


def test_side_by_side_panels_and_strip():
    ids = np.random.default_rng(0).integers(0, 20, (9, 16, 24)).astype(np.uint8)
    panels = side_by_side([_clip(9, 16, 24), colorize_ids(ids)], ["a", "b"], scale=2)
    assert panels.shape == (9, 32, 96, 3) and panels.dtype == np.uint8
    assert strip_of(panels, 3).shape == (96, 96, 3)


def test_curves_png_and_gap_table():
    import cv2

    from gc25d_core.train.previews import curves_png, gap_table

    recs = [
        {
            "step": s,
            **{
                f"{m}_mse_t{t}": v
                for t in (200, 500, 800)
                for m, v in (("cond", c), ("uncond", 1.0), ("null_text", c))
            },
        }
        for s, c in ((10, 0.95), (20, 0.8))
    ]
    img = cv2.imdecode(np.frombuffer(curves_png(recs), np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.shape == (3 * 260, 760, 3)  # a panel per t
    rows = gap_table(recs)
    assert rows[-1]["step"] == 20
    assert abs(rows[-1]["t800"]["cond_below_uncond"] - 0.2) < 1e-9
