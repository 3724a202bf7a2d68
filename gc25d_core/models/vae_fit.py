"""Fit the tiny VAE to frames, so its latents keep the picture (as the real Wan2.2 VAE's do).

The tiny preset's ``TinyWanVideoVAE38`` is random: its latents are random features of the frames
(bench/tiny_vae_content.py: R^2 of about 0 from the pooled RGB), so nothing trained on them can
learn what the picture depends on. ``fit_tiny_vae`` trains the same class as an autoencoder on
code-world frames for a few hundred CPU steps (MSE of decode(encode(x)); Adam 5e-4), then
sets the per-channel normalisation from the latents of the frames it saw, like the real VAE's mean /
std constants. ``save_tiny_vae`` writes safetensors (weights + ``norm.mean`` / ``norm.std``) and
returns its SHA256; ``load_tiny_vae`` checks that digest before building the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.models.vae import TinyWanVideoVAE38, build_vae, frames_to_video

NORM_KEYS = ("norm.mean", "norm.std")


def _window(clips: Sequence[np.ndarray], frames: int, rng: np.random.Generator) -> torch.Tensor:
    clip = clips[int(rng.integers(len(clips)))]
    start = int(rng.integers(clip.shape[0] - frames + 1))
    return frames_to_video(clip[start : start + frames])  # [3, T, H, W] in [-1, 1]


def fit_tiny_vae(
    clips: Sequence[np.ndarray],
    *,
    steps: int = 300,
    batch: int = 2,
    frames: int = 9,
    lr: float = 5e-4,
    latent_l2: float = 0.0,
    seed: int = 0,
    log: Callable[[int, float], None] | None = None,
) -> tuple[TinyWanVideoVAE38, dict[str, Any]]:
    """``clips``: uint8 ``[F, H, W, 3]`` arrays (F >= frames; frames = 1 + 4k). Returns the fitted
    VAE (eval, no grad, normalisation set) and a summary (first / last loss, steps)."""
    if (frames - 1) % 4 or not clips or min(c.shape[0] for c in clips) < frames:
        raise ValueError(f"need clips of at least {frames} frames and frames = 1 + 4k")
    torch.manual_seed(seed)
    vae = build_vae(tiny=True)
    model = vae.model.train().requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    for step in range(steps):
        x = torch.stack([_window(clips, frames, rng) for _ in range(batch)])
        z = model.encode(x, vae.scale)
        recon = model.decode(z, vae.scale)
        loss = (recon - x).pow(2).mean() + latent_l2 * z.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log is not None:
            log(step + 1, losses[-1])
    model.eval().requires_grad_(False)
    with torch.no_grad():
        zs = torch.cat([model.encode(frames_to_video(c)[None], vae.scale) for c in clips])  # [N,48,T,h,w]
    mean = zs.mean(dim=(0, 2, 3, 4))
    std = zs.std(dim=(0, 2, 3, 4)).clamp_min(1e-6)
    set_norm(vae, mean, std)
    return vae, {
        "steps": steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


def set_norm(vae: TinyWanVideoVAE38, mean: torch.Tensor, std: torch.Tensor) -> None:
    """The latent normalisation (encode returns (mu - mean) / std), as WanVideoVAE38 keeps it."""
    vae.mean, vae.std = mean.float().clone(), std.float().clone()
    vae.scale = [vae.mean, 1.0 / vae.std]


def save_tiny_vae(vae: TinyWanVideoVAE38, path: Path | str) -> str:
    """Atomic safetensors write of the inner model + normalisation; returns the file's SHA256."""
    from safetensors.torch import save_file

    from gc25d_core.atomic import atomic_path
    from gc25d_core.hashing import sha256_file

    tensors = {k: v.contiguous() for k, v in vae.model.state_dict().items()}
    tensors[NORM_KEYS[0]], tensors[NORM_KEYS[1]] = vae.mean.contiguous(), vae.std.contiguous()
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "gc25d_tiny_vae38", "dim": "16"})
    return sha256_file(path)


def load_tiny_vae(path: Path | str, *, expected_sha256: str, device: Any = "cpu") -> TinyWanVideoVAE38:
    """A fitted tiny VAE, after its SHA256 matches (safetensors only: nothing unverified is parsed)."""
    from safetensors.torch import load_file

    from gc25d_core.models.loading import verify_sha256

    path = Path(path)
    verify_sha256([path], {path.name: expected_sha256})
    tensors = load_file(str(path))
    missing = [k for k in NORM_KEYS if k not in tensors]
    if missing:
        raise ValueError(f"{path}: not a fitted tiny VAE (missing {missing})")
    mean, std = tensors.pop(NORM_KEYS[0]), tensors.pop(NORM_KEYS[1])
    vae = build_vae(tiny=True)
    vae.model.load_state_dict(tensors, strict=True)
    set_norm(vae, mean, std)
    return vae.to(device).eval().requires_grad_(False)
