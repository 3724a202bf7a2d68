"""Make the raw dataset available: generate it with the code world, or validate a real v10 snapshot."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gc25d_core.config import Gc25dConfig
from gc25d_core.raw_frames import read_frame_json
from gc25d_core.raw_layout import RawLayoutError, RawSource


def validate_raw(cfg: Gc25dConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Check the index, every run's run.json / frames.jsonl / actions, and every frame's frame.json
    (finite, non-degenerate cameras that agree with frames.jsonl).

    frame.json is what meta/*.npz is built from, so a bad camera must stop the pipeline here; it costs
    about 25 µs a frame (≈ 30 s for v10's 1.2 M). Per-frame images are read later by the preprocessing
    jobs, which validate them as they go.
    """
    t0 = time.monotonic()
    raw = RawSource(Path(cfg.raw.root))
    clips = raw.clips
    runs = raw.runs()
    num_frames = 0
    for i, run in enumerate(runs, start=1):
        info = run.info
        if (info.width, info.height) != (cfg.geometry.src_width, cfg.geometry.src_height):
            raise RawLayoutError(
                f"{run.path / 'run.json'}: fields width/height={info.width}x{info.height}, "
                f"geometry expects {cfg.geometry.src_width}x{cfg.geometry.src_height}"
            )
        frames = run.frames
        need_blocks = (len(frames) + cfg.timeline.frames_per_cell - 1) // cfg.timeline.frames_per_cell
        if len(run.actions_block) < need_blocks - 1:
            raise RawLayoutError(
                f"{run.path / 'actions_block_0.25s.npy'}: {len(run.actions_block)} blocks for {len(frames)} frames"
            )
        frame_root = run.path / "frames"
        present = set(os.listdir(frame_root)) if frame_root.is_dir() else set()
        missing = [f for f in range(len(frames)) if f"{f:06d}" not in present]
        if missing:
            raise RawLayoutError(
                f"{frame_root}: {len(missing)} frame folders missing (first: {missing[0]:06d})"
            )
        for f in range(len(frames)):
            read_frame_json(run, f)
        num_frames += len(frames)
        if i % 50 == 0:
            log(f"validated {i}/{len(runs)} runs")
    return {
        "kind": "v10",
        "num_runs": len(runs),
        "num_clips": len(clips),
        "num_frames": num_frames,
        "seconds": round(time.monotonic() - t0, 2),
    }


def prepare_raw(
    cfg: Gc25dConfig,
    log: Callable[[str], None] = print,
    workers: int | None = None,
    reporter: Any = None,
) -> dict[str, Any]:
    """The raw source: the code world generated (or finished) under ``raw.root`` by ``workers``
    processes (default: the code world's own, at most 2), then validated; a recorded source is
    validated only. ``reporter`` (``report.Reporter``'s log and progress) gets the generation's
    lines and its frames' rate and ETA (minutes at the larger presets' sizes)."""
    if cfg.raw.kind == "codeworld":
        from gc25d_core.codeworld import generate

        made = generate(
            Path(cfg.raw.root),
            preset=cfg.raw.codeworld_preset,
            seed=cfg.raw.seed,
            geometry=cfg.geometry,
            reporter=reporter,
            workers=workers,
        )
        validated = validate_raw(cfg, log)
        log(
            f"raw source: code world {made['preset']} (seed {made['seed']}), {made['runs']} runs "
            f"({len(made['generated_runs'])} generated in {made['seconds']:.1f} s, "
            f"{len(made['skipped_runs'])} already there), {made['frames']} frames, {made['clips']} clips"
        )
        # one key per fact: the validated counts, what this call generated, the data's size
        return {
            "kind": "codeworld",
            "preset": made["preset"],
            "seed": made["seed"],
            **{k: validated[k] for k in ("num_runs", "num_clips", "num_frames")},
            "num_bytes": made["bytes"],
            "generated_runs": made["generated_runs"],
            "num_skipped_runs": len(made["skipped_runs"]),
            "seconds": made["seconds"],
        }
    return validate_raw(cfg, log)
