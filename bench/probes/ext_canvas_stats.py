"""Extension canvas (SPEC §8 stage 3, issue 4 item 4) measured on the code world.

Generates the code-world preset (tiny: 128×64, or full: 832×480) under ``--root`` unless present,
builds the index, cond, meta and cond_ext with the preprocessing builders, then reports:

  unknown_ext          255 fraction of the canvas re-render in the extension frames s+81..s+108 of
                       the ext_look_change rows (what stage 3 trains on; SPEC ≈ 17 %)
  in_look_all          canvas of frames 0..80 re-rendered at frames 0..80 against the real cond's
                       static pixels (SPEC "static agreement on in-look frames" 97–98 %)
  in_look_leave_out    canvas of frames 0..80 minus frame k, re-rendered at k (k = 10, 30, 50, 70)
  in_look_forward      canvas of frames 0..52 re-rendered at frames 53..80 (28 frames ahead, like
                       the extension)
  ext_no_look_change   canvas of 0..80 re-rendered at s+81..s+108 of the rows whose look does not
                       change, against the raw cond_ext (the same prediction the canvas makes for
                       look-change rows, checkable here)
  in_look_all_recall_by_class / _agreement_ground_classes
                       in_look_all per real static class; ground classes = terrain + paving (on the
                       plane, so exact up to resolution); architecture and props stand upright
                       (pop-up points), rock and vegetation are either (canvas.pixel_roles)

  never_seen_ext       (--truth-step N) from the code world's own scene (old look) at every N-th
                       extension frame of the look-change rows: the share of pixels whose true
                       surface no frame 0..80 shows (in view, unoccluded, not under a character),
                       i.e. what an ideal canvas leaves unknown, beside the canvas's own unknown

agreement = equal ids among pixels static in both the real cond and the re-render; coverage = the
fraction of real static pixels the re-render shows as static. Prints one JSON object.

    python -m bench.probes.ext_canvas_stats [--root /tmp/gc25d_canvas] [--preset tiny|full] [--radius-cm 5000]
                                     [--truth-step 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gc25d_core.canvas import (
    CanvasParams,
    FrameCamera,
    build_canvas,
    canvas_plane_z,
    clip_canvas,
    project_dst,
    render_frames,
    static_agreement,
)
from gc25d_core.capsules import render_capsules
from gc25d_core.codeworld import generate, get_preset
from gc25d_core.codeworld.scene import GridRays, build_scene
from gc25d_core.codeworld.scene import render_static as scene_static
from gc25d_core.config import Gc25dConfig, GeometryConfig, load_config
from gc25d_core.geometry import index_maps
from gc25d_core.index import build_and_write, read_index
from gc25d_core.layout import Layout, Shapes, read_cond, read_cond_ext, read_meta
from gc25d_core.preprocess.tasks import cond_ext_task, cond_task, meta_task


def prepare(root: Path, preset: str) -> Gc25dConfig:
    geometry = {} if preset == "tiny" else GeometryConfig().model_dump()
    overrides: dict[str, Any] = {
        "paths": {"data_root": str(root / "data"), "runs_root": str(root / "runs")},
        "raw": {"root": str(root / "raw"), "codeworld_preset": preset},
    }
    if geometry:
        overrides["geometry"] = geometry
    cfg = load_config("tiny", overrides)
    generate(root / "raw", preset, seed=0)
    build_and_write(root / "raw", cfg)
    rows = read_index(Layout(root / "data"))
    for factory, wanted in ((cond_task, None), (meta_task, None), (cond_ext_task, "has_ext")):
        task = factory(cfg)
        for r in rows:
            if (wanted is None or getattr(r, wanted)) and not task.is_done(r):
                task.build(r)
    return cfg


def _merge(stats: list[dict[str, float]]) -> dict[str, float]:
    """Pixel-weighted agreement, mean coverage / unknown."""
    n = sum(s["num_compared"] for s in stats)
    return {
        "agreement": round(sum(s["agreement"] * s["num_compared"] for s in stats) / n, 4)
        if n
        else float("nan"),
        "coverage": round(float(np.mean([s["coverage"] for s in stats])), 4),
        "unknown": round(float(np.mean([s["unknown"] for s in stats])), 4),
        "num_compared": int(n),
    }


def measure(
    cfg: Gc25dConfig, params: CanvasParams, leave_out: tuple[int, ...] = (10, 30, 50, 70)
) -> dict[str, Any]:
    lay, shapes, g, tl = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), cfg.geometry, cfg.timeline
    n = tl.num_frames
    acc: dict[str, list[dict[str, float]]] = {
        k: [] for k in ("in_look_all", "in_look_leave_out", "in_look_forward", "ext_no_look_change")
    }
    unknown_ext, per_clip, seconds = [], [], []
    confusion = np.zeros((7, 7), np.int64)  # in_look_all: real static id × rendered static id
    for row in read_index(lay):
        if not row.has_ext:
            continue
        meta = read_meta(lay, row.clip_id, shapes, True)
        cond = read_cond(lay, row.clip_id, shapes)
        t0 = time.perf_counter()  # what ext_canvas_ids does: the canvas, then the extension frames
        canvas = clip_canvas(cond, meta, g, tl, params)
        ext = render_frames(canvas, meta, range(n, n + tl.num_ext_frames))
        seconds.append(time.perf_counter() - t0)
        clip: dict[str, Any] = {
            "clip_id": row.clip_id,
            "ext_look_change": row.ext_look_change,
            "seconds": round(seconds[-1], 3),
            "unknown_ext": round(float((ext == 255).mean()), 4),
        }
        if row.ext_look_change:
            unknown_ext.append(clip["unknown_ext"])
        else:
            real = read_cond_ext(lay.cond_ext(row.clip_id), shapes)["ids"]
            acc["ext_no_look_change"].append(static_agreement(ext, real))
        rendered = render_frames(canvas, meta, range(n))
        acc["in_look_all"].append(static_agreement(rendered, cond))
        both = (cond < 7) & (rendered < 7)
        np.add.at(confusion, (cond[both], rendered[both]), 1)
        z = canvas_plane_z(meta, tl)
        for k in leave_out:
            keep = np.array([f for f in range(n) if f != k])
            c = build_canvas(
                cond[keep], meta["world_to_clip"][keep], meta["world_to_view"][keep], z, g, params
            )
            acc["in_look_leave_out"].append(static_agreement(render_frames(c, meta, [k]), cond[k : k + 1]))
        fwd = clip_canvas(cond, meta, g, tl, params, frames=slice(0, n - tl.num_ext_frames))
        acc["in_look_forward"].append(
            static_agreement(
                render_frames(fwd, meta, range(n - tl.num_ext_frames, n)), cond[n - tl.num_ext_frames :]
            )
        )
        clip.update({k: {kk: round(vv, 4) for kk, vv in v[-1].items()} for k, v in acc.items() if v})
        per_clip.append(clip)
    return {
        "geometry": f"{g.dst_width}x{g.dst_height}",
        "params": params.__dict__,
        "num_ext_clips": len(per_clip),
        "num_look_change_clips": len(unknown_ext),
        "unknown_ext_look_change": {
            "mean": round(float(np.mean(unknown_ext)), 4) if unknown_ext else None,
            "min": round(float(np.min(unknown_ext)), 4) if unknown_ext else None,
            "max": round(float(np.max(unknown_ext)), 4) if unknown_ext else None,
            "spec": 0.17,
        },
        **{k: _merge(v) for k, v in acc.items() if v},
        "in_look_all_recall_by_class": {
            name: round(float(confusion[i, i] / max(confusion[i].sum(), 1)), 4)
            for i, name in enumerate(
                ("sky", "terrain", "paving", "architecture", "rock", "vegetation", "prop")
            )
        },
        "in_look_all_agreement_ground_classes": round(
            float(np.trace(confusion[1:3, 1:3]) / max(confusion[1:3].sum(), 1)), 4
        ),
        "spec_static_agreement": [0.97, 0.98],
        "seconds_per_clip": round(float(np.mean(seconds)), 3) if seconds else None,
        "per_clip": per_clip,
    }


def _true_depth(
    scene: Any, meta: dict[str, np.ndarray], f: int, g: GeometryConfig
) -> tuple[GridRays, np.ndarray]:
    """The destination rays of meta frame ``f`` and their true static ray depth f64 [H·W] (inf: sky)."""
    idx_y, idx_x = index_maps(g)
    m, v = meta["world_to_clip"][f], meta["world_to_view"][f]
    rays = GridRays.build(idx_x, idx_y, m, v, g.src_width, g.src_height)
    return rays, scene_static(scene, rays).t.reshape(-1)


def never_seen(cfg: Gc25dConfig, preset: str, params: CanvasParams, step: int) -> dict[str, Any]:
    """Per look-change row: the never-seen share of every ``step``-th extension frame (code-world truth,
    old look; sky and character pixels count as seen) and the canvas's unknown share there."""
    lay, shapes, g, tl = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), cfg.geometry, cfg.timeline
    h, w, n = g.dst_height, g.dst_width, tl.num_frames
    specs = {s.run: s for s in get_preset(preset).runs(0)}
    per_clip = []
    for row in read_index(lay):
        if not row.ext_look_change:
            continue
        spec = specs[row.run]
        scene = build_scene(spec.scene_seed, spec.look_at(row.start + n - 1).seed)
        meta, cond = read_meta(lay, row.clip_id, shapes, True), read_cond(lay, row.clip_id, shapes)

        depth_src = [_true_depth(scene, meta, f, g)[1] for f in range(n)]
        canvas = clip_canvas(cond, meta, g, tl, params)
        unseen, unknown = [], []
        for e in range(n, n + tl.num_ext_frames, step):
            rays, t = _true_depth(scene, meta, e, g)
            fin = np.flatnonzero(np.isfinite(t))
            pts = rays.origin.reshape(-1, 3)[fin] + t[fin, None] * rays.direction.reshape(-1, 3)[fin]
            seen = np.zeros(len(pts), bool)
            for f in range(n):
                cam = FrameCamera.of(
                    meta["world_to_clip"][f], meta["world_to_view"][f], 0.0, g.src_width, g.src_height
                )
                dx, dy, depth, _ = project_dst(cam, pts, g)
                with np.errstate(invalid="ignore"):
                    ix, iy = np.round(dx), np.round(dy)
                    ok = np.flatnonzero((depth > 0) & (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h))
                pix = (iy[ok] * w + ix[ok]).astype(np.int64)
                dist = np.linalg.norm(pts[ok] - cam.eye, axis=1)
                vis = (np.abs(depth_src[f][pix] - dist) <= 0.03 * dist + 5.0) & (cond[f].reshape(-1)[pix] < 7)
                seen[ok[vis]] = True
            blank = np.full((h, w), 255, np.uint8)
            chars = render_capsules(
                meta["capsules"][e], meta["world_to_clip"][e], meta["world_to_view"][e], blank, g
            )
            never = np.zeros(h * w, bool)
            never[fin[~seen]] = True
            unseen.append(float((never & (chars.reshape(-1) == 255)).mean()))
            unknown.append(float((render_frames(canvas, meta, [e]) == 255).mean()))
        per_clip.append(
            {
                "clip_id": row.clip_id,
                "never_seen": round(float(np.mean(unseen)), 4),
                "unknown": round(float(np.mean(unknown)), 4),
            }
        )
    return {
        "step": step,
        "never_seen_mean": round(float(np.mean([c["never_seen"] for c in per_clip])), 4)
        if per_clip
        else None,
        "unknown_mean": round(float(np.mean([c["unknown"] for c in per_clip])), 4) if per_clip else None,
        "per_clip": per_clip,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("/tmp/gc25d_canvas"))
    p.add_argument("--preset", choices=("tiny", "full"), default="tiny")
    p.add_argument("--radius-cm", type=float, default=CanvasParams.radius_cm)
    p.add_argument("--max-fallback", type=int, default=CanvasParams.max_fallback)
    p.add_argument("--no-per-clip", action="store_true")
    p.add_argument("--truth-step", type=int, default=0, help="never_seen_ext every N-th frame (0: off)")
    args = p.parse_args()
    root = args.root / args.preset
    t0 = time.perf_counter()
    cfg = prepare(root, args.preset)
    prep_s = time.perf_counter() - t0
    params = CanvasParams(radius_cm=args.radius_cm, max_fallback=args.max_fallback)
    out = measure(cfg, params)
    if args.truth_step > 0:
        out["never_seen_ext"] = never_seen(cfg, args.preset, params, args.truth_step)
    out = {"preset": args.preset, "root": str(root), "prepare_seconds": round(prep_s, 1), **out}
    if args.no_per_clip:
        out.pop("per_clip")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
