"""The ``tiny_vae`` asset's job: fit the tiny VAE (gc25d_core.models.vae_fit) on the train split's
frames, or keep the fit whose inputs are unchanged.

The frames are read here, in preprocessing, like every other step that turns the raw source into
training inputs; the fit itself (model, optimiser, file format) is the VAE's, under ``models/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import Gc25dConfig, TinyVaeFitConfig, TinyVaeWarmPhaseConfig
from gc25d_core.faults import maybe_inject_fault
from gc25d_core.hashing import sha256_file
from gc25d_core.index import read_index
from gc25d_core.layout import Layout
from gc25d_core.models.vae_fit import (
    first_phase_files,
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
from gc25d_core.numerics import numerics_record
from gc25d_core.preprocess.clips import build_cond
from gc25d_core.preprocess.latents import load_clip_frames
from gc25d_core.preprocess.tasks import RunCache
from gc25d_core.raw_layout import RunDir
from gc25d_core.report import Reporter
from gc25d_core.vocab import collapse_parts


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
    classes = [loss_classes(runs(r), r.start, cfg) for r in train] if fit.class_weight else None
    key = inputs_key(cfg, [r.clip_id for r in train], train_frames, classes)
    path, rec = fit_file(cfg), read_record(cfg)
    if _up_to_date(rec, path, key):
        rep.log(f"tiny VAE {path} is up to date (same inputs, sha256 {rec['sha256'][:12]}…): kept")
        return {**rec, "used": True, "skipped": True}

    torch.set_num_threads(fit.threads)  # fixed: the reduction order (and so the weights) stays the same
    crops = f", {fit.crop}² crops" if fit.crop else ""
    crops += f", the loss weighted by class (p^-{fit.class_weight:g})" if fit.class_weight else ""
    phase2 = f"; then {_phase_text(fit.then)}" if fit.then else ""
    rep.log(f"fitting the tiny VAE on {len(train)} train clips: {_phase_text(fit)}{crops}{phase2}")
    common: dict[str, Any] = dict(
        seed=fit.seed, crop=fit.crop, norm_frames=fit.norm_frames, device=fit.device, dim=fit.dim,
        dec_dim=fit.dec_dim, compile=fit.compile, fast_ops=fit.fast_ops, bf16=fit.bf16,
        state_every_s=fit.state_every_s, note=lambda text: rep.log(f"tiny VAE: {text}"),
        classes=classes, class_weight=fit.class_weight,
    )  # fmt: skip
    t_fit = time.perf_counter()
    first: dict[str, Any] | None = None
    if fit.then is None:
        vae, summary = fit_tiny_vae(
            train_frames, steps=fit.steps, batch=fit.batch, frames=fit.frames, lr=fit.lr, warm=fit.warm,
            log=_progress(rep, fit.steps), state=state_file(cfg), **common,
        )  # fmt: skip
    else:
        init, first = _first_phase(cfg, rep, [r.clip_id for r in train], train_frames, common)
        then = fit.then
        vae, summary = fit_tiny_vae(
            train_frames, steps=then.steps, batch=then.batch, frames=then.frames, lr=then.lr, warm=then.warm,
            init=init, log=_progress(rep, then.steps, offset=fit.steps, name="tiny VAE, warm phase,"),
            state=state_file(cfg), **common,
        )  # fmt: skip
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
        "steps": fit.steps if fit.then is None else fit.steps + fit.then.steps,
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
        # the box and kernel paths the weights came from: the same inputs fit to other bits elsewhere
        "numerics": numerics_record(fit.device),
        **({} if first is None else {"first_phase": first}),  # resumed_from above: the warm phase's
    }
    atomic_write_text(record_file(cfg), json.dumps(rec, indent=1))
    rep.log(f"tiny VAE written to {path} (sha256 {digest[:12]}…), held-out recon MSE {held_mse:.4f}")
    return {**rec, "used": True, "skipped": False}


def loss_classes(run: RunDir, start: int, cfg: Gc25dConfig) -> np.ndarray:
    """A clip's pixel ids as the class-weighted fit weighs them (``vae.fit.class_weight``): the
    cond canvases' ids with the player's and the boss's parts collapsed (uint8 [F, H, W])."""
    return collapse_parts(build_cond(run, start, cfg))


def _up_to_date(rec: dict[str, Any] | None, weights: Path, key: str) -> TypeGuard[dict[str, Any]]:
    """A fit's file stands: its record has these inputs and the file has the record's SHA256."""
    return (
        rec is not None
        and rec["inputs_key"] == key
        and weights.is_file()
        and sha256_file(weights) == rec["sha256"]
    )


def _phase_text(p: TinyVaeFitConfig | TinyVaeWarmPhaseConfig) -> str:
    warm = f", the first {p.warm} latent frames warm (no gradient)" if p.warm else ""
    return f"{p.steps} steps × {p.batch} windows of {p.frames} frames{warm}"


def _progress(
    rep: Reporter, steps: int, *, offset: int = 0, name: str = "tiny VAE"
) -> Callable[[int, float], None]:
    """The fit's ``log``: the loss as a metric and a line every tenth of ``steps`` with the rate and
    the ETA. ``offset``: the steps before this phase, so metrics and injected faults count the fit's
    steps across its phases."""
    t0, every = time.perf_counter(), max(steps // 10, 1)
    first: list[int] = []  # the first step this run fits (after a resume: the state's next)

    def log(step: int, loss: float) -> None:
        maybe_inject_fault(offset + step)  # tests: a fit killed part way (GC25D_FAULT; inert otherwise)
        rep.metrics(offset + step, vae_fit_loss=loss)
        first[:] = first or [step]
        if step % every == 0 or step == steps:
            rate = (step - first[0] + 1) / (time.perf_counter() - t0)
            eta = (steps - step) / rate if rate > 0 else float("nan")
            rep.log(f"{name} step {step}/{steps}: loss {loss:.4f} ({rate:.2f} steps/s, ETA {eta:.0f}s)")

    return log


def _first_phase(
    cfg: Gc25dConfig, rep: Reporter, clip_ids: list[str], clips: list[np.ndarray], common: dict[str, Any]
) -> tuple[tuple[Path, str], dict[str, Any]]:
    """The first phase of a fit with ``vae.fit.then``: the fit its settings give without ``then``,
    kept beside the final weights under its own record (its inputs key is the key of that fit alone),
    so a rerun with the same inputs goes straight to the warm phase. Returns ((weights, SHA256), its
    record)."""
    fit = cfg.vae.fit
    weights, state, record = first_phase_files(cfg)
    alone = cfg.model_copy(
        update={"vae": cfg.vae.model_copy(update={"fit": fit.model_copy(update={"then": None})})}
    )
    key = inputs_key(alone, clip_ids, clips, common["classes"])
    rec = read_record(cfg, record)
    if _up_to_date(rec, weights, key):
        rep.log(f"tiny VAE, first phase: {weights} is up to date (sha256 {rec['sha256'][:12]}…): kept")
        return (weights, rec["sha256"]), {**rec, "kept": True}
    vae, summary = fit_tiny_vae(
        clips, steps=fit.steps, batch=fit.batch, frames=fit.frames, lr=fit.lr, warm=fit.warm,
        log=_progress(rep, fit.steps, name="tiny VAE, first phase,"), state=state, **common,
    )  # fmt: skip
    digest = save_tiny_vae(vae, weights)
    rec = {
        "path": weights.name,
        "sha256": digest,
        "inputs_key": key,
        "steps": fit.steps,
        "resumed_from": summary["resumed_from"],
        "loss_first": summary["loss_first"],
        "loss_last": summary["loss_last"],
    }
    atomic_write_text(record, json.dumps(rec, indent=1))
    rep.log(f"tiny VAE, first phase, written to {weights} (sha256 {digest[:12]}…)")
    return (weights, digest), {**rec, "kept": False}
