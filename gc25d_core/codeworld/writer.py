"""Write a code-world preset in exactly the raw layout of raw_layout.py.

Every file is written atomically (temp + rename; frame files are made durable by one ``os.sync()``
per run, the run's own files are fsynced). A run is finished when its run.json exists; it is written
last, so a killed generation resumes by regenerating only unfinished runs (deterministically,
the same bytes). index/clips_81.json lists every clip of every preset run. ``codeworld.json`` at the
root records preset, seed and geometry; generating into a root made with other settings is refused.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from gc25d_core.atomic import TMP_PREFIX, atomic_write_bytes, atomic_write_text
from gc25d_core.codeworld.camera import camera_matrices
from gc25d_core.codeworld.presets import get_preset, stable_seed
from gc25d_core.codeworld.render import render_frame
from gc25d_core.codeworld.scene import StaticScene, build_scene
from gc25d_core.codeworld.sim import FPS, FrameState, LookSpan, RunSpec, simulate
from gc25d_core.config import GeometryConfig, TimelineConfig
from gc25d_core.raw_layout import ClipEntry, ClipsIndexFile, FrameJson, FrameRecord, RunInfo
from gc25d_core.timeline import clip_starts

PROVENANCE = "codeworld.json"
GENERATOR_VERSION = 1
_TL = TimelineConfig()


def _f32(values: Any) -> list[float]:
    """Shortest decimal that round-trips each value through f32 (what meta stores)."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32).ravel()]


def _png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()


def _replace_without_fsync(path: Path, data: bytes) -> None:
    """Temp file + rename (never a torn file); durability comes from one os.sync() per run."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def frame_json(state: FrameState, width: int, height: int) -> FrameJson:
    """The validated frame.json of a frame state (capsules as the f32 values the renderer used)."""
    cam = camera_matrices(state.camera, width, height)
    caps = state.capsules.astype(np.float32)
    actors = ("player", "boss")
    return FrameJson.model_validate(
        {
            "frame": state.frame,
            "episode": state.episode,
            "camera_variant": state.camera_variant,
            "look_name": state.look.name,
            "world_to_clip": [float(v) for v in cam.world_to_clip.ravel()],
            "world_to_view": [float(v) for v in cam.world_to_view.ravel()],
            "projection": [float(v) for v in cam.projection.ravel()],
            "orthographic": cam.orthographic,
            "fov_x_deg": cam.fov_x_deg,
            "ortho_width_cm": cam.ortho_width_cm,
            "frame_offset_cm": _f32(state.frame_offset),
            "capsules": {name: [_f32(c) for c in caps[a]] for a, name in enumerate(actors)},
            "actor_pos": {name: _f32(state.actor_pos[a]) for a, name in enumerate(actors)},
            "player_state": state.player_state,
            "boss_state": state.boss_state,
        }
    )


def frame_record(state: FrameState, framed: bool) -> FrameRecord:
    return FrameRecord(
        frame=state.frame,
        episode=state.episode,
        camera_variant=state.camera_variant,
        look_name=state.look.name,
        orthographic=state.camera.variant.orthographic,
        centered=not framed,
        dead=state.dead,
        event=state.event,
    )


def run_dir(root: Path, spec: RunSpec) -> Path:
    return root / spec.subset / spec.scene / spec.run


def scene_cache(spec: RunSpec) -> Callable[[LookSpan], StaticScene]:
    """LookSpan → StaticScene of the run, built once per look."""
    cache: dict[int, StaticScene] = {}

    def scene_of(look: LookSpan) -> StaticScene:
        if look.seed not in cache:
            cache[look.seed] = build_scene(spec.scene_seed, look.seed)
        return cache[look.seed]

    return scene_of


def write_run(
    root: Path, spec: RunSpec, geometry: GeometryConfig, on_frame: Callable[[int], None] | None = None
) -> int:
    """Generate one run; returns the bytes written. run.json is written last."""
    out = run_dir(root, spec)
    width, height = geometry.src_width, geometry.src_height
    scene_of = scene_cache(spec)
    texture_seed = stable_seed(spec.scene_seed, "texture")
    actions, states = simulate(spec, scene_of)
    records: list[str] = []
    nbytes = 0
    for state in states:
        img = render_frame(scene_of(state.look), state, width, height, spec.style, texture_seed)
        fdir = out / "frames" / f"{state.frame:06d}"
        fdir.mkdir(parents=True, exist_ok=True)
        payloads = {
            "rgb.png": _png(np.ascontiguousarray(img.rgb[..., ::-1])),
            "ids.png": _png(img.ids),
            "frame.json": frame_json(state, width, height).model_dump_json().encode("utf-8"),
        }
        for name, data in payloads.items():
            _replace_without_fsync(fdir / name, data)
            nbytes += len(data)
        records.append(frame_record(state, spec.framed).model_dump_json())
        if on_frame:
            on_frame(1)
    os.sync()  # every frame file is durable before the run's own files (run.json last) are written
    nbytes += len(atomic_write_text(out / "frames.jsonl", "\n".join(records) + "\n").read_bytes())
    buf = io.BytesIO()
    np.save(buf, actions, allow_pickle=False)
    atomic_write_bytes(out / "actions_block_0.25s.npy", buf.getvalue())
    info = RunInfo.model_validate(
        {
            "subset": spec.subset,
            "scene": spec.scene,
            "run": spec.run,
            "num_frames": spec.num_frames,
            "fps": FPS,
            "width": width,
            "height": height,
            "framed": spec.framed,
        }
    )
    run_json = info.model_dump_json(indent=1)
    atomic_write_text(out / "run.json", run_json)
    return nbytes + len(buf.getvalue()) + len(run_json)


def clips_index(runs: list[RunSpec], tl: TimelineConfig = _TL) -> ClipsIndexFile:
    clips = [
        ClipEntry.model_validate(
            {"subset": s.subset, "scene": s.scene, "run": s.run, "start": start, "end": start + tl.num_frames}
        )
        for s in runs
        for start in clip_starts(s.num_frames, tl)
    ]
    return ClipsIndexFile(clips=clips)


def _check_provenance(root: Path, record: dict[str, Any]) -> None:
    path = root / PROVENANCE
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: unreadable ({e})") from None
        for key, value in record.items():
            if old.get(key) != value:
                raise ValueError(
                    f"{path}: field {key!r}={old.get(key)!r} differs from this generation ({value!r}); "
                    "use an empty root"
                )
    else:
        atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    return total


def _write_run_job(root: str, spec: RunSpec, geometry: GeometryConfig) -> tuple[str, int]:
    return spec.run, write_run(Path(root), spec, geometry)


def default_workers() -> int:
    """Worker processes for ``generate``: the CPUs this process may use, at most 2 (env GC25D_CODEWORLD_WORKERS)."""
    env = os.environ.get("GC25D_CODEWORLD_WORKERS")
    if env:
        return max(1, int(env))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(2, n))


def _run_all(root: Path, todo: list[RunSpec], geom: GeometryConfig, workers: int, reporter: Any) -> None:
    bar = (
        reporter.progress(total=sum(s.num_frames for s in todo), unit="frames") if reporter and todo else None
    )
    if workers <= 1 or len(todo) <= 1:
        for spec in todo:
            if reporter:
                reporter.log(
                    f"codeworld: generating {spec.subset}/{spec.scene}/{spec.run} ({spec.num_frames} frames)"
                )
            write_run(root, spec, geom, bar.update if bar else None)
        return
    frames = {s.run: s.num_frames for s in todo}
    ctx = multiprocessing.get_context("spawn")  # no fork: callers may hold threads (torch, dagster)
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx) as pool:
        jobs = [
            pool.submit(_write_run_job, str(root), s, geom) for s in sorted(todo, key=lambda s: -s.num_frames)
        ]
        for job in as_completed(jobs):
            run, _ = job.result()
            if reporter:
                reporter.log(f"codeworld: finished {run}")
            if bar:
                bar.update(frames[run])


def generate(
    root: Path,
    preset: str = "tiny",
    seed: int = 0,
    geometry: GeometryConfig | None = None,
    reporter: Any = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Generate (or finish) the code-world dataset ``preset`` under ``root`` in the raw layout.

    Idempotent: runs whose run.json exists are skipped. ``geometry`` defaults to the preset's source
    size (tiny 200×96, full 1280×704). ``reporter`` (report.Reporter) gets logs and frame progress.
    Runs are generated by ``workers`` processes (default ``default_workers()``); output bytes do not
    depend on it. Returns {runs, clips, frames, bytes, seconds, generated_runs, skipped_runs, root,
    preset, seed}.
    """
    t0 = time.monotonic()
    root = Path(root)
    p = get_preset(preset)
    geom = geometry or p.geometry
    runs = p.runs(seed)
    root.mkdir(parents=True, exist_ok=True)
    _check_provenance(
        root, {"preset": preset, "seed": seed, "geometry": geom.model_dump(), "version": GENERATOR_VERSION}
    )
    todo = [s for s in runs if not (run_dir(root, s) / "run.json").is_file()]
    _run_all(root, todo, geom, default_workers() if workers is None else workers, reporter)
    index = clips_index(runs)
    atomic_write_text(root / "index" / "clips_81.json", index.model_dump_json(indent=1))
    return {
        "runs": len(runs),
        "clips": len(index.clips),
        "frames": sum(s.num_frames for s in runs),
        "bytes": _tree_bytes(root),
        "seconds": round(time.monotonic() - t0, 3),
        "generated_runs": [s.run for s in todo],
        "skipped_runs": [s.run for s in runs if s not in todo],
        "root": str(root),
        "preset": preset,
        "seed": seed,
    }
