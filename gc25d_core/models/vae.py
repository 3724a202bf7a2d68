"""The Wan2.2 VAE (DiffSynth ``WanVideoVAE38``): build, verified load, fp32 encode (SPEC §5).

Latents are made with fp32 weights (PyTorch's default TF32 convolutions on GPU), non-tiled, from
RGB uint8 mapped to [-1, 1]; they are stored bf16 by the caller. ``TinyWanVideoVAE38`` is the same
class with a small random inner model (dim 16) and identity normalisation, for CPU tests: identical
encode/decode code, 16x spatial and 4x temporal compression, 48 channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()
from diffsynth.models.wan_video_vae import VideoVAE38_, WanVideoVAE38  # noqa: E402

VAE38_KEY_HASH = "e1de6c02cdac79f8b739f4d3698cd216"
Z_DIM = 48
SPATIAL_STRIDE = 16
TEMPORAL_STRIDE = 4


class TinyWanVideoVAE38(WanVideoVAE38):
    """``WanVideoVAE38`` with ``VideoVAE38_(dim, dec_dim)`` small and mean 0 / std 1 (random weights)."""

    def __init__(self, z_dim: int = Z_DIM, dim: int = 16, dec_dim: int = 16):
        torch.nn.Module.__init__(self)  # skip WanVideoVAE38.__init__: it builds the full-size model
        self.mean = torch.zeros(z_dim)
        self.std = torch.ones(z_dim)
        self.scale = [self.mean, 1.0 / self.std]
        self.model = VideoVAE38_(dim=dim, dec_dim=dec_dim, z_dim=z_dim).eval().requires_grad_(False)
        self.upsampling_factor = SPATIAL_STRIDE
        self.z_dim = z_dim


def build_vae(tiny: bool = False, device: Any = "cpu") -> WanVideoVAE38:
    """A randomly initialised VAE (``device='meta'`` for key checks of the full one)."""
    with torch.device(device):
        vae = TinyWanVideoVAE38() if tiny else WanVideoVAE38()
    return vae.eval()


def vae_key_hash(vae: WanVideoVAE38) -> str:
    """DiffSynth's key+shape hash of the checkpoint layout (inner keys without ``model.``)."""
    from diffsynth.core.loader.file import hash_state_dict_keys

    return hash_state_dict_keys(dict(vae.model.state_dict()))


def load_vae(
    path: Path | str, *, expected_sha256: str, device: Any = "cpu", expected_key_hash: str = VAE38_KEY_HASH
) -> WanVideoVAE38:
    """Wan2.2_VAE.pth (or .safetensors): sha256 check, registry key-hash check, fp32 weights."""
    from diffsynth.core.loader.file import hash_state_dict_keys, load_state_dict

    from gc25d_core.models.loading import WeightsError, verify_sha256

    path = Path(path)
    verify_sha256([path], {path.name: expected_sha256})
    sd: Mapping[str, torch.Tensor] = load_state_dict(str(path), torch_dtype=torch.float32)
    got = hash_state_dict_keys(dict(sd))
    if got != expected_key_hash:
        raise WeightsError(f"{path}: VAE key hash {got} != expected {expected_key_hash}")
    converted = WanVideoVAE38.state_dict_converter().from_civitai(dict(sd))
    with torch.device("meta"):
        vae = WanVideoVAE38()
    vae.load_state_dict(converted, strict=True, assign=True)
    return vae.to(device).eval().requires_grad_(False)


def frames_to_video(frames_THWC: np.ndarray | torch.Tensor) -> torch.Tensor:
    """RGB uint8 ``[T, H, W, 3]`` -> float32 ``[3, T, H, W]`` in [-1, 1]."""
    x = torch.as_tensor(np.asarray(frames_THWC)) if not isinstance(frames_THWC, torch.Tensor) else frames_THWC
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {x.dtype} {tuple(x.shape)}")
    return x.permute(3, 0, 1, 2).float().div(127.5).sub(1.0)


@torch.no_grad()
def encode_video(vae: WanVideoVAE38, video: torch.Tensor, device: Any = None) -> torch.Tensor:
    """fp32, non-tiled encode: ``[3, T, H, W]`` or ``[B, 3, T, H, W]`` in [-1, 1] ->
    float32 ``[B, 48, 1 + (T-1)/4, H/16, W/16]`` (T = 1 + 4k; H, W multiples of 16)."""
    if video.ndim == 4:
        video = video.unsqueeze(0)
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"video must be [B, 3, T, H, W], got {tuple(video.shape)}")
    t, h, w = video.shape[2:]
    if (t - 1) % TEMPORAL_STRIDE or h % SPATIAL_STRIDE or w % SPATIAL_STRIDE:
        raise ValueError(f"video T, H, W = {t}, {h}, {w}: need T = 1 + 4k and H, W multiples of 16")
    device = device or next(vae.parameters()).device
    with torch.autocast(device_type=torch.device(device).type, enabled=False):
        return vae.encode(video.float(), device=device, tiled=False).float()


def encode_frames(
    vae: WanVideoVAE38, frames_THWC: np.ndarray | torch.Tensor, device: Any = None
) -> torch.Tensor:
    """RGB uint8 ``[T, H, W, 3]`` -> float32 latent ``[48, T', H/16, W/16]``."""
    return encode_video(vae, frames_to_video(frames_THWC), device)[0]
