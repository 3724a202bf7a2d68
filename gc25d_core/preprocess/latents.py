"""SPEC §5 latents/<clip_id>.pt: Wan2.2 VAE (fp32 weights, default TF32 convolutions, non-tiled) over
resample_rgb frames in [−1, 1], stored bf16 [48,21,H/16,W/16] with prompts, actions and ids.

Throughput: frames are read and resampled by DataLoader workers while the GPU encodes the previous
batch, and ``vae.clips_per_batch`` clips are encoded together (the causal VAE runs many small
kernels per clip; a batch fills the GPU better). Files are written atomically after each batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.geometry import resample_rgb
from gc25d_core.index import ClipRow
from gc25d_core.layout import Layout, LayoutError, Shapes, read_latents, write_latents
from gc25d_core.models.vae import build_vae_for, decode_frames, encode_on_device, frames_to_video
from gc25d_core.raw_frames import read_rgb
from gc25d_core.raw_layout import RunDir
from gc25d_core.text import cell_prompts, text_data
from gc25d_core.timeline import blocks20, cell_blocks


def load_clip_frames(run: RunDir, start: int, cfg: Gc25dConfig) -> np.ndarray:
    """uint8 [81,H,W,3]: the clip's frames, cropped and INTER_AREA-resized."""
    n = cfg.timeline.num_frames
    out = np.empty((n, cfg.geometry.dst_height, cfg.geometry.dst_width, 3), np.uint8)
    for i in range(n):
        out[i] = resample_rgb(read_rgb(run, start + i), cfg.geometry)
    return out


def clip_record(row: ClipRow, run: RunDir, latent: torch.Tensor, cfg: Gc25dConfig) -> dict[str, Any]:
    b20 = blocks20(run.actions_block, row.start, cfg.timeline)
    return {
        "latent": latent.to(torch.bfloat16).contiguous(),
        "prompts": cell_prompts(b20, text_data(cfg.text)),
        "actions_block": torch.from_numpy(np.ascontiguousarray(cell_blocks(b20))),
        "clip_id": row.clip_id,
        "subset": row.subset,
        "scene": row.scene,
        "run": row.run,
        "start": row.start,
    }


def latents_done(layout: Layout, shapes: Shapes, row: ClipRow) -> bool:
    path = layout.latents(row.clip_id)
    if not path.is_file():
        return False
    try:
        read_latents(path, shapes)
        return True
    except LayoutError:
        return False


def vae_identity(cfg: Gc25dConfig) -> str:
    """What the latents were made with: the weights' SHA256, or the seed of the tiny random VAE."""
    from gc25d_core.models.vae_fit import resolve_vae_file

    found = resolve_vae_file(cfg)
    return f"sha256:{found[1].lower()}" if found is not None else f"tiny-random:seed{cfg.seed}"


def latents_vae_marker(cfg: Gc25dConfig) -> Path:
    return Path(cfg.paths.data_root) / "models" / "latents_vae.json"


def drop_latents_of_another_vae(cfg: Gc25dConfig, layout: Layout) -> int:
    """Rank 0: if the latents on disk were made by another VAE than the one ``cfg`` names now (the
    random tiny one before the fit, an older fit, other real weights), delete them, so the job
    re-encodes every clip rather than keep latents of two VAEs; then record the current VAE. A clip
    written after the record is always of the current VAE, so an interrupted run resumes. Returns
    how many files were deleted."""
    import json

    from gc25d_core.atomic import atomic_write_text

    marker, ident = latents_vae_marker(cfg), vae_identity(cfg)
    try:
        old = json.loads(marker.read_text()).get("vae") if marker.is_file() else None
    except ValueError:
        old = None
    if old == ident:
        return 0
    folder = layout.root / "latents"
    stale = sorted(folder.glob("*.pt")) if folder.is_dir() else []
    for p in stale:
        p.unlink()
    atomic_write_text(marker, json.dumps({"vae": ident, "previous": old}))
    return len(stale)


class ClipFrames(torch.utils.data.Dataset):
    """(index, frames uint8 [81,H,W,3]) per pending clip; runs inside DataLoader workers."""

    def __init__(self, rows: list[ClipRow], cfg: Gc25dConfig):
        from gc25d_core.preprocess.tasks import RunCache

        self.rows, self.cfg, self.runs = rows, cfg, RunCache(Path(cfg.raw.root))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | str]:
        row = self.rows[i]
        try:
            return i, torch.from_numpy(load_clip_frames(self.runs(row), row.start, self.cfg))
        except Exception as e:  # reported per clip by the caller
            return i, f"{type(e).__name__}: {e}"


def _collate(batch):
    return batch


def _clip_batches(loader, clips_per_batch: int, on_error) -> Iterator[list[tuple[int, torch.Tensor]]]:
    """Groups of up to ``clips_per_batch`` decoded clips; a clip whose decode failed goes to
    ``on_error(index, message)``."""
    group: list[tuple[int, torch.Tensor]] = []
    for items in loader:
        for i, frames in items:
            if isinstance(frames, torch.Tensor):
                group.append((i, frames))
            else:
                on_error(i, frames)
        if len(group) >= clips_per_batch:
            yield group
            group = []
    if group:
        yield group


def encode_batch(vae, frames: list[torch.Tensor], device: torch.device, cfg: Gc25dConfig) -> torch.Tensor:
    """uint8 [81,H,W,3] × B → float32 latents [B,48,21,h,w] (frames moved and normalised on device)."""
    video = torch.stack([frames_to_video(f.to(device, non_blocking=True)) for f in frames])  # [B,3,T,H,W]
    if cfg.vae.channels_last_3d and device.type == "cuda":
        video = video.contiguous(memory_format=torch.channels_last_3d)
    fp16 = cfg.vae.compute_dtype == "fp16" and device.type == "cuda"
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.float16, enabled=fp16):
        return encode_on_device(vae, video, device).float()


def _clock(device: torch.device) -> Any:
    """A point in time for encode timings: a recorded CUDA event (device time, no sync) on the
    GPU, ``perf_counter`` seconds on the CPU."""
    if device.type != "cuda":
        return time.perf_counter()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


class _Encoded:
    """One batch's latents on their way to the host: a non-blocking copy into pinned memory and an
    event, so the next batch's encode is queued before this one is written."""

    def __init__(self, rows: list[ClipRow], latents: torch.Tensor, device: torch.device):
        self.rows = rows
        self.event: torch.cuda.Event | None = None
        if device.type == "cuda":
            self.host = torch.empty(latents.shape, dtype=latents.dtype, pin_memory=True)
            self.host.copy_(latents, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = latents

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def run_latents(
    cfg: Gc25dConfig, rows: list[ClipRow], device: torch.device, on_clip, on_error
) -> dict[str, float]:
    """Encode ``rows`` (already this rank's pending clips). ``on_clip(row, nbytes)`` / ``on_error(row, msg)``.

    The GPU is kept busy: batch k+1's encode is queued before batch k's latents are written, and the
    DataLoader workers decode ahead. Returns ``encode_seconds`` (device time of the encodes, CUDA
    events; host time on CPU) and ``first_batch_seconds`` (until the first frames arrived: the
    pipeline's fill)."""
    from gc25d_core.preprocess.tasks import RunCache

    if not rows:  # everything already encoded: no VAE to build
        return {"encode_seconds": 0.0, "first_batch_seconds": 0.0}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = cfg.vae.allow_tf32_matmul
    layout, shapes, runs = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg), RunCache(Path(cfg.raw.root))
    vae = build_vae_for(cfg, device)
    # one clip per worker item (batches are formed here), so the first batch waits for one clip's
    # decode per worker, not clips_per_batch of them in one worker.
    # (cv2.setNumThreads(1) in a worker_init_fn hung the forked workers on the H200 host: left out)
    loader = torch.utils.data.DataLoader(
        ClipFrames(rows, cfg),
        batch_size=1,
        num_workers=cfg.vae.num_workers,
        collate_fn=_collate,
        pin_memory=device.type == "cuda",
        prefetch_factor=2 if cfg.vae.num_workers else None,
    )

    def write(done: _Encoded) -> None:
        for row, latent in zip(done.rows, done.wait(), strict=True):
            try:
                path = write_latents(layout, clip_record(row, runs(row), latent, cfg), shapes)
                on_clip(row, path.stat().st_size)
            except Exception as e:
                on_error(row, f"{type(e).__name__}: {e}")

    timings: list[tuple[Any, Any]] = []  # (start, end) per encode: see _clock
    t_start, first_batch = time.perf_counter(), None
    pending: _Encoded | None = None
    try:
        for good in _clip_batches(loader, cfg.vae.clips_per_batch, lambda i, msg: on_error(rows[i], msg)):
            if first_batch is None:
                first_batch = time.perf_counter() - t_start
            t0 = _clock(device)
            latents = encode_batch(vae, [f for _, f in good], device, cfg)
            timings.append((t0, _clock(device)))
            encoded = _Encoded([rows[i] for i, _ in good], latents, device)
            if pending is not None:
                write(pending)  # while the GPU encodes this batch
            pending = encoded
    finally:  # also when a later batch fails: the batch already encoded is not lost
        if pending is not None:
            write(pending)
    if device.type == "cuda":
        encode = sum(a.elapsed_time(b) for a, b in timings) / 1e3
    else:
        encode = float(sum(b - a for a, b in timings))
    return {"encode_seconds": encode, "first_batch_seconds": first_batch or 0.0}


def latents_preview(cfg: Gc25dConfig, out_dir: Path) -> dict[str, Any] | None:
    """The first clip's latents decoded by the VAE that made them, beside its colour-coded ids:
    ``out_dir/latents_preview.mp4`` and a 5-frame PNG of it. Only for tiny VAEs (a real Wan2.2
    decode belongs on the GPU, not in the orchestrator's process); None when there is nothing."""
    from gc25d_core.index import read_index
    from gc25d_core.layout import read_cond
    from gc25d_core.preview import colorize_ids, png_bytes, side_by_side, strip_of, write_video

    if not cfg.vae.tiny:
        return None
    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)
    done = [r for r in rows if layout.latents(r.clip_id).is_file() and layout.cond(r.clip_id).is_file()]
    if not done:
        return None
    row = done[0]
    vae = build_vae_for(cfg, torch.device("cpu"))
    decoded = decode_frames(vae, read_latents(layout.latents(row.clip_id), shapes)["latent"].float())
    panels = side_by_side(
        [decoded, colorize_ids(read_cond(layout, row.clip_id, shapes))], ["decoded latents", "ids"]
    )
    video = write_video(out_dir / "latents_preview.mp4", panels)
    return {"clip_id": row.clip_id, "video": video, "png": png_bytes(strip_of(panels)), "frames": len(panels)}
