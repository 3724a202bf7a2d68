"""Model inputs of a training step: TI2V noising with the clean cell 0, and the GcDiT keyword arguments.

x_t = (1 − σ)·x0 + σ·ε with cell 0 overwritten by the clean x0 (the model gets t = 0 on cell 0
through ``GcDiT.cell_timesteps``); the velocity target is ε − x0; losses skip cell 0.
"""

from __future__ import annotations

from typing import Any

import torch

from gc25d_core.flow import FlowSchedule
from gc25d_core.text import TextBank


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A non-blocking copy from pinned host memory. A blocking ``.to(device)`` makes the host wait
    until the GPU has finished everything queued before it, so the host would prepare every
    micro-batch with the GPU idle."""
    if device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


def draw_noise(shape: torch.Size, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Standard normal noise from ``gen``. On the GPU it is drawn there from a seed of ``gen``:
    DeepSpeed synchronises the device at the end of every micro-step's backward, so a host draw
    (~8 ms for 1.6M values) would leave it idle."""
    if device.type == "cuda":
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        cuda_gen = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(shape, generator=cuda_gen, device=device, dtype=torch.float32)
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def ti2v_inputs(
    schedule: FlowSchedule, latent_BCTHW: torch.Tensor, t: float, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x0, x_t (cell 0 clean), velocity target; float32 on the device."""
    x0 = to_device(latent_BCTHW, device).float()
    noise = draw_noise(x0.shape, gen, device)
    x_t = schedule.add_noise(x0, noise, t)
    x_t[:, :, 0] = x0[:, :, 0]
    return x0, x_t, schedule.velocity_target(x0, noise)


def model_kwargs(
    text: TextBank,
    x_t: torch.Tensor,
    t: float | torch.Tensor,
    keys: list[list[str]],
    ids: torch.Tensor,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, Any]:
    """GcDiT's forward arguments: latents in the model's dtype, the timestep (one per clip, or a
    tensor per cell [B, N]), the per-cell text bank."""
    bank, index = text.context(keys)
    if isinstance(t, torch.Tensor):
        timestep = to_device(t.float(), device)
    else:
        timestep = torch.full((x_t.shape[0],), t, dtype=torch.float32, device=device)
    return dict(
        latents=x_t.to(dtype),
        timestep=timestep,
        context=bank,
        sem_ids=to_device(ids, device),
        context_index=index,
    )


def cell_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE over cells 1.. (cell 0 is the clean anchor)."""
    return (pred.float()[:, :, 1:] - target[:, :, 1:]).pow(2).mean()
