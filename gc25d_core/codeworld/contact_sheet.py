"""A PNG contact sheet of a raw clip: rows of frames, columns RGB | ids | parts (colour-mapped).

    python -m gc25d_core.codeworld.contact_sheet RAW_ROOT SUBSET SCENE RUN START OUT.png \
        [--frames 0,20,40,60,80] [--geometry tiny|v10]

Frames are clip-relative. RGB and ids are shown after crop + resize (geometry.resample_rgb /
resample_ids); parts = capsules.label_parts of the resampled ids. The colours are for people only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

from gc25d_core.capsules import capsules_from_json, label_parts
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import resample_ids, resample_rgb
from gc25d_core.raw_frames import read_frame_json, read_ids, read_rgb
from gc25d_core.raw_layout import RawSource

_COLOURS = {
    0: (135, 190, 235),
    1: (110, 140, 60),
    2: (170, 165, 155),
    3: (200, 120, 90),
    4: (120, 120, 125),
    5: (40, 160, 60),
    6: (220, 170, 40),
    10: (40, 80, 230),
    12: (90, 200, 250),
    13: (20, 230, 200),
    14: (140, 60, 220),
    15: (230, 60, 230),
    16: (255, 255, 255),
    11: (200, 20, 20),
    17: (250, 140, 40),
    18: (250, 220, 60),
    19: (120, 40, 20),
    20: (180, 90, 60),
    21: (60, 60, 60),
    255: (0, 0, 0),
}
ID_COLOURS = np.zeros((256, 3), np.uint8)
for _k, _v in _COLOURS.items():
    ID_COLOURS[_k] = _v


def colourise(ids: np.ndarray) -> np.ndarray:
    """uint8 ids [H,W] → RGB uint8 [H,W,3] with a fixed, distinct colour per raw id."""
    return ID_COLOURS[np.asarray(ids, dtype=np.uint8)]


def clip_sheet(
    root: Path,
    subset: str,
    scene: str,
    run: str,
    start: int,
    frames: list[int],
    geometry: GeometryConfig,
    scale: int = 2,
) -> np.ndarray:
    """RGB uint8 [rows·H·scale, 3·W·scale, 3]: one row per frame, RGB | ids | parts."""
    rd = RawSource(root).run(subset, scene, run)
    rows = []
    for rel in frames:
        f = start + rel
        fj = read_frame_json(rd, f)
        ids = resample_ids(read_ids(rd, f), geometry)
        parts = label_parts(ids, fj.world_to_clip, fj.world_to_view, capsules_from_json(fj), geometry)
        row = np.concatenate(
            [resample_rgb(read_rgb(rd, f), geometry), colourise(ids), colourise(parts)], axis=1
        )
        rows.append(row)
    sheet = np.concatenate(rows, axis=0)
    return cv2.resize(sheet, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("subset")
    ap.add_argument("scene")
    ap.add_argument("run")
    ap.add_argument("start", type=int)
    ap.add_argument("out", type=Path)
    ap.add_argument("--frames", default="0,20,40,60,80")
    ap.add_argument("--geometry", choices=("tiny", "v10"), default="tiny")
    ap.add_argument("--scale", type=int, default=2)
    a = ap.parse_args(argv)
    from gc25d_core.codeworld.presets import TINY_GEOMETRY

    geom = TINY_GEOMETRY if a.geometry == "tiny" else GeometryConfig()
    sheet = clip_sheet(
        a.root, a.subset, a.scene, a.run, a.start, [int(x) for x in a.frames.split(",")], geom, a.scale
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(a.out), sheet[..., ::-1])
    print(a.out)


if __name__ == "__main__":
    main()
