"""Causal attention for GcDiT: the one visibility / eviction / RoPE-position rule (DESIGN.md §4.4),
the attention plans used by the model's blocks, the KV cache and the per-cell rollout.

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

Rollout (deploy and the stage-3 self-rollout): prefill cell 0 at t=0; per cell, ``len(timesteps)``
denoise forwards (x0 = x - sigma*v, re-noise to the next sigma with fresh noise), then a commit
forward of x0 at t=0 writes the cell's K/V (no noisy-step K/V are ever cached; the cache is
written under no_grad). ``sigma = t / 1000`` (flow.axis_sigma); the timestep axis itself comes from the flow module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange

from gc25d_core.flow import axis_sigma, noise_at_sigma, x0_at_sigma
from gc25d_core.models.configs import CausalConfig

if TYPE_CHECKING:
    from gc25d_core.models.gcdit import GcDiT, TextContext

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


class KVCache:
    """Per-layer K (un-rotated) and V of committed cells, evicted by ``visible``.

    ``begin(cell)`` starts a forward for query cell ``cell`` (evicting what it cannot see);
    ``attend`` runs one layer; ``end(commit)`` appends the forward's K/V when it was a commit.
    Rotated cached keys are memoised per query cell (4 denoise forwards + commit share them).
    K and V are kept per cell (``k[layer][slot]``), never rewritten: a view of what a forward saw
    (``layer_view``) holds only references, so the stage-3 rollout's recomputed exit forwards share
    the cells' tensors instead of copying 20 cells per forward.
    """

    def __init__(self, spec: CausalConfig, num_layers: int, grid_hw: tuple[int, int], num_heads: int):
        self.spec, self.num_layers, self.num_heads = spec, num_layers, num_heads
        self.grid_hw = grid_hw
        self.tokens_per_cell = grid_hw[0] * grid_hw[1]
        self.cells: list[int] = []
        self.k: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]  # [layer][slot of cells]
        self.v: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cell: int | None = None
        self._rot: dict[int, torch.Tensor] = {}
        self._freqs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._fold: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.cells)

    def visible_cells(self, q_cell: int) -> list[int]:
        if not self.cells:
            return []
        keep = visible(q_cell, torch.tensor(self.cells), self.spec)
        return [c for c, k in zip(self.cells, keep.tolist(), strict=True) if k]

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(raw K, V) of the cached cells of ``layer``, in cell order (tests)."""
        if not self.k[layer]:
            return None
        return torch.cat(self.k[layer], dim=1), torch.cat(self.v[layer], dim=1)

    def evict_for(self, q_cell: int) -> None:
        keep = self.visible_cells(q_cell)
        if keep == self.cells:
            return
        slots = [self.cells.index(c) for c in keep]
        for layer in range(self.num_layers):
            self.k[layer] = [self.k[layer][s] for s in slots]
            self.v[layer] = [self.v[layer][s] for s in slots]
        self.cells = keep
        self._invalidate()

    def _invalidate(self) -> None:
        self._cell = None
        self._rot.clear()
        self._freqs.clear()

    def begin(self, cell: int) -> None:
        if self.cells and cell <= self.cells[-1]:
            raise ValueError(f"query cell {cell} must come after the cached cells {self.cells}")
        self.evict_for(cell)
        if self._cell != cell:
            self._invalidate()
            self._cell = cell
        self._pending.clear()

    def _token_freqs(self, which: str, rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor]:
        if which not in self._freqs:
            assert self._cell is not None
            h, w = self.grid_hw
            if which == "q":
                pos = torch.tensor([query_time_position(self._cell, self.spec)])
            else:
                pos = rope_time_positions(torch.tensor(self.cells), self._cell, self.spec)
            self._freqs[which] = rope.token_freqs(pos, h, w)
        return self._freqs[which]

    @torch.compiler.disable  # python-side cache state: keep it out of compiled block graphs
    def attend(self, layer: int, q, k, v, rope: RopeTable, commit: bool) -> torch.Tensor:
        if self._cell is None:
            raise RuntimeError("KVCache.attend outside begin()/end()")
        k_rot = None
        if self.k[layer]:
            if layer not in self._rot:
                cos_k, sin_k = self._token_freqs("kv", rope)
                self._rot[layer] = apply_rope(torch.cat(self.k[layer], dim=1), cos_k, sin_k, self.num_heads)
            k_rot = self._rot[layer]
        if commit:
            self._pending[layer] = (k.detach(), v.detach())
        return _attend_cached(q, k, v, self._token_freqs("q", rope), k_rot, self.v[layer], self.num_heads)

    def layer_view(self, layer: int, rope: RopeTable) -> KVLayerView:
        """What a forward of the current query cell sees at ``layer``, by reference (no copies)."""
        if self._cell is None:
            raise RuntimeError("KVCache.layer_view outside begin()/end()")
        kv = self._token_freqs("kv", rope) if self.k[layer] else None
        return KVLayerView(self._token_freqs("q", rope), kv, tuple(self.k[layer]), tuple(self.v[layer]))

    # -- the folded commit (deploy): one forward commits cell k and runs cell k + 1's first step

    def begin_fold(self, cell: int) -> None:
        """Start a forward whose first ``tokens_per_cell`` tokens are ``cell`` clean at t=0 (committed
        at ``end_fold``) and whose other tokens are ``cell + 1`` (not committed). Each group sees
        exactly what its own forward would: ``cell`` the cache as it is, ``cell + 1`` the cache after
        the commit (evicted for it, with ``cell`` itself), each rotated for its own query cell."""
        self.begin(cell)
        nxt = cell + 1
        after = [*self.cells, cell]
        keep = visible(nxt, torch.tensor(after), self.spec).tolist()
        kept = [c for c, k in zip(after, keep, strict=True) if k]
        if kept[-1] != cell:
            raise RuntimeError(f"cell {nxt} cannot see cell {cell}: the window must be at least 2 to fold")
        self._fold = {"cells": kept, "slots": [self.cells.index(c) for c in kept[:-1]], "rot": {}}

    def _fold_freqs(self, rope: RopeTable) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        fold = self._fold
        if "freqs" not in fold:
            assert self._cell is not None
            h, w = self.grid_hw
            nxt = self._cell + 1
            q = rope.token_freqs(torch.tensor([query_time_position(nxt, self.spec)]), h, w)
            kv = rope.token_freqs(rope_time_positions(torch.tensor(fold["cells"]), nxt, self.spec), h, w)
            fold["freqs"] = (q, kv)
        return fold["freqs"]

    @torch.compiler.disable  # python-side cache state: keep it out of compiled block graphs
    def attend_fold(self, layer: int, q, k, v, rope: RopeTable) -> torch.Tensor:
        n, h = self.tokens_per_cell, self.num_heads
        out_a = self.attend(layer, q[:, :n], k[:, :n], v[:, :n], rope, commit=True)
        ka, va = k[:, :n], v[:, :n]
        fold = self._fold
        (cos_q, sin_q), (cos_k, sin_k) = self._fold_freqs(rope)
        k_all = torch.cat([*(self.k[layer][s] for s in fold["slots"]), ka], dim=1)
        v_all = torch.cat([*(self.v[layer][s] for s in fold["slots"]), va], dim=1)
        k_rot = apply_rope(k_all, cos_k, sin_k, h)
        fold["rot"][layer] = k_rot  # what cell k + 1's later forwards would rotate: kept for them
        qb = apply_rope(q[:, n:], cos_q, sin_q, h)
        kb = apply_rope(k[:, n:], cos_q, sin_q, h)
        out_b = sdpa(qb, torch.cat([k_rot, kb], dim=1), torch.cat([v_all, v[:, n:]], dim=1), h)
        return torch.cat([out_a, out_b], dim=1)

    def end_fold(self) -> None:
        """Commit the first group's K/V; the next cell's forwards reuse the rotations of the fold."""
        fold, cell = self._fold, self._cell
        assert cell is not None
        self.end(commit=True)
        if self.cells != fold["cells"]:
            raise RuntimeError(f"fold of cell {cell}: cache {self.cells} != expected {fold['cells']}")
        self._cell = cell + 1
        self._rot = dict(fold["rot"])
        self._freqs = {"q": fold["freqs"][0], "kv": fold["freqs"][1]}
        self._fold = {}

    def end(self, commit: bool) -> None:
        """Finish the forward; a commit appends this cell's K/V and evicts for the next cell."""
        cell = self._cell
        if commit:
            if cell is None or len(self._pending) != self.num_layers:
                raise RuntimeError(f"commit of cell {cell} saw {len(self._pending)}/{self.num_layers} layers")
            for layer, (k, v) in sorted(self._pending.items()):
                self.k[layer].append(k)
                self.v[layer].append(v)
            self.cells.append(cell)
            self._pending.clear()
            self._invalidate()
            self.evict_for(cell + 1)
        self._pending.clear()


class StaticKVCache(KVCache):
    """The KVCache rule on preallocated per-layer buffers (deploy; CUDA-graph friendly).

    Per layer three buffers of ``S + 1`` cells (S = sink + window - 1, the most cached cells a query
    can see): ``k_raw`` (un-rotated keys, cell order), ``k_rot`` (keys rotated for the current query
    cell) and ``v``. Slot ``len(cells)`` is the current cell's: every forward writes its rotated K
    and V there and attends over ``[:, :(len + 1) * n]``, the same tensors in the same order as the
    KVCache's ``cat`` (so the same result, bit for bit on a CPU). A commit also writes the raw K
    into that slot; ``end`` keeps it and compacts the buffers for the next cell (eviction keeps the
    cell order). The cached keys are rotated once per query cell in ``begin`` (``rotate``), from
    static cos/sin buffers. At a full window past the RoPE cap every shape and every rotation table
    is the same from cell to cell (``steady``), so a forward can be captured once and replayed.
    No folded commit, no grad (deploy)."""

    def __init__(
        self,
        spec: CausalConfig,
        num_layers: int,
        grid_hw: tuple[int, int],
        num_heads: int,
        rope: RopeTable,
    ):
        if spec.window is None:
            raise ValueError("a static KV cache needs a window (its size bounds the buffers)")
        super().__init__(spec, num_layers, grid_hw, num_heads)
        self.rope = rope
        self.slots = spec.sink + spec.window - 1
        self.k_raw: list[torch.Tensor | None] = [None] * num_layers
        self.k_rot: list[torch.Tensor | None] = [None] * num_layers
        self.v_buf: list[torch.Tensor | None] = [None] * num_layers
        self.cos_q: torch.Tensor | None = None
        self.sin_q: torch.Tensor | None = None
        self.cos_k: torch.Tensor | None = None
        self.sin_k: torch.Tensor | None = None
        self._rotated_for: int | None = None
        self._gather: dict[tuple[int, ...], torch.Tensor] = {}
        self._tables: tuple[int, tuple[int, ...]] | None = None
        self.rotate_fn: Callable[..., torch.Tensor] = apply_rope
        self.grid_key: tuple[Any, ...] | None = None  # (latent hw, device, dtype) a streamer reuses it for

    def reset(self) -> None:
        """Empty for a new session, keeping every buffer (the graphs captured against them stay
        valid: a session's first cells replay what load-time warm-up captured)."""
        self.cells = []
        self._cell = None
        self._pending.clear()
        self._rotated_for = None
        self._tables = None

    def fill(self, cell: int) -> int:
        """How many cached cells query ``cell`` sees (after its eviction): the forward's shapes."""
        return len(self.visible_cells(cell))

    def compile_rotation(self) -> None:
        """GPU speed: the full-window key rotation through one fused torch.compile kernel (the same
        arithmetic up to the compiler's rounding; the eager ``apply_rope`` stays the reference and
        runs every other shape)."""
        self.rotate_fn = torch.compile(apply_rope, dynamic=False)

    def steady(self, cell: int) -> bool:
        """From ``cell`` on every forward has the same shapes and tables (full window, past the cap)."""
        cap = self.spec.rope_cap if self.spec.rope_cap is not None else cell
        return cell >= max(cap, self.slots) and len(self.visible_cells(cell)) == self.slots

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(raw K, V) of the cached cells of ``layer``, in cell order (tests)."""
        k, v = self.k_raw[layer], self.v_buf[layer]
        if k is None or v is None or not self.cells:
            return None
        m = len(self.cells) * self.tokens_per_cell
        return k[:, :m], v[:, :m]

    def _alloc(self, layer: int, k: torch.Tensor) -> None:
        b, n, d = k.shape
        if b != 1:
            raise ValueError("the static KV cache serves one stream (batch 1)")
        shape = (b, (self.slots + 1) * self.tokens_per_cell, d)
        self.k_raw[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.k_rot[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.v_buf[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)

    def evict_for(self, q_cell: int) -> None:
        keep = self.visible_cells(q_cell)
        if keep == self.cells:
            return
        slots = tuple(self.cells.index(c) for c in keep)
        n = self.tokens_per_cell
        if slots and slots != tuple(range(len(slots))):
            for bufs in (self.k_raw, self.v_buf):
                for buf in bufs:
                    if buf is None:
                        continue
                    if slots not in self._gather:
                        idx = torch.cat([torch.arange(s * n, (s + 1) * n) for s in slots])
                        self._gather[slots] = idx.to(buf.device)
                    buf[:, : len(slots) * n].copy_(buf.index_select(1, self._gather[slots]))
        self.cells = keep
        self._rotated_for = None

    def _set_freqs(self, cell: int) -> None:
        h, w = self.grid_hw
        q_pos = query_time_position(cell, self.spec)
        pos = rope_time_positions(torch.tensor(self.cells), cell, self.spec) if self.cells else None
        key = (q_pos, tuple(pos.tolist()) if pos is not None else ())
        if key == self._tables:  # a full window past the cap: the same tables every cell
            return
        self._tables = key
        cos_q, sin_q = self.rope.token_freqs(torch.tensor([q_pos]), h, w)
        if self.cos_q is None or self.sin_q is None:
            self.cos_q, self.sin_q = cos_q.clone(), sin_q.clone()
        else:
            self.cos_q.copy_(cos_q)
            self.sin_q.copy_(sin_q)
        if pos is None:
            return
        cos_k, sin_k = self.rope.token_freqs(pos, h, w)
        m = cos_k.shape[0]
        if self.cos_k is None or self.sin_k is None:
            full = (self.slots * self.tokens_per_cell, cos_k.shape[1])
            self.cos_k = torch.zeros(full, dtype=cos_k.dtype, device=cos_k.device)
            self.sin_k = torch.zeros(full, dtype=sin_k.dtype, device=sin_k.device)
        self.cos_k[:m].copy_(cos_k)
        self.sin_k[:m].copy_(sin_k)

    def begin(self, cell: int, rotate: bool = True) -> None:
        """Start a forward of query ``cell``: evict, and on a new query cell set the rotation tables
        and (``rotate``; a graph runner replays it instead) rotate the cached keys."""
        if self.cells and cell <= self.cells[-1]:
            raise ValueError(f"query cell {cell} must come after the cached cells {self.cells}")
        self.evict_for(cell)
        if self._cell != cell or self._rotated_for != cell:
            self._cell = cell
            self._set_freqs(cell)
            if rotate:
                self.rotate()
            self._rotated_for = cell
        self._pending.clear()

    def rotate(self) -> None:
        """Rotate every layer's cached keys for the current query cell (into ``k_rot``)."""
        m = len(self.cells) * self.tokens_per_cell
        if not m or self.cos_k is None or self.sin_k is None:
            return
        cos_k, sin_k = self.cos_k[:m], self.sin_k[:m]
        fn = self.rotate_fn if m == self.slots * self.tokens_per_cell else apply_rope
        for raw, rot in zip(self.k_raw, self.k_rot, strict=True):
            if raw is not None and rot is not None:
                rot[:, :m].copy_(fn(raw[:, :m], cos_k, sin_k, self.num_heads))

    @torch.compiler.disable
    def attend(self, layer: int, q, k, v, rope: RopeTable, commit: bool) -> torch.Tensor:
        if self._cell is None or self.cos_q is None or self.sin_q is None:
            raise RuntimeError("StaticKVCache.attend outside begin()/end()")
        if self.k_raw[layer] is None:
            self._alloc(layer, k)
        k_raw, k_rot, v_buf = self.k_raw[layer], self.k_rot[layer], self.v_buf[layer]
        assert k_raw is not None and k_rot is not None and v_buf is not None
        h, n = self.num_heads, self.tokens_per_cell
        lo = len(self.cells) * n
        qr = apply_rope(q, self.cos_q, self.sin_q, h)
        k_rot[:, lo : lo + n].copy_(apply_rope(k, self.cos_q, self.sin_q, h))
        v_buf[:, lo : lo + n].copy_(v)
        if commit:
            k_raw[:, lo : lo + n].copy_(k)
            self._pending[layer] = (k_raw, v_buf)
        return sdpa(qr, k_rot[:, : lo + n], v_buf[:, : lo + n], h)

    def begin_fold(self, cell: int) -> None:
        raise NotImplementedError("the static KV cache has no folded commit (use KVCache)")

    def end(self, commit: bool) -> None:
        """Finish the forward; a commit keeps the cell's slot and evicts for the next cell."""
        cell = self._cell
        if commit:
            if cell is None or len(self._pending) != self.num_layers:
                raise RuntimeError(f"commit of cell {cell} saw {len(self._pending)}/{self.num_layers} layers")
            self.cells.append(cell)
            self._pending.clear()
            self.evict_for(cell + 1)
            self._cell = None
        self._pending.clear()


class GraphedKVForward:
    """The model's forward for deploy with CUDA graphs of the KV forwards of every cell from cell 1.

    Called like the model (``forward(x, t, text, sem_ids, mode="kv", cell=, cache=, commit=)``).
    Against a ``StaticKVCache`` a forward's shapes depend only on how many cached cells its query
    sees (``cache.fill``: 1 at cell 1, up to a full window), its RoPE tables live in the cache's
    static buffers (``begin`` fills them) and its K/V in the cache's preallocated buffers: so the
    denoise forward, the commit forward and the key rotation of each fill level are captured once
    (``torch.cuda.CUDAGraph`` over static inputs, all graphs in one memory pool: they replay one
    after another and every output is copied out at once) and replayed from then on, in every
    session on that cache (``CausalStreamer`` keeps it). ``DeployRuntime.warm_up`` captures them
    all at load. Everything else (the anchor prefill, a fold, another cache, a CPU, grad) runs
    the model eagerly.
    The graphs compute what the eager forward computes on the same buffers (tests/deploy checks
    the eager static path equals the KVCache one; bench/speed/deploy.py records the replay's error).
    A capture that fails turns the graphs off and says why (``disabled``)."""

    def __init__(self, model: Any):
        self.model = model
        self.graphs: dict[Any, tuple[Any, torch.Tensor | None]] = {}
        self.static: dict[str, torch.Tensor] = {}
        self.disabled: str | None = None
        self.replays = 0
        self._text_raw: torch.Tensor | None = None
        self._rotate: dict[int, Any] = {}
        self._cache: StaticKVCache | None = None
        self._pool: Any = None

    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def usable(self, latent: torch.Tensor, cell: int, cache: Any, kwargs: dict[str, Any]) -> bool:
        return (
            self.disabled is None
            and latent.is_cuda
            and not torch.is_grad_enabled()
            and isinstance(cache, StaticKVCache)
            and kwargs.get("fold") is None
            and kwargs.get("sem_pooled") is None
            and cell >= 1  # the anchor prefill (one frame of ids) stays eager
            and cache.fill(cell) >= 1
        )

    def __call__(self, latent, timestep, text, sem_ids=None, **kwargs: Any) -> Any:
        cell, cache = kwargs.get("cell"), kwargs.get("cache")
        if (
            kwargs.get("mode") != "kv"
            or cell is None
            or not isinstance(cache, StaticKVCache)
            or not self.usable(latent, cell, cache, kwargs)
        ):
            return self._eager(latent, timestep, text, sem_ids, **kwargs)
        from gc25d_core.models.gcdit import TextContext

        if not isinstance(text, TextContext) or text.index is None or text.num_groups != 1:
            return self._eager(latent, timestep, text, sem_ids, **kwargs)
        if self._text_raw is not None and text.raw is not self._text_raw and self._cache is cache:
            return self._eager(latent, timestep, text, sem_ids, **kwargs)
        commit = bool(kwargs.get("commit", False))
        want_out = bool(kwargs.get("return_output", True))
        try:
            return self._replay(latent, timestep, text, sem_ids, cache, cell, commit, want_out)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # capture trouble: say so and stay eager from here on
            self.disabled = f"{type(e).__name__}: {e}"
            self.graphs.clear()
            cache._pending.clear()
            cache._rotated_for = None
            return self._eager(latent, timestep, text, sem_ids, **kwargs)

    def _inputs(self, latent, timestep, text, sem_ids) -> None:
        st = self.static
        t = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1).expand(latent.shape[0])
        new = {"x": latent, "t": t, "idx": text.index}
        if sem_ids is not None:
            new["sem"] = sem_ids
        for name, value in new.items():
            if name not in st:
                st[name] = torch.empty_like(value, device=latent.device)
                if name == "idx":
                    self._text_raw = text.raw
            if st[name].shape != value.shape or st[name].dtype != value.dtype:
                raise RuntimeError(f"graph input {name}: {tuple(value.shape)} {value.dtype} changed")
            st[name].copy_(value, non_blocking=True)

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: kernels picked, workspaces allocated, memos filled
                fn()
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        return graph, out

    def reset(self) -> None:
        """Drop every graph (they point at one cache's buffers)."""
        self.graphs.clear()
        self.static.clear()
        self._rotate = {}
        self._text_raw = None
        self._cache = None
        self._pool = None

    def _replay(self, latent, timestep, text, sem_ids, cache, cell, commit, want_out):
        from gc25d_core.models.gcdit import TextContext

        if self._cache is not cache:  # a new session's cache: capture again against its buffers
            self.reset()
            self._cache = cache

        new_cell = cache._rotated_for != cell or cache._cell != cell
        cache.begin(cell, rotate=False)
        fill = len(cache.cells)
        if new_cell:
            if fill not in self._rotate:
                self._rotate[fill], _ = self._capture(lambda: cache.rotate() or torch.empty(0))
            self._rotate[fill].replay()
        self._inputs(latent, timestep, text, sem_ids)
        key = (fill, commit, sem_ids is None, want_out)
        if key not in self.graphs:
            st = self.static
            view = TextContext(text.raw, st["idx"], _shared=text._shared)

            def body() -> torch.Tensor:
                cache._pending.clear()
                return self.model.kv_body(st["x"], st["t"], view, st.get("sem"), cache, commit, cell)

            self.graphs[key] = self._capture(body)
        graph, out = self.graphs[key]
        graph.replay()
        self.replays += 1
        if commit:
            cache._pending = {layer: None for layer in range(cache.num_layers)}
        cache.end(commit)
        if not want_out:
            return None
        assert out is not None
        return out.clone()


class KVLayerView(NamedTuple):
    """One layer's attention inputs from the cache for one query cell: the query's and the cached
    keys' RoPE tables and the cached cells' raw K and V (references to the cache's tensors)."""

    q_freqs: tuple[torch.Tensor, torch.Tensor]
    kv_freqs: tuple[torch.Tensor, torch.Tensor] | None
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]


def _attend_cached(
    q, k, v, q_freqs: tuple[torch.Tensor, torch.Tensor], k_rot: torch.Tensor | None, v_cells, num_heads: int
) -> torch.Tensor:
    """One query cell's attention: its q / k rotated for its position, against the cached cells'
    rotated keys ``k_rot`` and values ``v_cells`` (per cell) then itself."""
    qr, kr = (apply_rope(x, *q_freqs, num_heads) for x in (q, k))
    v_all = v
    if k_rot is not None:
        kr = torch.cat([k_rot, kr], dim=1)
        v_all = torch.cat([*v_cells, v], dim=1)
    return sdpa(qr, kr, v_all, num_heads)


@torch.compiler.disable
def attend_view(view: KVLayerView, q, k, v, num_heads: int) -> torch.Tensor:
    """``KVCache.attend`` over a ``KVLayerView`` (no commit), rotating the cached keys itself."""
    k_rot = None
    if view.k:
        assert view.kv_freqs is not None
        k_rot = apply_rope(torch.cat(view.k, dim=1), *view.kv_freqs, num_heads)
    return _attend_cached(q, k, v, view.q_freqs, k_rot, view.v, num_heads)


class KVStepAttention:
    """The plan of one KV-cache forward (one query cell).

    ``replayable`` (a grad forward whose blocks recompute in backward): each layer's first call
    records what the cache showed it (``KVCache.layer_view``), and every call attends over that
    record, so the recomputation in backward sees the cells of the forward, not the cache as later
    commits and evictions left it."""

    def __init__(self, cache: KVCache, rope: RopeTable, commit: bool, replayable: bool = False):
        if replayable and (commit or isinstance(cache, StaticKVCache)):
            raise ValueError("a replayable KV forward reads the (dynamic) cache and commits nothing")
        self.cache, self.rope, self.commit = cache, rope, commit
        self.views: dict[int, KVLayerView] | None = {} if replayable else None

    def __call__(self, layer: int, q, k, v) -> torch.Tensor:
        if self.views is None:
            return self.cache.attend(layer, q, k, v, self.rope, self.commit)
        if layer not in self.views:
            self.views[layer] = self.cache.layer_view(layer, self.rope)
        return attend_view(self.views[layer], q, k, v, self.cache.num_heads)


class KVFoldAttention:
    """The plan of a folded forward: [clean cell k (committed) | noisy cell k + 1] (``begin_fold``)."""

    def __init__(self, cache: KVCache, rope: RopeTable):
        self.cache, self.rope = cache, rope

    def __call__(self, layer: int, q, k, v) -> torch.Tensor:
        return self.cache.attend_fold(layer, q, k, v, self.rope)


# ------------------------------------------------------------------------------------------------
# rollout (deploy, stage-3 self-rollout, tests)


def _noise_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)


def denoise_cell(
    model: Callable[..., Any],
    cache: KVCache,
    cell: int,
    x_init: torch.Tensor,
    timesteps: Sequence[float],
    *,
    text: TextContext,
    sem_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    noise: Sequence[torch.Tensor] | None = None,
    exit_step: int | None = None,
    grad: bool = False,
    record: list[dict[str, Any]] | None = None,
    commit: bool = True,
    fold: FoldedCommit | None = None,
    checkpoint: bool = False,
) -> torch.Tensor:
    """Denoise one cell against the cache and commit it; returns x0 ``[B, C, 1, H, W]``.

    Steps k < ``exit_step`` (default: the last) run under no_grad; the exit step runs with grad
    iff ``grad`` (``checkpoint``: its blocks recompute their activations in backward). Re-noising
    uses ``noise[k]`` or fresh normal noise from ``generator``. The commit forward of x0.detach()
    at t=0 always runs under no_grad. ``record`` (tests) receives one dict
    per forward: cell, step (int or "commit"), x, t, v.

    Deploy's folded commit: ``commit=False`` leaves this cell's commit to the next cell, whose first
    forward takes it as ``fold`` (the previous cell's clean x0, text and ids) and runs
    [clean k | noisy k + 1] in one forward (same K/V and output as the separate commit; tests).
    """
    if fold is not None and (grad or fold.cell != cell - 1):
        raise ValueError(f"a folded commit needs grad off and the previous cell (got {fold.cell} for {cell})")
    num_steps = len(timesteps)
    exit_k = num_steps - 1 if exit_step is None else exit_step
    if not 0 <= exit_k < num_steps:
        raise ValueError(f"exit_step={exit_step} outside 0..{num_steps - 1}")
    x = x_init
    x0 = x
    for k in range(exit_k + 1):
        t = float(timesteps[k])
        with torch.set_grad_enabled(grad and k == exit_k):
            extra: dict[str, Any] = {"fold": fold} if fold is not None and k == 0 else {}
            if checkpoint and grad and k == exit_k:
                extra["use_gradient_checkpointing"] = True
            v = model(x, t, text, sem_ids, mode="kv", cell=cell, cache=cache, commit=False, **extra)
            assert v is not None
            x0 = x0_at_sigma(x, v, axis_sigma(t))
        if record is not None:
            record.append({"cell": cell, "step": k, "x": x.detach(), "t": t, "v": v.detach()})
        if k < exit_k:
            eps = noise[k] if noise is not None else _noise_like(x, generator)
            x = noise_at_sigma(x0, eps, axis_sigma(timesteps[k + 1])).detach()
    if not commit:
        return x0
    with torch.no_grad():
        v_commit = model(
            x0.detach(),
            0.0,
            text,
            sem_ids,
            mode="kv",
            cell=cell,
            cache=cache,
            commit=True,
            return_output=record is not None,
        )
    if record is not None:
        record.append({"cell": cell, "step": "commit", "x": x0.detach(), "t": 0.0, "v": v_commit})
    return x0


class FoldedCommit(NamedTuple):
    """A cell denoised but not committed yet: its commit rides on the next cell's first forward."""

    cell: int
    x0: torch.Tensor
    text: TextContext
    sem_ids: torch.Tensor | None


class CausalStreamer:
    """Stateful per-cell generation (deploy): ``start`` prefills the anchor cell at t=0, each
    ``step`` denoises and commits the next cell."""

    def __init__(
        self,
        model: GcDiT,
        spec: CausalConfig,
        timesteps: Sequence[float],
        forward: Callable[..., Any] | None = None,
        fold_commit: bool = False,
        static_kv: bool = False,
        checkpoint: bool = False,
    ):
        """``forward``: what runs the model's forwards (a training engine's wrapper: FSDP gathers
        its shards there); default the model itself. The cache is always the model's.
        ``checkpoint`` (training): grad forwards recompute their blocks in backward.
        ``fold_commit`` (deploy, no grad): each cell's commit runs inside the next cell's first
        forward (4 forwards per cell instead of 5); the last cell's commit stays pending.
        ``static_kv`` (deploy, no grad, batch 1): the preallocated ``StaticKVCache`` (same results;
        what ``GraphedKVForward`` replays against)."""
        if fold_commit and static_kv:
            raise ValueError("fold_commit and static_kv do not combine (the static cache has no fold)")
        self.model, self.spec, self.timesteps = model, spec, tuple(float(t) for t in timesteps)
        self.forward = model if forward is None else forward
        self.fold_commit = fold_commit
        self.static_kv = static_kv
        self.checkpoint = checkpoint
        self.cache: KVCache | None = None
        self.next_cell = 0
        self.pending: FoldedCommit | None = None

    @torch.no_grad()
    def start(self, anchor: torch.Tensor, text: TextContext, sem_ids: torch.Tensor | None = None) -> None:
        """Prefill the clean anchor cell ``[B, C, 1, H, W]`` at t=0."""
        if self.static_kv:
            c = self.cache
            if isinstance(c, StaticKVCache) and c.grid_key == (
                tuple(anchor.shape[-2:]),
                anchor.device,
                anchor.dtype,
            ):
                c.reset()  # the same buffers: graphs captured against them keep replaying
            else:
                c = self.model.new_kv_cache(
                    self.spec, anchor.shape[-2:], static=True, device=anchor.device, dtype=anchor.dtype
                )
                assert isinstance(c, StaticKVCache)
                c.grid_key = (tuple(anchor.shape[-2:]), anchor.device, anchor.dtype)
            self.cache = c
        else:
            self.cache = self.model.new_kv_cache(self.spec, anchor.shape[-2:])
        self.forward(
            anchor, 0.0, text, sem_ids, mode="kv", cell=0, cache=self.cache, commit=True, return_output=False
        )
        self._cell_like = anchor
        self.next_cell = 1
        self.pending = None

    def step(
        self,
        text: TextContext,
        sem_ids: torch.Tensor | None = None,
        *,
        x_init: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        record: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Denoise + commit the next cell (``kwargs``: noise, exit_step, grad of ``denoise_cell``)."""
        if self.cache is None:
            raise RuntimeError("CausalStreamer.step before start()")
        if x_init is None:
            x_init = _noise_like(self._cell_like, generator)
        if self.fold_commit:
            kwargs.update(commit=False, fold=self.pending)
        x0 = denoise_cell(
            self.forward,
            self.cache,
            self.next_cell,
            x_init,
            self.timesteps,
            text=text,
            sem_ids=sem_ids,
            generator=generator,
            record=record,
            checkpoint=self.checkpoint,
            **kwargs,
        )
        if self.fold_commit:
            self.pending = FoldedCommit(self.next_cell, x0.detach(), text, sem_ids)
        self.next_cell += 1
        return x0


def kv_rollout(
    model: GcDiT,
    anchor: torch.Tensor,
    num_cells: int,
    timesteps: Sequence[float],
    *,
    spec: CausalConfig,
    context: torch.Tensor,
    context_index: torch.Tensor | None = None,
    sem_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    record: list[dict[str, Any]] | None = None,
) -> torch.Tensor:
    """Generate cells 1..num_cells-1 after the clean ``anchor`` [B, C, 1, H, W]; returns
    ``[B, C, num_cells, H, W]`` (cell 0 = anchor). ``context``: shared [B, Lc, Dt], per cell
    [B, N, Lc, Dt], or a bank [B, P, Lc, Dt] with ``context_index`` [B, N]. ``sem_ids``: the clip's
    raw ids [B, 1 + 4(N-1), H*16, W*16]."""
    from gc25d_core.models.sem_cond import cell_frame_slice

    streamer = CausalStreamer(model, spec, timesteps)

    def sem(cell: int) -> torch.Tensor | None:
        return None if sem_ids is None else sem_ids[:, cell_frame_slice(cell)]

    texts = model.per_cell_text(context, context_index, num_cells)
    streamer.start(anchor, texts(0), sem(0))
    cells = [anchor]
    for cell in range(1, num_cells):
        cells.append(streamer.step(texts(cell), sem(cell), generator=generator, record=record))
    return torch.cat(cells, dim=2)
