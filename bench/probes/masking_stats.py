"""SPEC §7 UNKNOWN half-plane masking measured on the code world (issue 7).

For every clip of the code-world preset (cond + meta built as in bench/probes/ext_canvas_stats.py) draws
``--draws`` maskings (numpy Generator, seed ``--seed``) and reports the per-frame masked fraction —
masked static pixels / static pixels of the frame — over all (clip, draw, frame):

  per_frame      mean and p90 of the per-frame fraction
  per_sample_max mean and p90 of each sample's largest per-frame fraction (the SPEC's "max-frame")
  nan_share      the part of it that comes from NaN ground points (rays above the horizon: masked
                 whenever masking applies, SPEC "NaN ground points → masked")
  planes_only    the same statistics counting only plane-hit static pixels (NaN pixels left out of
                 numerator and denominator): what the calibration bounds by q

  *_all_samples  the per-frame mean over every training sample, i.e. × P(masking) = 0.5 × (1 − 0.05)
                 (samples without masking have nothing masked)

beside the SPEC's "max-frame p90 0.37, mean 0.06". Prints one JSON object.

    python -m bench.probes.masking_stats [--root /tmp/gc25d_canvas] [--preset tiny|full] [--draws 200]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.probes.ext_canvas_stats import prepare
from gc25d_core.index import read_index
from gc25d_core.layout import Layout, Shapes, read_cond, read_meta
from gc25d_core.masking import DropoutRates, masking_ground_xy, unknown_mask

P_MASKED = DropoutRates().unknown_mask * (1 - DropoutRates().cond)


def _stats(x: np.ndarray) -> dict[str, float]:
    return {"mean": round(float(np.mean(x)), 4), "p90": round(float(np.percentile(x, 90)), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("/tmp/gc25d_canvas"))
    p.add_argument("--preset", choices=("tiny", "full"), default="tiny")
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = prepare(args.root / args.preset, args.preset)
    lay, shapes, n = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), cfg.timeline.num_frames
    rng = np.random.default_rng(args.seed)
    frac, frac_planes, nan_part, smax, smax_planes, num_planes, t0 = (
        [],
        [],
        [],
        [],
        [],
        [],
        time.perf_counter(),
    )
    per_clip = {}
    for row in read_index(lay):
        meta = read_meta(lay, row.clip_id, shapes, row.has_ext)
        cond = read_cond(lay, row.clip_id, shapes)
        xy = masking_ground_xy(meta, cfg.geometry, n)
        static = cond < 7
        nan_px = np.repeat(np.repeat(~np.isfinite(xy).all(-1), 4, axis=1), 4, axis=2) & static
        n_static = np.maximum(static.sum(axis=(1, 2)), 1)
        n_hit = np.maximum((static & ~nan_px).sum(axis=(1, 2)), 1)
        nan_frac = nan_px.sum(axis=(1, 2)) / n_static
        clip_frac = []
        for _ in range(args.draws):
            mask, planes = unknown_mask(cond, xy, rng)
            f = mask.sum(axis=(1, 2)) / n_static
            fp = (mask & ~nan_px).sum(axis=(1, 2)) / n_hit
            frac.append(f)
            frac_planes.append(fp)
            nan_part.append(nan_frac)
            smax.append(f.max())
            smax_planes.append(fp.max())
            num_planes.append(planes.num_planes)
            clip_frac.append(f.mean())
        per_clip[row.clip_id] = {
            "camera": row.camera_variant,
            "mean_frac": round(float(np.mean(clip_frac)), 4),
            "nan_frac": round(float(nan_frac.mean()), 4),
        }
    frac_a, planes_a = np.concatenate(frac), np.concatenate(frac_planes)
    out = {
        "preset": args.preset,
        "geometry": f"{cfg.geometry.dst_width}x{cfg.geometry.dst_height}",
        "num_clips": len(per_clip),
        "draws_per_clip": args.draws,
        "seconds": round(time.perf_counter() - t0, 1),
        "two_plane_share": round(float(np.mean(np.array(num_planes) == 2)), 4),
        "per_frame": _stats(frac_a),
        "per_sample_max": _stats(np.array(smax)),
        "nan_share_per_frame": _stats(np.concatenate(nan_part)),
        "planes_only": {"per_frame": _stats(planes_a), "per_sample_max": _stats(np.array(smax_planes))},
        "per_frame_mean_all_samples": round(float(frac_a.mean()) * P_MASKED, 4),
        "planes_only_per_frame_mean_all_samples": round(float(planes_a.mean()) * P_MASKED, 4),
        "spec": {"per_sample_max_p90": 0.37, "mean": 0.06},
        "per_clip": per_clip,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
