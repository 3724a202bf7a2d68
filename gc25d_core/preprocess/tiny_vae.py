"""The ``tiny_vae`` asset's job: fit the tiny VAE (gc25d_core.models.vae_fit) on the train split's
frames, or keep the fit whose inputs are unchanged.

The frames are read here, in preprocessing, like every other step that turns the raw source into
training inputs; the fit itself (model, optimiser, file format) is the VAE's, under ``models/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import Gc25dConfig
from gc25d_core.faults import maybe_inject_fault
from gc25d_core.hashing import sha256_file
from gc25d_core.index import read_index
from gc25d_core.layout import Layout
from gc25d_core.models.vae_fit import (
    fit_file,
    fit_tiny_vae,
    inputs_key,
    read_record,
    recon_mse,
    record_file,
    save_tiny_vae,
    state_file,
    uses_fitted_vae,
)
from gc25d_core.preprocess.latents import load_clip_frames
from gc25d_core.preprocess.tasks import RunCache
from gc25d_core.report import Reporter


def run_fit(cfg: Gc25dConfig, rep: Reporter) -> dict[str, Any]:
    """Fit (or keep) the tiny VAE of ``cfg.vae.fit`` on the train split; returns the metadata."""
    fit = cfg.vae.fit
    if not uses_fitted_vae(cfg):
        why = "vae.path is set" if cfg.vae.path is not None else "vae.tiny / vae.fit.enabled is off"
        rep.log(f"tiny VAE fit skipped: {why}")
        return {"used": False, "reason": why}
    rows = sorted(read_index(Layout(Path(cfg.paths.data_root))), key=lambda r: r.clip_id)
    runs = RunCache(Path(cfg.raw.root))
    train = [r for r in rows if r.split == "train"]
    held = [r for r in rows if r.split != "train"]
    if not train:
        raise ValueError(f"{cfg.paths.data_root}: the index has no train clips to fit the tiny VAE on")
    t0 = time.perf_counter()
    train_frames = [load_clip_frames(runs(r), r.start, cfg) for r in train]
    key = inputs_key(cfg, [r.clip_id for r in train], train_frames)
    path, rec = fit_file(cfg), read_record(cfg)
    if rec is not None and rec["inputs_key"] == key and path.is_file() and sha256_file(path) == rec["sha256"]:
        rep.log(f"tiny VAE {path} is up to date (same inputs, sha256 {rec['sha256'][:12]}…): kept")
        return {**rec, "used": True, "skipped": True}

    torch.set_num_threads(fit.threads)  # fixed: the reduction order (and so the weights) stays the same
    rep.log(
        f"fitting the tiny VAE on {len(train)} train clips: {fit.steps} steps × {fit.batch} windows of "
        f"{fit.frames} frames"
        + (f", {fit.crop}² crops" if fit.crop else "")
        + (f", the first {fit.warm} latent frames warm (no gradient)" if fit.warm else "")
    )
    t_fit, every = time.perf_counter(), max(fit.steps // 10, 1)
    first: list[int] = []  # the first step this run fits (after a resume: the state's next)

    def log(step: int, loss: float) -> None:
        maybe_inject_fault(step)  # tests: a fit killed part way (GC25D_FAULT; inert otherwise)
        rep.metrics(step, vae_fit_loss=loss)
        first[:] = first or [step]
        if step % every == 0 or step == fit.steps:
            rate = (step - first[0] + 1) / (time.perf_counter() - t_fit)
            eta = (fit.steps - step) / rate if rate > 0 else float("nan")
            rep.log(f"tiny VAE step {step}/{fit.steps}: loss {loss:.4f} ({rate:.2f} steps/s, ETA {eta:.0f}s)")

    vae, summary = fit_tiny_vae(
        train_frames,
        steps=fit.steps,
        batch=fit.batch,
        frames=fit.frames,
        lr=fit.lr,
        seed=fit.seed,
        crop=fit.crop,
        norm_frames=fit.norm_frames,
        log=log,
        device=fit.device,
        dim=fit.dim,
        dec_dim=fit.dec_dim,
        compile=fit.compile,
        fast_ops=fit.fast_ops,
        bf16=fit.bf16,
        warm=fit.warm,
        state=state_file(cfg),
        state_every_s=fit.state_every_s,
        note=lambda text: rep.log(f"tiny VAE: {text}"),
    )
    fit_s = time.perf_counter() - t_fit
    n = fit.eval_frames
    held_frames = [load_clip_frames(runs(r), r.start, cfg)[:n] for r in held]
    train_mse = recon_mse(vae, [c[:n] for c in train_frames[:2]])  # beside held-out: over- or underfit?
    held_mse = recon_mse(vae, held_frames) if held_frames else float("nan")
    digest = save_tiny_vae(vae, path)
    rec = {
        "path": path.name,  # the file beside this record, by name: the data root can move
        "sha256": digest,
        "inputs_key": key,
        "train_clips": len(train),
        "heldout_clips": len(held),
        "steps": fit.steps,
        "resumed_from": summary["resumed_from"],  # the step its state file held (0: fitted in one go)
        "loss_first": summary["loss_first"],
        "loss_last": summary["loss_last"],
        # the first eval_frames of every clip through encode + decode, pixels in [-1, 1]
        "recon_eval_frames": n,
        "recon_mse_train2": train_mse,
        "recon_mse_heldout": held_mse,
        "psnr_heldout_db": 10 * float(np.log10(4.0 / held_mse)) if held_frames else float("nan"),
        "fit_seconds": fit_s,
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_text(record_file(cfg), json.dumps(rec, indent=1))
    rep.log(f"tiny VAE written to {path} (sha256 {digest[:12]}…), held-out recon MSE {held_mse:.4f}")
    return {**rec, "used": True, "skipped": False}
