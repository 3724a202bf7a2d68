"""WanVideoVAE38 wrapper: tiny random variant of the same class, fp32 encode, full key layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.models.vae import (
    VAE38_KEY_HASH,
    TinyWanVideoVAE38,
    build_vae,
    encode_frames,
    encode_video,
    frames_to_video,
    load_vae,
    vae_key_hash,
)


def test_tiny_vae_encodes_like_the_real_layout():
    from diffsynth.models.wan_video_vae import WanVideoVAE38

    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    assert isinstance(vae, WanVideoVAE38) and isinstance(vae, TinyWanVideoVAE38)
    frames = np.random.default_rng(0).integers(0, 256, (5, 64, 96, 3), dtype=np.uint8)
    z = encode_frames(vae, frames)
    assert z.shape == (48, 2, 4, 6) and z.dtype == torch.float32 and torch.isfinite(z).all()
    video = frames_to_video(frames)
    assert video.shape == (3, 5, 64, 96) and video.min() >= -1 and video.max() <= 1
    # the anchor frame alone encodes to the first latent cell (causal in time)
    z0 = encode_video(vae, video[:, :1])[0]
    torch.testing.assert_close(z0[:, 0], z[:, 0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="T = 1 \\+ 4k"):
        encode_video(vae, video[:, :4])
    with pytest.raises(ValueError, match="uint8"):
        frames_to_video(frames.astype(np.float32))


def test_full_vae_key_layout_matches_registry_hash():
    vae = build_vae(device="meta")
    assert vae_key_hash(vae) == VAE38_KEY_HASH


def test_load_vae_refuses_wrong_digest_and_layout(tmp_path):
    from gc25d_core.models.loading import WeightsError, sha256_file

    vae = build_vae(tiny=True)
    path = tmp_path / "Wan2.2_VAE.pth"
    torch.save(vae.model.state_dict(), path)
    with pytest.raises(WeightsError, match="sha256"):
        load_vae(path, expected_sha256="0" * 64)
    with pytest.raises(WeightsError, match="key hash"):
        load_vae(path, expected_sha256=sha256_file(path))
