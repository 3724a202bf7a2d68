"""GcDiT: DiffSynth's WanModel (Wan2.2-TI2V-5B) + ``gc_sem_cond``, with its own TI2V forward (SPEC §6).

DiffSynth's ``WanModel.forward`` is broken (research/diffsynth_wan22.md §2); its working reference is
``model_fn_wan_video``. GcDiT keeps WanModel's modules and state-dict keys (825 Wan + 6 sem-cond) and
runs them itself:

    per-cell timesteps (TI2V: cell 0 at t=0) -> per-token time embedding -> text embedding
    -> patchify + sem cond -> tokens -> 3-D RoPE -> blocks (optional gradient checkpointing)
    -> head -> unpatchify

The block body mirrors ``DiTBlock.forward`` op for op, but self-attention goes through an attention
plan (``causal.py``) so the same weights run bidirectionally, block-causally, with teacher forcing
[clean | noisy], or one cell at a time against a KV cache. With the sem-cond last layer at zero the
bidirectional output is bit-identical to ``model_fn_wan_video(..., fuse_vae_embedding_in_latents=True)``
in fp32.

Text: ``context`` is one prompt for the whole clip ``[B, Lc, Dt]`` (Wan's layout), one per cell
``[B, N, Lc, Dt]``, or a bank ``[B, P, Lc, Dt]`` with ``context_index`` ``[B, N]`` (each cell's
prompt; the bank form embeds every distinct prompt once). Per-cell text means each cell's tokens
cross-attend to their own prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

import torch
from einops import rearrange

from gc25d_core.compat import import_diffsynth
from gc25d_core.models.causal import (
    FullSequenceAttention,
    RopeTable,
    check_full_sequence,
    flex_block_mask,
    group_mask,
    sdpa,
)
from gc25d_core.models.configs import FULL_CAUSAL, CausalConfig, DiTConfig, full_config
from gc25d_core.models.kv_cache import CellViews, KVCache, KVFoldAttention, KVStepAttention, StaticKVCache
from gc25d_core.models.sem_cond import SEM_COND_NAME, SemCondEncoder, install_sem_cond, sem_cond_keys
from gc25d_core.vocab import Vocab

import_diffsynth()
from diffsynth.core.gradient import gradient_checkpoint_forward  # noqa: E402
from diffsynth.models.wan_video_dit import (  # noqa: E402
    DiTBlock,
    RMSNorm,
    WanModel,
    modulate,
    precompute_freqs_cis_3d,
    sinusoidal_embedding_1d,
)

__all__ = ["GcDiT", "GcDiTBlock", "Mode", "TextContext", "block_forward", "cross_attention"]

Mode = Literal["full", "tf", "kv", "kv_cells"]


class TextContext:
    """Text features for cross-attention, embedded inside the model's forward.

    ``raw``: ``[B, Lc, Dt]`` (one context for every token; ``index`` None) or a bank
    ``[B, P, Lc, Dt]`` with ``index`` ``[B, G]``: the bank entry of each token group (a cell of a
    copy), groups in sequence order. ``bind`` embeds it with the model's ``text_embedding``; the
    embedding and each block's cross K/V are memoised per module while grad is off (a deploy cell's
    5 forwards, a rollout's cells) and shared by ``select`` / ``repeat_groups`` views. A memo assumes
    fixed weights: make a new TextContext after an optimizer step. Building one touches no weights,
    so rollouts can hold it outside a sharded (FSDP) model's forward.
    """

    def __init__(self, raw: torch.Tensor, index: torch.Tensor | None = None, *, _shared: dict | None = None):
        if index is None and raw.ndim != 3:
            raise ValueError(f"one context for all tokens must be [B, Lc, Dt], got {tuple(raw.shape)}")
        if index is not None and (raw.ndim != 4 or index.ndim != 2 or index.shape[0] != raw.shape[0]):
            raise ValueError(
                f"text bank {tuple(raw.shape)} / index {tuple(index.shape)}: expected [B,P,Lc,Dt] / [B,G]"
            )
        self.raw, self.index = raw, index
        self._shared: dict[Any, Any] = {} if _shared is None else _shared
        self.emb: torch.Tensor | None = None

    @classmethod
    def build(
        cls, context: torch.Tensor, context_index: torch.Tensor | None = None, num_groups: int | None = None
    ) -> TextContext:
        """From raw features: [B, Lc, Dt] shared, [B, N, Lc, Dt] per cell, or a bank + index [B, N]."""
        if context.ndim == 3:
            if context_index is not None:
                raise ValueError("context_index needs a bank context [B, P, Lc, Dt]")
            return cls(context)
        if context.ndim != 4:
            raise ValueError(f"context must be [B, Lc, Dt] or [B, N|P, Lc, Dt], got {tuple(context.shape)}")
        b, p = context.shape[:2]
        if context_index is None:
            if num_groups is not None and p != num_groups:
                raise ValueError(f"per-cell context has {p} prompts for {num_groups} cells")
            context_index = torch.arange(p, device=context.device)[None].expand(b, -1)
        context_index = context_index.long()
        if context_index.numel():  # checked where the index lives (a host index costs no device sync)
            lo, hi = torch.aminmax(context_index)
            if int(lo) < 0 or int(hi) >= p:
                raise ValueError(f"context_index outside the bank of {p} prompts")
        return cls(context, context_index.to(context.device))

    @property
    def num_groups(self) -> int | None:
        return None if self.index is None else int(self.index.shape[1])

    def _view(self, index: torch.Tensor | None) -> TextContext:
        view = TextContext(self.raw, index, _shared=self._shared)
        view.emb = self.emb
        return view

    def select(self, index: torch.Tensor) -> TextContext:
        """Same bank (and memo), other groups (e.g. ``index[:, i:i+1]`` = cell i alone)."""
        return self if self.index is None else self._view(index)

    def join(self, other: TextContext) -> TextContext:
        """One context over this one's groups then ``other``'s (deploy's folded forward: the clean
        cell's prompt, then the next cell's). Views of one bank stay one bank (and one memo)."""
        if other.raw is self.raw and self.index is None and other.index is None:
            return self
        if other.raw is self.raw and self.index is not None and other.index is not None:
            return self._view(torch.cat([self.index, other.index], dim=1))

        def rows(c: TextContext) -> torch.Tensor:  # [B, G, Lc, Dt]
            if c.index is None:
                return c.raw[:, None]
            batch = torch.arange(c.raw.shape[0], device=c.raw.device)[:, None]
            return c.raw[batch, c.index.to(c.raw.device)]

        bank = torch.cat([rows(self), rows(other)], dim=1)
        return TextContext(
            bank, torch.arange(bank.shape[1], device=bank.device)[None].expand(bank.shape[0], -1)
        )

    def repeat_groups(self, times: int) -> TextContext:
        return self if self.index is None else self._view(torch.cat([self.index] * times, dim=1))

    def bind(self, text_embedding: Any) -> TextContext:
        """A view carrying the embedding for the current forward (fresh while grad is on)."""
        grad = torch.is_grad_enabled()
        if not grad and text_embedding in self._shared:
            emb = self._shared[text_embedding]
        else:
            emb = text_embedding(self.raw.to(text_embedding[0].weight.dtype))
            if not grad:
                self._shared[text_embedding] = emb
        view = self._view(self.index)
        view.emb = emb
        return view

    @torch.compiler.disable  # python-side memo: keep it out of compiled block graphs
    def kv(self, cross_attn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.emb is None:
            raise RuntimeError("TextContext.kv before bind(): text must be embedded inside the forward")
        grad = torch.is_grad_enabled()
        if not grad and cross_attn in self._shared:
            return self._shared[cross_attn]
        k = cross_attn.norm_k(cross_attn.k(self.emb))
        v = cross_attn.v(self.emb)
        if not grad:
            self._shared[cross_attn] = (k, v)
        return k, v


def cross_attention(cross_attn: Any, x: torch.Tensor, text: TextContext) -> torch.Tensor:
    """``CrossAttention.forward`` (no image branch) with per-group contexts and K/V memo."""
    heads = cross_attn.num_heads
    q = cross_attn.norm_q(cross_attn.q(x))
    k, v = text.kv(cross_attn)
    if text.index is None:
        return cross_attn.o(sdpa(q, k, v, heads))
    b, length, d = q.shape
    g = text.index.shape[1]
    if length % g:
        raise ValueError(f"{length} tokens do not split into {g} text groups")
    rows = torch.arange(b, device=text.index.device)[:, None]
    kg, vg = k[rows, text.index], v[rows, text.index]  # [B, G, Lc, dim]
    out = sdpa(q.reshape(b * g, length // g, d), kg.flatten(0, 1), vg.flatten(0, 1), heads)
    return cross_attn.o(out.reshape(b, length, d))


class _LayerAttention:
    """A block's self-attention for a compiled body, left to eager with its layer bound outside:
    a KV cache's attention sees another key length at every window fill level and writes the
    cache's buffers in place, so traced into the body it would recompile per fill level (past
    dynamo's recompile limit), and dynamo specialises a plain int argument, so passing ``layer``
    in would compile the body once per block. As a graph break the body's two halves keep one
    shape per cell size."""

    def __init__(
        self, attn: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], layer: int
    ):
        self.attn, self.layer = attn, layer

    @torch.compiler.disable
    def __call__(self, _layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attn(self.layer, q, k, v)


def block_forward(
    block: Any,
    x: torch.Tensor,
    text: TextContext,
    t_mod: torch.Tensor,
    attn: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    layer: int,
) -> torch.Tensor:
    """``DiTBlock.forward`` with self-attention via ``attn`` and the modulation of token groups:
    ``t_mod`` [B, G, 6, dim] modulates G equal runs of tokens (G = L: per token, DiffSynth's layout;
    G = cells: once per cell). Per cell, the [B, L, 6, dim] tensor and its gradient never exist: the
    modulation broadcasts over a [B, G, L/G, dim] view, with the same values per element."""
    b, length, dim = x.shape
    groups = t_mod.shape[1]
    if length % groups:
        raise ValueError(f"{length} tokens do not split into {groups} modulation groups")
    mod = (block.modulation.to(dtype=t_mod.dtype, device=t_mod.device) + t_mod).chunk(6, dim=2)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod  # [B, G, 1, dim] each

    def grouped(y: torch.Tensor) -> torch.Tensor:
        return y.view(b, groups, length // groups, dim)

    def flat(y: torch.Tensor) -> torch.Tensor:
        return y.view(b, length, dim)

    h = flat(modulate(grouped(block.norm1(x)), shift_msa, scale_msa))
    sa = block.self_attn
    q = sa.norm_q(sa.q(h))
    k = sa.norm_k(sa.k(h))
    v = sa.v(h)
    x = flat(block.gate(grouped(x), gate_msa, grouped(sa.o(attn(layer, q, k, v)))))
    x = x + cross_attention(block.cross_attn, block.norm3(x), text)
    h = flat(modulate(grouped(block.norm2(x)), shift_mlp, scale_mlp))
    return flat(block.gate(grouped(x), gate_mlp, grouped(block.ffn(h))))


class _CompiledBodyEagerAttention:
    """A block body compiled once for every block and every window fill level: the attention
    (``_LayerAttention``) runs eagerly between the two compiled halves."""

    def __init__(self, **kwargs: Any):
        self.fn = torch.compile(block_forward, **kwargs)

    def __call__(
        self, block: Any, x: torch.Tensor, text: TextContext, t_mod: torch.Tensor, attn: Any, layer: int
    ):
        return self.fn(block, x, text, t_mod, _LayerAttention(attn, layer), 0)


class GcDiTBlock(DiTBlock):
    """DiffSynth's ``DiTBlock`` (same parameters and keys) whose forward also takes GcDiT's text
    context and attention plan. GcDiT calls its blocks as modules, so per-block wrappers (FSDP units,
    activation checkpointing, hooks) see every call; DiffSynth's own callers still get the original
    ``forward(x, context, t_mod, freqs)``."""

    body: Callable[..., torch.Tensor] = staticmethod(block_forward)

    def forward(self, x, context, t_mod, freqs_or_attn, layer: int | None = None):
        if isinstance(context, TextContext):
            return self.body(self, x, context, t_mod, freqs_or_attn, layer)
        return super().forward(x, context, t_mod, freqs_or_attn)


class GcDiT(WanModel):
    """Wan2.2-TI2V-5B DiT + ``gc_sem_cond``. Build with ``GcDiT(cfg)`` / ``GcDiT.from_config``."""

    def __init__(self, cfg: DiTConfig | None = None, *, vocab: Vocab | None = None):
        cfg = cfg or full_config()
        if vocab is not None and vocab != cfg.vocab:
            cfg = cfg.model_copy(update={"vocab": vocab})
        super().__init__(**cfg.wan_kwargs())
        self.gc_config = cfg
        self.vocab: Vocab = cfg.vocab
        self.num_heads = cfg.num_heads
        self.per_cell_time = cfg.per_cell_time
        for block in self.blocks:
            block.__class__ = GcDiTBlock  # adds no parameters: keys and init stay DiffSynth's
        install_sem_cond(self, cfg.vocab, hidden=cfg.sem_hidden)
        self.use_fused_rmsnorm(cfg.fused_rmsnorm)
        # "sdpa"; "flex" (GPU: compiled flex attention for causal masks); "fa4" (GPU, optional
        # flash-attn-4 package: FlashAttention-4 for the unmasked full-sequence attention)
        self.attn_backend = "sdpa"
        self.flex_options: dict[str, Any] = {}  # torch FlexKernelOptions of the "flex" backend
        self.track_stats = False
        # raw sem ids outside the vocab raise in pooled_onehot (one device sync per forward); a
        # caller that checked them on the host (the SFT data worker) turns this off
        self.check_sem_ids = True
        self.last_stats: dict[str, torch.Tensor] = {}
        self._rope_tables: dict[tuple[str, torch.dtype], RopeTable] = {}

    @classmethod
    def from_config(cls, cfg: DiTConfig) -> GcDiT:
        return cls(cfg)

    @property
    def gc_sem_cond_module(self) -> SemCondEncoder:
        return getattr(self, SEM_COND_NAME)

    @staticmethod
    def sem_cond_keys() -> tuple[str, ...]:
        return sem_cond_keys()

    def use_fused_rmsnorm(self, enabled: bool = True) -> None:
        """Switch every RMSNorm to ``F.rms_norm`` (DiffSynth's own ``use_torch_norm`` flag): one fused
        kernel instead of an fp32 round trip; not bit-identical to the default path."""
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.use_torch_norm = enabled

    def enable_compile(self, eager_attention: bool = False, **kwargs: Any) -> None:
        """torch.compile the block body (GPU speed; the eager body stays the reference).
        ``eager_attention``: the self-attention stays outside the compiled graphs (KV forwards: one
        compiled body for every window fill level)."""
        body = (
            _CompiledBodyEagerAttention(**kwargs)
            if eager_attention
            else torch.compile(block_forward, **kwargs)
        )
        for block in self.blocks:
            block.body = body

    # -------------------------------------------------------------------------------- pieces

    def host_freqs(self) -> tuple[torch.Tensor, ...]:
        """WanModel's RoPE table: a plain attribute, so a meta-device build leaves it on meta; then it
        is rebuilt on the CPU (and kept)."""
        freqs = cast(tuple[torch.Tensor, ...], getattr(self, "freqs"))  # noqa: B009 (untyped in WanModel)
        if any(f.device.type == "meta" for f in freqs):
            with torch.device("cpu"):
                freqs = precompute_freqs_cis_3d(self.dim // self.num_heads)
            self.freqs = freqs
        return freqs

    def rope_table(self, device: torch.device, activ_dtype: torch.dtype) -> RopeTable:
        half = activ_dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled(device.type)
        cdt = torch.float32 if half else torch.float64
        key = (str(device), cdt)
        if key not in self._rope_tables:
            self._rope_tables[key] = RopeTable(self.host_freqs(), device, cdt)
        return self._rope_tables[key]

    def encode_sem(
        self, sem_ids: torch.Tensor | None = None, sem_pooled: torch.Tensor | None = None, first_cell: int = 0
    ) -> torch.Tensor | None:
        if sem_ids is None and sem_pooled is None:
            return None
        return self.gc_sem_cond_module(
            sem_ids, pooled=sem_pooled, first_cell=first_cell, check=self.check_sem_ids
        )

    def embed_latents(
        self, latents: torch.Tensor, sem: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """Patch embedding (+ sem cond) -> tokens ``[B, f*h*w, dim]`` and the token grid."""
        if latents.ndim != 5:
            raise ValueError(f"latents must be [B, C, cells, H, W], got {tuple(latents.shape)}")
        if latents.shape[-2] % 2 or latents.shape[-1] % 2:
            raise ValueError(f"latent H, W = {tuple(latents.shape[-2:])} must be even (patch 2x2)")
        x = self.patchify(latents)
        if sem is not None:
            if sem.shape[0] != x.shape[0] or sem.shape[2:] != x.shape[2:]:
                raise ValueError(
                    f"sem cond {tuple(sem.shape)} does not match the patch grid {tuple(x.shape)} "
                    "(ids must cover the same cells at 16x the latent resolution)"
                )
            x = x + sem.to(x.dtype)
            if self.track_stats:
                with torch.no_grad():
                    self.last_stats = {
                        "sem_rms": sem.float().pow(2).mean().sqrt(),
                        "x_rms": x.float().pow(2).mean().sqrt(),
                    }
        f, h, w = x.shape[2:]
        return rearrange(x, "b c f h w -> b (f h w) c").contiguous(), (f, h, w)

    @staticmethod
    def cell_timesteps(timestep: Any, batch: int, num_cells: int, device: torch.device) -> torch.Tensor:
        """float32 ``[B, N]``: a scalar / ``[B]`` t is TI2V (cell 0 at 0, others t); ``[B, N]`` as given."""
        t = torch.as_tensor(timestep, dtype=torch.float32, device=device)
        if t.ndim == 2:
            if tuple(t.shape) != (batch, num_cells):
                raise ValueError(f"per-cell timestep {tuple(t.shape)} != (B, N) = {(batch, num_cells)}")
            return t
        t = t.reshape(-1)
        if t.numel() == 1:
            t = t.expand(batch)
        if t.numel() != batch:
            raise ValueError(f"timestep has {t.numel()} values for batch {batch}")
        cells = t[:, None].expand(batch, num_cells).clone()
        cells[:, 0] = 0.0
        return cells

    def embed_time(self, t_cells: torch.Tensor, tokens_per_group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-group timesteps ``[B, G]`` -> per-token t ``[B, L, dim]`` (for the head) and t_mod for
        ``block_forward``: ``[B, G, 6, dim]`` with ``per_cell_time`` (embedded once per group and
        broadcast in the blocks), else ``[B, L, 6, dim]`` (per token, as DiffSynth computes it)."""
        b, g = t_cells.shape
        wdt = self.time_embedding[0].weight.dtype
        if self.per_cell_time:
            emb = sinusoidal_embedding_1d(self.freq_dim, t_cells.flatten()).to(wdt).view(b, g, -1)
            t = self.time_embedding(emb)
            t_mod = self.time_projection(t).unflatten(2, (6, self.dim))
            return t.repeat_interleave(tokens_per_group, 1), t_mod
        tokens = t_cells.repeat_interleave(tokens_per_group, 1)
        emb = (
            sinusoidal_embedding_1d(self.freq_dim, tokens.flatten()).to(wdt).view(b, g * tokens_per_group, -1)
        )
        t = self.time_embedding(emb)
        return t, self.time_projection(t).unflatten(2, (6, self.dim))

    def prepare_text(
        self,
        context: torch.Tensor | TextContext,
        context_index: torch.Tensor | None = None,
        num_groups: int | None = None,
    ) -> TextContext:
        """Raw features or a TextContext -> a TextContext bound to this model's text embedding
        (call inside the forward; see ``TextContext`` for the layouts)."""
        text = (
            context
            if isinstance(context, TextContext)
            else TextContext.build(context, context_index, num_groups)
        )
        if num_groups is not None and text.num_groups not in (None, num_groups):
            raise ValueError(f"text covers {text.num_groups} cells, the latents {num_groups}")
        return text.bind(self.text_embedding)

    @staticmethod
    def per_cell_text(
        context: torch.Tensor | TextContext, context_index: torch.Tensor | None, num_cells: int
    ) -> Callable[[int], TextContext]:
        """cell -> that cell's TextContext (one bank and memo for all cells; no weights touched)."""
        text = context if isinstance(context, TextContext) else TextContext.build(context, context_index)
        index = text.index
        if index is None:
            return lambda cell: text
        if index.shape[1] < num_cells:
            raise ValueError(f"per-cell context covers {index.shape[1]} cells, rollout needs {num_cells}")
        return lambda cell: text.select(index[:, cell : cell + 1])

    def run_blocks(
        self,
        x: torch.Tensor,
        text: TextContext,
        t_mod: torch.Tensor,
        attn: Callable[..., torch.Tensor],
        use_gradient_checkpointing: bool = False,
        checkpoint_blocks: int | None = None,
    ) -> torch.Tensor:
        """All blocks; with checkpointing (and grad on) the first ``checkpoint_blocks`` (default all)
        blocks recompute their activations in backward."""
        ckpt = use_gradient_checkpointing and torch.is_grad_enabled()
        num_ckpt = len(self.blocks) if checkpoint_blocks is None else checkpoint_blocks
        for layer, block in enumerate(self.blocks):
            x = gradient_checkpoint_forward(
                block, ckpt and layer < num_ckpt, False, x, text, t_mod, attn, layer
            )
        return x

    def _full_attention(
        self,
        positions: torch.Tensor,
        grid: tuple[int, int, int],
        x: torch.Tensor,
        causal: CausalConfig | None,
        teacher_forcing: bool,
    ) -> FullSequenceAttention:
        f, h, w = grid
        if causal is not None:
            check_full_sequence(int(positions.max()), causal)
        cos, sin = self.rope_table(x.device, x.dtype).token_freqs(positions, h, w)
        if causal is None:
            dense = None
            if self.attn_backend == "fa4":
                from gc25d_core.models.fa4 import fa4_attention

                dense = fa4_attention
            return FullSequenceAttention(cos, sin, self.num_heads, dense=dense)
        gm = group_mask(f, causal, teacher_forcing, device=x.device)
        if self.attn_backend == "flex":
            return FullSequenceAttention(
                cos,
                sin,
                self.num_heads,
                block_mask=flex_block_mask(gm, h * w),
                flex_options=self.flex_options,
            )
        mask = gm.repeat_interleave(h * w, 0).repeat_interleave(h * w, 1)
        return FullSequenceAttention(cos, sin, self.num_heads, mask=mask)

    def _out(self, x: torch.Tensor, t: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        return self.unpatchify(self.head(x, t), grid)

    # -------------------------------------------------------------------------------- forwards

    def forward(
        self,
        latents: torch.Tensor,
        timestep: Any,
        context: torch.Tensor | TextContext,
        sem_ids: torch.Tensor | None = None,
        *,
        mode: Mode = "full",
        sem_pooled: torch.Tensor | None = None,
        context_index: torch.Tensor | None = None,
        causal: CausalConfig | None = None,
        cell_positions: torch.Tensor | None = None,
        use_gradient_checkpointing: bool = False,
        checkpoint_blocks: int | None = None,
        clean: torch.Tensor | None = None,
        return_clean: bool = False,
        cell: int | None = None,
        cache: KVCache | CellViews | None = None,
        commit: bool = False,
        return_output: bool = True,
        fold: Any = None,
    ) -> Any:
        """Velocity prediction; every mode enters here so FSDP/DeepSpeed wrappers see one forward.

        ``mode="full"``: ``latents`` [B, 48, N, H, W], bidirectional (``causal=None``) or block-causal.
        ``timestep``: scalar / [B] (TI2V: cell 0 at t=0) or per cell [B, N]. ``sem_ids``: raw ids
        [B, 1+4(N-1), 16H, 16W] (or ``sem_pooled``); None adds no condition. ``cell_positions``: RoPE
        time index per cell (default 0..N-1).
        ``mode="tf"``: teacher forcing, ``latents`` = the noisy copy, ``clean=`` the clean one (see
        ``forward_teacher_forcing``). ``mode="kv"``: one cell against a KV cache (see ``forward_kv``);
        with ``fold`` (a ``sampler.FoldedCommit`` of cell - 1) the previous cell's commit runs in the
        same forward (``_forward_fold``). ``mode="kv_cells"``: consecutive cells [B, 48, K, H, W],
        each against its own snapshot of a KV cache (``cache=`` a ``kv_cache.CellViews``; see
        ``_forward_kv_cells``).
        """
        if mode == "full":
            return self._forward_full(
                latents,
                timestep,
                context,
                sem_ids,
                sem_pooled,
                context_index,
                causal,
                cell_positions,
                use_gradient_checkpointing,
                checkpoint_blocks,
            )
        if mode == "tf":
            if clean is None:
                raise ValueError("mode='tf' needs clean=")
            return self._forward_tf(
                clean,
                latents,
                timestep,
                context,
                sem_ids,
                sem_pooled,
                context_index,
                FULL_CAUSAL if causal is None else causal,
                use_gradient_checkpointing,
                checkpoint_blocks,
                return_clean,
            )
        if mode == "kv_cells":
            if not isinstance(cache, CellViews):
                raise ValueError("mode='kv_cells' needs cache= a kv_cache.CellViews")
            return self._forward_kv_cells(
                latents, timestep, context, sem_ids, cache, use_gradient_checkpointing
            )
        if mode == "kv":
            if cell is None or cache is None or isinstance(cache, CellViews):
                raise ValueError("mode='kv' needs cell= and cache= a KV cache")
            if fold is not None:
                return self._forward_fold(latents, cell, timestep, context, sem_ids, cache, fold)
            return self._forward_kv(
                latents,
                cell,
                timestep,
                context,
                sem_ids,
                sem_pooled,
                cache,
                commit,
                return_output,
                use_gradient_checkpointing,
            )
        raise ValueError(f"mode={mode!r}: expected 'full', 'tf', 'kv' or 'kv_cells'")

    def forward_teacher_forcing(
        self,
        clean: torch.Tensor,
        noisy: torch.Tensor,
        timestep: Any,
        context: torch.Tensor | TextContext,
        sem_ids: torch.Tensor | None = None,
        *,
        causal: CausalConfig = FULL_CAUSAL,
        return_clean: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Teacher forcing over [clean | noisy] (same RoPE positions, clean copy at t=0): velocity of
        the noisy copy [B, 48, N, H, W] (and of the clean copy with ``return_clean``). ``timestep`` is
        the noisy copy's (scalar/[B] = TI2V, or [B, N]); its cell 0 should be the clean anchor at
        t=0 and is for the loss to mask. Under a wrapper call ``wrapper(noisy, ..., mode="tf", clean=)``.
        """
        return self(
            noisy,
            timestep,
            context,
            sem_ids,
            mode="tf",
            clean=clean,
            causal=causal,
            return_clean=return_clean,
            **kwargs,
        )

    def forward_kv(
        self,
        latent: torch.Tensor,
        cell: int,
        timestep: Any,
        text: torch.Tensor | TextContext,
        sem_ids: torch.Tensor | None,
        cache: KVCache,
        *,
        commit: bool,
        **kwargs: Any,
    ) -> torch.Tensor | None:
        """One cell ``[B, 48, 1, H, W]`` at ``timestep`` against ``cache``; ``commit`` stores its K/V.
        ``sem_ids``: the cell's frames (1 for cell 0, else 4). ``text``: the cell's context.
        Under a wrapper call ``wrapper(latent, t, text, sem_ids, mode="kv", cell=, cache=, commit=)``."""
        return self(
            latent, timestep, text, sem_ids, mode="kv", cell=cell, cache=cache, commit=commit, **kwargs
        )

    def _forward_full(
        self,
        latents,
        timestep,
        context,
        sem_ids,
        sem_pooled,
        context_index,
        causal,
        cell_positions,
        use_gradient_checkpointing,
        checkpoint_blocks,
    ) -> torch.Tensor:
        sem = self.encode_sem(sem_ids, sem_pooled, first_cell=0)
        x, grid = self.embed_latents(latents, sem)
        f, h, w = grid
        t, t_mod = self.embed_time(self.cell_timesteps(timestep, x.shape[0], f, x.device), h * w)
        text = self.prepare_text(context, context_index, num_groups=f)
        positions = torch.arange(f) if cell_positions is None else torch.as_tensor(cell_positions).long()
        if positions.numel() != f:
            raise ValueError(f"cell_positions has {positions.numel()} entries for {f} cells")
        attn = self._full_attention(positions, grid, x, causal, teacher_forcing=False)
        x = self.run_blocks(x, text, t_mod, attn, use_gradient_checkpointing, checkpoint_blocks)
        return self._out(x, t, grid)

    def _forward_tf(
        self,
        clean,
        noisy,
        timestep,
        context,
        sem_ids,
        sem_pooled,
        context_index,
        causal,
        use_gradient_checkpointing,
        checkpoint_blocks,
        return_clean,
    ) -> Any:
        if clean.shape != noisy.shape:
            raise ValueError(f"clean {tuple(clean.shape)} and noisy {tuple(noisy.shape)} differ")
        sem = self.encode_sem(sem_ids, sem_pooled, first_cell=0)
        xc, grid = self.embed_latents(clean, sem)
        xn, _ = self.embed_latents(noisy, sem)
        f, h, w = grid
        n_tok = f * h * w
        t_noisy = self.cell_timesteps(timestep, xc.shape[0], f, xc.device)
        t, t_mod = self.embed_time(torch.cat([torch.zeros_like(t_noisy), t_noisy], dim=1), h * w)
        text = self.prepare_text(context, context_index, num_groups=f).repeat_groups(2)
        positions = torch.arange(f).repeat(2)
        attn = self._full_attention(positions, grid, xc, causal, teacher_forcing=True)
        x = torch.cat([xc, xn], dim=1)
        x = self.run_blocks(x, text, t_mod, attn, use_gradient_checkpointing, checkpoint_blocks)
        out = self._out(x[:, n_tok:], t[:, n_tok:], grid)
        if return_clean:
            return out, self._out(x[:, :n_tok], t[:, :n_tok], grid)
        return out

    def new_kv_cache(
        self,
        spec: CausalConfig,
        latent_hw: tuple[int, int] | torch.Size,
        *,
        static: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """A KV cache for latent cells of ``latent_hw``; ``static``: the preallocated-buffer one
        (``kv_cache.StaticKVCache``, deploy / CUDA graphs) for activations of ``device``/``dtype``
        (default: the model's)."""
        lh, lw = int(latent_hw[0]), int(latent_hw[1])
        ph, pw = self.patch_size[1], self.patch_size[2]
        grid = (lh // ph, lw // pw)
        if not static:
            return KVCache(spec, len(self.blocks), grid, self.num_heads)
        p = next(self.parameters())
        rope = self.rope_table(torch.device(device or p.device), dtype or p.dtype)
        return StaticKVCache(spec, len(self.blocks), grid, self.num_heads, rope)

    @staticmethod
    def _kv_timestep(timestep: Any, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[B, 1]``: one cell's t (a scalar or one per sample) for the tokens ``x`` [B, ...]."""
        b = x.shape[0]
        t = torch.as_tensor(timestep, dtype=torch.float32, device=x.device).reshape(-1)
        return (t.expand(b) if t.numel() == 1 else t).reshape(b, 1)

    def _forward_kv(
        self, latent, cell, timestep, text, sem_ids, sem_pooled, cache, commit, return_output, checkpoint
    ) -> torch.Tensor | None:
        sem = self.encode_sem(sem_ids, sem_pooled, first_cell=cell)
        x, grid = self.embed_latents(latent, sem)
        f, h, w = grid
        if f != 1:
            raise ValueError(f"forward_kv takes one cell, got {f}")
        if (h, w) != cache.grid_hw:
            raise ValueError(f"token grid {(h, w)} != the cache's {cache.grid_hw}")
        t, t_mod = self.embed_time(self._kv_timestep(timestep, x), h * w)
        text = self.prepare_text(text)
        if text.num_groups not in (None, 1):
            raise ValueError(
                "forward_kv needs the cell's own context: use TextContext.select(index[:, i:i+1])"
            )
        rope = self.rope_table(x.device, x.dtype)
        # a grad forward with checkpointing: its blocks recompute in backward, after later cells
        # changed the cache, so its attention reads a record of the cells it saw (replayable)
        ckpt = checkpoint and torch.is_grad_enabled()
        cache.begin(cell)
        try:
            attn = KVStepAttention(cache, rope, commit, replayable=ckpt)
            x = self.run_blocks(x, text, t_mod, attn, ckpt)
        except BaseException:
            cache.end(commit=False)
            raise
        cache.end(commit)
        return self._out(x, t, grid) if return_output else None

    def _forward_kv_cells(
        self, latents, timestep, text, sem_ids, views: CellViews, checkpoint
    ) -> torch.Tensor:
        """K consecutive cells ``[B, 48, K, H, W]``, each at ``timestep`` (one value for every cell:
        no TI2V anchor here) against the snapshot of the cache its own KV forward saw: the
        velocities those K forwards give, from one pass of the linear layers (stage 3's exit
        forwards with grad). ``sem_ids``: the K cells' frames; ``text``: K groups (an index
        [B, K] into a bank)."""
        sem = self.encode_sem(sem_ids, None, first_cell=views.first_cell)
        x, grid = self.embed_latents(latents, sem)
        f, h, w = grid
        if f != len(views) or (h, w) != views.grid_hw:
            raise ValueError(f"cells {f} and token grid {(h, w)} != the views' {len(views)}, {views.grid_hw}")
        t_cells = self._kv_timestep(timestep, x).expand(x.shape[0], f)
        t, t_mod = self.embed_time(t_cells, h * w)
        text = self.prepare_text(text, num_groups=f)
        attn = views.attention(self.rope_table(x.device, x.dtype), self.num_heads)
        x = self.run_blocks(x, text, t_mod, attn, checkpoint and torch.is_grad_enabled())
        return self._out(x, t, grid)

    def kv_body(
        self,
        latent: torch.Tensor,
        timestep: torch.Tensor,
        text: TextContext,
        sem_ids: torch.Tensor | None,
        cache: KVCache,
        commit: bool,
        cell: int,
    ) -> torch.Tensor:
        """The blocks of a KV forward between ``cache.begin(cell)`` and ``cache.end`` (no host syncs,
        no host tensors: what a CUDA graph captures; ``timestep`` a device tensor [B])."""
        sem = self.encode_sem(sem_ids, None, first_cell=cell)
        x, grid = self.embed_latents(latent, sem)
        t, t_mod = self.embed_time(timestep.reshape(x.shape[0], 1), grid[1] * grid[2])
        text = self.prepare_text(text)
        rope = self.rope_table(x.device, x.dtype)
        x = self.run_blocks(x, text, t_mod, KVStepAttention(cache, rope, commit))
        return self._out(x, t, grid)

    def _forward_fold(self, latent, cell, timestep, text, sem_ids, cache, fold) -> torch.Tensor:
        """[clean cell k at t=0 | noisy cell k + 1 at ``timestep``] in one pass: the linear layers run
        once over both cells, the attention per group (``KVCache.attend_fold``); commits cell k and
        returns the velocity of cell k + 1 (what a commit forward then a kv forward give)."""
        if fold.cell != cell - 1:
            raise ValueError(f"a fold carries the previous cell: got cell {fold.cell} for {cell}")
        cache.begin_fold(fold.cell)
        try:
            out = self.kv_fold_body(latent, timestep, text, sem_ids, cache, fold)
        except BaseException:
            cache.end(commit=False)
            raise
        cache.end_fold()
        return out

    def kv_fold_body(self, latent, timestep, text, sem_ids, cache, fold) -> torch.Tensor:
        """The fold's pass between ``cache.begin_fold`` and ``cache.end_fold`` (no host syncs with
        ``timestep`` a device tensor and views of one text bank: what a CUDA graph captures)."""
        xa, grid = self.embed_latents(fold.x0, self.encode_sem(fold.sem_ids, None, first_cell=fold.cell))
        xb, grid_b = self.embed_latents(latent, self.encode_sem(sem_ids, None, first_cell=fold.cell + 1))
        f, h, w = grid
        if f != 1 or grid_b != grid:
            raise ValueError(f"a fold takes one cell each, got grids {grid} and {grid_b}")
        if (h, w) != cache.grid_hw:
            raise ValueError(f"token grid {(h, w)} != the cache's {cache.grid_hw}")
        t_cell = self._kv_timestep(timestep, xb)
        t, t_mod = self.embed_time(torch.cat([torch.zeros_like(t_cell), t_cell], dim=1), h * w)
        prev = fold.text if isinstance(fold.text, TextContext) else TextContext.build(fold.text)
        texts = self.prepare_text(
            prev.join(text if isinstance(text, TextContext) else TextContext.build(text))
        )
        if texts.num_groups not in (None, 2):
            raise ValueError("a fold needs each cell's own context (TextContext.select(index[:, i:i+1]))")
        rope = self.rope_table(xb.device, xb.dtype)
        n = h * w
        x = self.run_blocks(torch.cat([xa, xb], dim=1), texts, t_mod, KVFoldAttention(cache, rope))
        return self._out(x[:, n:], t[:, n:], grid)
