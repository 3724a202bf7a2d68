"""Causal attention for GcDiT: the one visibility / eviction / RoPE-position rule (DESIGN.md §4.4)
and the full-sequence attention plans the model's blocks call.

Block = 1 latent cell. Every structure here derives from two functions:

* ``visible(q_cell, kv_cell, spec, q_noisy, kv_noisy)``: may a query token of cell ``q_cell`` see a
  key token of cell ``kv_cell``? Clean keys: ``kv_cell < q_cell`` (or the same cell for a clean
  query), and inside the sink (``kv_cell < sink``) or the window (``kv_cell > q_cell - window``).
  Noisy keys (teacher forcing): only from the same cell, only for noisy queries.
  The full-sequence mask (block-causal and teacher-forcing [clean | noisy]) is this rule expanded
  to tokens; the KV cache keeps exactly the cached cells the next query cell can see.
* ``rope_time_positions(kv_cells, q_cell, spec)``: the RoPE time index of each key cell for a query
  in ``q_cell``: absolute while ``q_cell <= rope_cap``; beyond, window cells shift down by
  ``q_cell - rope_cap`` (the query sits at ``rope_cap``) and sink cells keep 0..sink-1. Keys are
  cached un-rotated and rotated for the current query cell, so long rollouts never leave the
  trained position range.

Teacher forcing runs [clean | noisy] copies of the clip with identical RoPE positions; the noisy copy
of cell i sees the clean cells before it (sink/window applied) and itself. Its output equals a KV
rollout that committed the clean cells 0..i-1 at t=0 and then ran noisy cell i.

The KV cache that keeps what the rule lets the next cell see is ``models.kv_cache`` (its CUDA
graphs ``models.kv_graphs``); the per-cell sampler over it is ``models.sampler``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import rearrange

from gc25d_core.models.configs import CausalConfig

if TYPE_CHECKING:
    pass

# ------------------------------------------------------------------------------------------------
# the rule


def visible(
    q_cell: torch.Tensor | int,
    kv_cell: torch.Tensor | int,
    spec: CausalConfig,
    *,
    q_noisy: torch.Tensor | bool = False,
    kv_noisy: torch.Tensor | bool = False,
) -> torch.Tensor:
    """Bool (broadcast over the inputs): query of ``q_cell`` may attend key of ``kv_cell``."""
    q_cell, kv_cell = torch.as_tensor(q_cell), torch.as_tensor(kv_cell)
    q_noisy = torch.as_tensor(q_noisy, dtype=torch.bool)
    kv_noisy = torch.as_tensor(kv_noisy, dtype=torch.bool)
    same = kv_cell == q_cell
    clean_ok = (kv_cell < q_cell) | (same & ~q_noisy)
    if spec.window is not None:
        clean_ok = clean_ok & ((kv_cell < spec.sink) | (kv_cell > q_cell - spec.window))
    return (~kv_noisy & clean_ok) | (kv_noisy & q_noisy & same)


def rope_shift(q_cell: int, spec: CausalConfig) -> int:
    return 0 if spec.rope_cap is None else max(0, q_cell - spec.rope_cap)


def rope_time_positions(kv_cells: torch.Tensor, q_cell: int, spec: CausalConfig) -> torch.Tensor:
    """RoPE time index of each key cell for a query in ``q_cell`` (see module doc)."""
    shift = rope_shift(q_cell, spec)
    return torch.where(kv_cells < spec.sink, kv_cells, kv_cells - shift)


def query_time_position(q_cell: int, spec: CausalConfig) -> int:
    return q_cell - rope_shift(q_cell, spec)


def check_full_sequence(max_position: int, spec: CausalConfig) -> None:
    """A full-sequence forward uses the given (absolute) positions: valid only up to ``rope_cap``."""
    if spec.rope_cap is not None and max_position > spec.rope_cap:
        raise ValueError(
            f"a full-sequence causal forward uses positions up to rope_cap={spec.rope_cap}, got {max_position}; "
            "roll longer clips out with the KV cache (positions shift beyond the cap)"
        )


def cell_mask(
    q_cells: torch.Tensor,
    kv_cells: torch.Tensor,
    spec: CausalConfig,
    q_noisy: torch.Tensor | None = None,
    kv_noisy: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bool [Gq, Gk] over token groups (one group = one cell of one copy)."""
    qn = torch.zeros_like(q_cells, dtype=torch.bool) if q_noisy is None else q_noisy
    kn = torch.zeros_like(kv_cells, dtype=torch.bool) if kv_noisy is None else kv_noisy
    return visible(q_cells[:, None], kv_cells[None, :], spec, q_noisy=qn[:, None], kv_noisy=kn[None, :])


def sequence_groups(
    num_cells: int, teacher_forcing: bool, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cell, noisy) per token group: cells 0..N-1, or [clean 0..N-1 | noisy 0..N-1]."""
    cells = torch.arange(num_cells, device=device)
    if not teacher_forcing:
        return cells, torch.zeros(num_cells, dtype=torch.bool, device=device)
    noisy = torch.cat([torch.zeros(num_cells, dtype=torch.bool), torch.ones(num_cells, dtype=torch.bool)])
    return torch.cat([cells, cells]), noisy.to(device)


def group_mask(
    num_cells: int, spec: CausalConfig, teacher_forcing: bool = False, device: Any = None
) -> torch.Tensor:
    cells, noisy = sequence_groups(num_cells, teacher_forcing, device)
    return cell_mask(cells, cells, spec, noisy, noisy)


def full_sequence_mask(
    num_cells: int,
    tokens_per_cell: int,
    spec: CausalConfig,
    teacher_forcing: bool = False,
    device: Any = None,
) -> torch.Tensor:
    """Bool [L, L] token mask for SDPA (True = attend)."""
    g = group_mask(num_cells, spec, teacher_forcing, device)
    return g.repeat_interleave(tokens_per_cell, 0).repeat_interleave(tokens_per_cell, 1)


_FLEX: dict[str, Any] = {}


def flex_block_mask(group_mask_GG: torch.Tensor, tokens_per_group: int):
    """The same rule as a flex-attention BlockMask (GPU path; fully masked tiles are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    length = group_mask_GG.shape[0] * tokens_per_group
    device = group_mask_GG.device
    gm = group_mask_GG

    def mask_mod(b, h, q_idx, kv_idx):
        return gm[q_idx // tokens_per_group, kv_idx // tokens_per_group]

    return create_block_mask(mask_mod, None, None, length, length, device=str(device))


def _flex_attention(q, k, v, block_mask, kernel_options: dict[str, Any] | None = None):
    """Flex attention, compiled on CUDA; ``kernel_options``: torch's FlexKernelOptions (block sizes,
    TMA, the FlashAttention-4 backend), measured per shape in bench/speed/attention.py ``--mask tf``."""
    from torch.nn.attention.flex_attention import flex_attention

    key = q.device.type
    if key not in _FLEX:
        _FLEX[key] = torch.compile(flex_attention, dynamic=False) if key == "cuda" else flex_attention
    opts = dict(kernel_options) if kernel_options and key == "cuda" else None
    return _FLEX[key](q, k, v, block_mask=block_mask, kernel_options=opts)


# ------------------------------------------------------------------------------------------------
# RoPE (DiffSynth's 3-D frequencies, applied in real arithmetic)


class RopeTable:
    """cos/sin of a WanModel's ``freqs`` (time, h, w parts) on one device, in the compute dtype:
    float64 for fp32 activations (DiffSynth's precision: it rotates in complex128), float32 for
    bf16/fp16 activations."""

    def __init__(self, freqs: Sequence[torch.Tensor], device: torch.device, compute_dtype: torch.dtype):
        self.device, self.compute_dtype = device, compute_dtype
        self.cos = [f.real.to(device=device, dtype=compute_dtype) for f in freqs]
        self.sin = [f.imag.to(device=device, dtype=compute_dtype) for f in freqs]

    def token_freqs(self, time_pos: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token (cos, sin) [G*h*w, head_dim/2] for groups at time positions ``time_pos`` [G]."""
        g = int(time_pos.numel())
        tp = time_pos.to(self.device).long().repeat_interleave(h * w)
        hh = torch.arange(h, device=self.device).repeat_interleave(w).repeat(g)
        ww = torch.arange(w, device=self.device).repeat(g * h)
        idx = (tp, hh, ww)
        cos = torch.cat([c[i] for c, i in zip(self.cos, idx, strict=True)], dim=-1)
        sin = torch.cat([s[i] for s, i in zip(self.sin, idx, strict=True)], dim=-1)
        return cos, sin


def apply_rope(x_BLC: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rotate consecutive channel pairs of every head: (a + ib) * (cos + i sin)."""
    dtype = x_BLC.dtype
    xr = x_BLC.to(cos.dtype).unflatten(-1, (num_heads, -1, 2))
    a, b = xr[..., 0], xr[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([a * c - b * s, a * s + b * c], dim=-1)
    return out.flatten(2).to(dtype)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, mask: torch.Tensor | None = None):
    """[B, L, H*D] attention through PyTorch SDPA (the layout DiffSynth uses)."""
    q = rearrange(q, "b s (n d) -> b n s d", n=num_heads)
    k = rearrange(k, "b s (n d) -> b n s d", n=num_heads)
    v = rearrange(v, "b s (n d) -> b n s d", n=num_heads)
    x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return rearrange(x, "b n s d -> b s (n d)", n=num_heads)


# ------------------------------------------------------------------------------------------------
# attention plans: called by every block as plan(layer, q, k, v) with q, k normed, un-rotated


class FullSequenceAttention:
    """Bidirectional (no mask), block-causal or teacher-forcing attention over a whole sequence."""

    def __init__(
        self,
        cos: torch.Tensor,
        sin: torch.Tensor,
        num_heads: int,
        mask: torch.Tensor | None = None,
        block_mask: Any = None,
        dense: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
        flex_options: dict[str, Any] | None = None,
    ):
        """``dense(q, k, v, num_heads)``: the unmasked kernel (default: PyTorch SDPA);
        ``flex_options``: the flex kernel's options with a ``block_mask``."""
        self.cos, self.sin, self.num_heads = cos, sin, num_heads
        self.mask, self.block_mask = mask, block_mask
        self.dense, self.flex_options = dense, flex_options

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = apply_rope(q, self.cos, self.sin, self.num_heads)
        k = apply_rope(k, self.cos, self.sin, self.num_heads)
        if self.block_mask is not None:
            h = self.num_heads
            qh, kh, vh = (rearrange(t, "b s (n d) -> b n s d", n=h) for t in (q, k, v))
            x = _flex_attention(qh, kh, vh, self.block_mask, self.flex_options)
            return rearrange(x, "b n s d -> b s (n d)", n=h)
        if self.mask is None and self.dense is not None:
            return self.dense(q, k, v, self.num_heads)
        return sdpa(q, k, v, self.num_heads, self.mask)
