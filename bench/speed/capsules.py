"""label_parts and render_capsules throughput at 832×480, frames/s on one core (issue 3).

python -m gc25d_core.codeworld generate /tmp/full_raw --preset full
OMP_NUM_THREADS=1 python -m bench.speed.capsules --raw /tmp/full_raw --frames 20
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from gc25d_core.capsules import label_parts, render_capsules
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import resample_ids
from gc25d_core.raw_frames import read_frame_json, read_ids
from gc25d_core.raw_layout import RawSource


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", type=Path, required=True)
    ap.add_argument("--frames", type=int, default=20)
    args = ap.parse_args()
    geom = GeometryConfig()
    run = RawSource(args.raw).runs()[0]
    step = max(1, run.info.num_frames // args.frames)
    frames = list(range(0, run.info.num_frames, step))[: args.frames]
    inputs = []
    for f in frames:
        fj = read_frame_json(run, f)
        inputs.append((resample_ids(read_ids(run, f), geom), fj))
    char_px = float(np.mean([np.isin(ids, (10, 11)).mean() for ids, _ in inputs]))
    t0 = time.perf_counter()
    for ids, fj in inputs:
        label_parts(ids, fj.world_to_clip, fj.world_to_view, fj, geom)
    t_label = (time.perf_counter() - t0) / len(inputs)
    background = np.zeros((geom.dst_height, geom.dst_width), np.uint8)
    t0 = time.perf_counter()
    for _, fj in inputs:
        render_capsules(fj, fj.world_to_clip, fj.world_to_view, background, geom)
    t_render = (time.perf_counter() - t0) / len(inputs)
    print(
        json.dumps(
            {
                "frames": len(inputs),
                "hw": [geom.dst_height, geom.dst_width],
                "character_px_frac": char_px,
                "label_parts_ms": 1000 * t_label,
                "label_parts_frames_per_s": 1 / t_label,
                "render_capsules_ms": 1000 * t_render,
                "render_capsules_frames_per_s": 1 / t_render,
            }
        )
    )


if __name__ == "__main__":
    main()
