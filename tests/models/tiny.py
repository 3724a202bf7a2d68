"""Tiny fp32 GcDiT helpers: dim 96, 2 heads (head_dim 48), latent cells of 4x6 (6 tokens)."""

from __future__ import annotations

import torch

from gc25d_core.models.configs import tiny_config
from gc25d_core.vocab import valid_raw_ids

LATENT_HW = (4, 6)
PIXEL_HW = (LATENT_HW[0] * 16, LATENT_HW[1] * 16)
TEXT_LEN = 16
TEXT_DIM = 64


def make_model(seed: int = 0, active_sem: bool = True, **overrides):
    """A deterministic tiny GcDiT in eval mode; ``active_sem`` gives the sem-cond last layer random
    weights (a fresh encoder is zero, which would hide sem-cond bugs in causal tests)."""
    from gc25d_core.models.gcdit import GcDiT

    torch.manual_seed(seed)
    model = GcDiT(tiny_config(**overrides)).eval()
    if active_sem:
        with torch.no_grad():
            torch.nn.init.normal_(model.gc_sem_cond.proj_out.weight, std=0.2)
            torch.nn.init.normal_(model.gc_sem_cond.proj_out.bias, std=0.2)
    return model


def random_ids(num_frames: int, seed: int = 0, batch: int = 1, vocab: str = "parts") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor(valid_raw_ids(vocab), dtype=torch.uint8)
    idx = torch.randint(0, len(values), (batch, num_frames, *PIXEL_HW), generator=g)
    return values[idx]


def frames_for(num_cells: int) -> int:
    return 1 + 4 * (num_cells - 1)


def make_inputs(num_cells: int, seed: int = 0, batch: int = 1, per_cell_text: bool = True):
    """latents [B,48,N,4,6], per-cell (or shared) text, raw ids [B, 1+4(N-1), 64, 96]."""
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, 48, num_cells, *LATENT_HW, generator=g)
    shape = (batch, num_cells, TEXT_LEN, TEXT_DIM) if per_cell_text else (batch, TEXT_LEN, TEXT_DIM)
    context = torch.randn(*shape, generator=g)
    return latents, context, random_ids(frames_for(num_cells), seed, batch)


def kv_cell_output(model, clean, noisy, t, context, ids, spec, i: int) -> torch.Tensor:
    """Cell ``i`` through the KV cache: cells 0..i-1 committed clean at t=0, then cell i noisy at
    t[0, i] (uncommitted); what teacher forcing must give for cell i."""
    from gc25d_core.models.gcdit import TextContext
    from gc25d_core.models.sem_cond import cell_frame_slice

    text = TextContext.build(context)
    cache = model.new_kv_cache(spec, LATENT_HW)
    for j in range(i):
        model.forward_kv(
            clean[:, :, j : j + 1],
            j,
            0.0,
            text.select(text.index[:, j : j + 1]),
            ids[:, cell_frame_slice(j)],
            cache,
            commit=True,
            return_output=False,
        )
    return model.forward_kv(
        noisy[:, :, i : i + 1],
        i,
        t[0, i],
        text.select(text.index[:, i : i + 1]),
        ids[:, cell_frame_slice(i)],
        cache,
        commit=False,
    )
