"""Distil the fast decoder from the configured VAE on the processed latents (the ``fast_decoder`` asset;
gc25d_core.models.fast_decoder).

torchrun --nproc_per_node=1 -m gc25d_core.jobs.fast_decoder --config run.yaml --run-dir DIR

One process: the fit is small and sequential, and its weights must not depend on a world size. The
latents are the ones the training cache packs (``latents/<clip_id>.pt``, the same bytes); the targets
are the VAE's decode of them and, as the second reference, the raw frames they were encoded from.
The held-out clips are the val split's. A rerun with the same inputs (settings, clips, latents,
frames, VAE) keeps the file it wrote; a killed fit resumes from its checkpoint to the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import global_rank
from gc25d_core.index import ClipRow
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter

FramesOf = Callable[[ClipRow], np.ndarray]


def raw_frames(cfg: Gc25dConfig) -> FramesOf:
    """A clip's raw frames, cropped and resized as its latents were made (uint8 [81, H, W, 3])."""
    from gc25d_core.preprocess.latents import load_clip_frames
    from gc25d_core.preprocess.tasks import RunCache

    runs = RunCache(Path(cfg.raw.root))
    return lambda row: load_clip_frames(runs(row), row.start, cfg)


def _device(cfg: Gc25dConfig) -> str:
    want = cfg.fast_decoder.device or cfg.device
    return "cuda" if want == "cuda" and torch.cuda.is_available() else "cpu"


def inputs_key(
    cfg: Gc25dConfig, rows: Sequence[ClipRow], latent_sha: Sequence[str], frames: Sequence[np.ndarray]
) -> str:
    """SHA256 of what the fit depends on: its settings, the VAE it distils, the clips, their latents'
    bytes and their frames' bytes. Where the file goes (and when it checkpoints) is not an input."""
    from gc25d_core.models.fast_decoder import FORMAT, VERSION
    from gc25d_core.models.vae_fit import resolve_vae_file

    found = resolve_vae_file(cfg)
    vae = found[1] if found is not None else f"tiny-random-seed-{cfg.seed}"
    settings = cfg.fast_decoder.model_dump(exclude={"file", "enabled", "ckpt_every", "device"})
    head = {
        "format": FORMAT,
        "version": VERSION,
        "fit": settings,
        "device": _device(cfg),
        "vae": vae,
        "clips": [r.clip_id for r in rows],
        "latents": list(latent_sha),
    }
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    for f in frames:
        h.update(np.ascontiguousarray(f).tobytes())
    return h.hexdigest()


def run_fast_decoder(cfg: Gc25dConfig, rep: Reporter, frames_of: FramesOf | None = None) -> dict[str, Any]:
    """Fit (or keep) the fast decoder of ``cfg.fast_decoder``; returns the record (the metadata)."""
    from gc25d_core.atomic import atomic_write_text
    from gc25d_core.hashing import sha256_file
    from gc25d_core.index import read_index
    from gc25d_core.layout import Layout, Shapes, read_latents
    from gc25d_core.models.fast_decoder import (
        DEFAULT_GAP_DB,
        FitClip,
        cell_seconds,
        fit_fast_decoder,
        heldout_psnr,
        read_record,
        record_file,
        save_fast_decoder,
        to_uint8,
        weights_file,
    )
    from gc25d_core.models.vae import build_vae_for, decode_video

    fd = cfg.fast_decoder
    if not fd.enabled:
        rep.log("fast decoder skipped: fast_decoder.enabled is off")
        return {"used": False, "reason": "fast_decoder.enabled is off"}
    t0 = time.perf_counter()
    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)
    train = [r for r in rows if r.split == "train"][: fd.max_clips]
    held = [r for r in rows if r.split != "train"][: fd.heldout_clips]
    if not train:
        raise ValueError(f"{cfg.paths.data_root}: the index has no train clips to fit the fast decoder on")
    frames_of = frames_of or raw_frames(cfg)
    used = train + held
    latent_files = [layout.latents(r.clip_id) for r in used]
    cells = min(fd.cells_per_clip, shapes.latent[1])
    # shape-checked, the file named; the first cells only, and the frames they decode to
    latents = [read_latents(p, shapes)["latent"][:, :cells].float() for p in latent_files]
    gt = [np.ascontiguousarray(frames_of(r)[: 1 + 4 * (cells - 1)]) for r in used]
    key = inputs_key(cfg, used, [sha256_file(p) for p in latent_files], gt)
    path, rec = weights_file(cfg), read_record(cfg)
    if rec is not None and rec["inputs_key"] == key and path.is_file() and sha256_file(path) == rec["sha256"]:
        rep.log(f"fast decoder {path} is up to date (same inputs, sha256 {rec['sha256'][:12]}…): kept")
        return {**rec, "used": True, "skipped": True}

    device = _device(cfg)
    torch.set_num_threads(fd.threads)  # fixed: the reduction order (and so the weights) stays the same
    vae = build_vae_for(cfg, torch.device(device))
    clips = [
        FitClip(r.clip_id, z, to_uint8(decode_video(vae, z)[0].cpu()), f)
        for r, z, f in zip(used, latents, gt, strict=True)
    ]
    del vae
    rep.log(
        f"fitting the fast decoder on {len(train)} train clips ({device}): {fd.steps} steps × {fd.batch} cells, "
        f"width {fd.width}; held out: {len(held)} val clips"
    )
    t_fit, every = time.perf_counter(), max(fd.steps // 10, 1)

    def log(step: int, loss: float) -> None:
        rep.metrics(step, fast_decoder_loss=loss)
        if step % every == 0 or step == fd.steps:
            rep.log(f"fast decoder step {step}/{fd.steps}: loss {loss:.4f}")

    settings = fd.model_dump(include={"steps", "batch", "lr", "width", "gt_weight", "seed", "ckpt_every"})
    checkpoint = path.with_suffix(".ckpt.pt")
    dec, summary = fit_fast_decoder(
        clips[: len(train)], device=device, checkpoint=checkpoint, key=key, log=log, **settings
    )
    fit_s = time.perf_counter() - t_fit
    metrics = heldout_psnr(dec, clips[len(train) :])
    digest = save_fast_decoder(dec, path)
    rec = {
        "sha256": digest,
        "inputs_key": key,
        "path": path.name,  # the file beside this record, by name: the data root can move
        **summary,
        "train_clips": len(train),
        "heldout_clips": len(held),
        # the held-out (val) clips decoded cell by cell, uint8 frames, dB
        **metrics,
        "within_1p5db_of_vae": bool(metrics["gap_db"] <= DEFAULT_GAP_DB),
        # one steady-state cell where it trained (full-dims GPU speed: bench.speed.fast_decoder)
        "cell_ms": 1e3 * cell_seconds(dec, cfg.geometry.latent_hw, device=device, cells=5, warmup=1),
        "cell_device": device,
        "latent_hw": list(cfg.geometry.latent_hw),
        "fit_seconds": fit_s,
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_text(record_file(cfg), json.dumps(rec, indent=1))
    rep.log(
        f"fast decoder written to {path} (sha256 {digest[:12]}…): held-out PSNR {metrics['psnr_vs_vae_db']:.2f} dB "
        f"vs the VAE decoder, {metrics['psnr_vs_gt_db']:.2f} dB vs the frames (the VAE's: "
        f"{metrics['vae_psnr_vs_gt_db']:.2f} dB), {rec['cell_ms']:.1f} ms per cell ({device})"
    )
    return {**rec, "used": True, "skipped": False}


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    if global_rank() != 0:  # launched on more ranks by hand: the others have nothing to do
        return
    rec = run_fast_decoder(cfg, rep)
    rep.materialize(rec, data_version=rec.get("sha256"))


if __name__ == "__main__":
    run_job(base_parser(__doc__.splitlines()[0]), main)
