"""Fitting the tiny VAE to frames: the reconstruction improves, the latents come out normalised, and
the saved file loads only with its digest (also through the latents job's builder)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.config import load_config
from gc25d_core.models.loading import WeightsError
from gc25d_core.models.vae import encode_frames
from gc25d_core.models.vae_fit import fit_tiny_vae, load_tiny_vae, save_tiny_vae


def _clips(n: int = 2, frames: int = 9) -> list[np.ndarray]:
    """Colour fields with a moving square: [frames, 32, 64, 3] uint8."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        base = rng.integers(0, 256, 3)
        clip = np.broadcast_to(base, (frames, 32, 64, 3)).astype(np.uint8).copy()
        for k in range(frames):
            clip[k, 8:20, 4 + 4 * k : 16 + 4 * k] = 255 - base
        out.append(clip)
    return out


def test_fit_improves_reconstruction_and_normalises_latents(tmp_path):
    clips = _clips()
    losses: list[float] = []
    vae, summary = fit_tiny_vae(clips, steps=40, batch=2, seed=0, log=lambda s, v: losses.append(v))
    assert summary["steps"] == 40 and len(losses) == 40
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    z = torch.stack([encode_frames(vae, c) for c in clips])  # [2, 48, 3, 2, 4]
    assert z.shape == (2, 48, 3, 2, 4)
    torch.testing.assert_close(z.mean(dim=(0, 2, 3, 4)), torch.zeros(48), atol=1e-4, rtol=0)
    torch.testing.assert_close(z.std(dim=(0, 2, 3, 4)), torch.ones(48), atol=1e-3, rtol=0)

    path = tmp_path / "tiny_vae.safetensors"
    digest = save_tiny_vae(vae, path)
    again = load_tiny_vae(path, expected_sha256=digest)
    torch.testing.assert_close(encode_frames(again, clips[0]), encode_frames(vae, clips[0]), rtol=0, atol=0)
    with pytest.raises(WeightsError):
        load_tiny_vae(path, expected_sha256="0" * 64)

    from gc25d_core.preprocess.latents import build_vae_for

    cfg = load_config("tiny", {"vae": {"path": str(path), "sha256": digest}})
    built = build_vae_for(cfg, torch.device("cpu"))
    torch.testing.assert_close(encode_frames(built, clips[1]), encode_frames(vae, clips[1]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="sha256"):
        build_vae_for(load_config("tiny", {"vae": {"path": str(path)}}), torch.device("cpu"))


def test_fit_refuses_short_clips():
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        fit_tiny_vae(_clips(frames=5), frames=9, steps=1)
