"""The one causal sampler: training (stage 3), eval and deploy roll cells out through it.

Rollout (deploy and the stage-3 self-rollout): prefill cell 0 at t=0; per cell, ``len(timesteps)``
denoise forwards (x0 = x - sigma*v, re-noise to the next sigma with fresh noise), then a commit
forward of x0 at t=0 writes the cell's K/V (no noisy-step K/V are ever cached; the cache is
written under no_grad). ``sigma = t / 1000`` (flow.axis_sigma); the timestep axis itself comes from the flow module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from gc25d_core.flow import axis_sigma, noise_at_sigma, x0_at_sigma
from gc25d_core.models.configs import CausalConfig
from gc25d_core.models.kv_cache import CellAttention, KVCache, StaticKVCache

if TYPE_CHECKING:
    from gc25d_core.models.gcdit import GcDiT, TextContext


def _noise_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)


class RowGroups(NamedTuple):
    """Rollouts batched along the rows (no grad): group g, rows ``g·n .. (g+1)·n``, draws its noise
    from ``generators[g]`` and exits at ``exits[g]`` — exactly the draws it would make rolled out
    alone with that generator and exit step, in the same order (a group past its exit draws none)."""

    generators: Sequence[torch.Generator]
    exits: Sequence[int]

    def rows(self, x: torch.Tensor, g: int) -> slice:
        n = x.shape[0] // len(self.generators)
        return slice(g * n, (g + 1) * n)

    def noise(self, like: torch.Tensor, active: Sequence[bool] | None = None) -> torch.Tensor:
        """Fresh normal noise shaped ``like``: each active group's rows from its generator, zeros
        for the others."""
        if like.shape[0] % len(self.generators):
            raise ValueError(f"{like.shape[0]} rows do not split into {len(self.generators)} groups")
        n = like.shape[0] // len(self.generators)
        parts = [
            torch.randn((n, *like.shape[1:]), generator=gen, device=like.device, dtype=like.dtype)
            if active is None or active[g]
            else like.new_zeros((n, *like.shape[1:]))
            for g, gen in enumerate(self.generators)
        ]
        return torch.cat(parts)


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
    groups: RowGroups | None = None,
) -> torch.Tensor:
    """Denoise one cell against the cache and commit it; returns x0 ``[B, C, 1, H, W]``.

    Steps k < ``exit_step`` (default: the last) run under no_grad; the exit step runs with grad
    iff ``grad`` (``checkpoint``: its blocks recompute their activations in backward). Re-noising
    uses ``noise[k]`` or fresh normal noise from ``generator``. The commit forward of x0.detach()
    at t=0 always runs under no_grad. ``record`` (tests) receives one dict
    per forward: cell, step (int or "commit"), x, t, v.

    ``groups`` (no grad): several rollouts in one batch, each with its own generator and exit step
    (``RowGroups``); every group takes its x0 at its own exit, the batch runs to the latest.

    Deploy's folded commit: ``commit=False`` leaves this cell's commit to the next cell, whose first
    forward takes it as ``fold`` (the previous cell's clean x0, text and ids) and runs
    [clean k | noisy k + 1] in one forward (same K/V and output as the separate commit; tests).
    """
    if fold is not None and (grad or fold.cell != cell - 1):
        raise ValueError(f"a folded commit needs grad off and the previous cell (got {fold.cell} for {cell})")
    num_steps = len(timesteps)
    if groups is not None:
        if grad or fold is not None or exit_step is not None or generator is not None or noise is not None:
            raise ValueError("row groups carry their own generators and exits (no grad, no fold)")
        if not all(0 <= e < num_steps for e in groups.exits):
            raise ValueError(f"exits {list(groups.exits)} outside 0..{num_steps - 1}")
    exit_k = max(groups.exits) if groups is not None else num_steps - 1 if exit_step is None else exit_step
    if not 0 <= exit_k < num_steps:
        raise ValueError(f"exit_step={exit_step} outside 0..{num_steps - 1}")
    x = x_init
    x0 = x
    taken = torch.empty_like(x_init) if groups is not None else None  # each group's x0 at its exit
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
        if groups is not None:
            assert taken is not None
            for g, e in enumerate(groups.exits):
                if e == k:
                    taken[groups.rows(x0, g)] = x0[groups.rows(x0, g)]
        if k < exit_k:
            if groups is not None:
                eps = groups.noise(x, [k < e for e in groups.exits])
            else:
                eps = noise[k] if noise is not None else _noise_like(x, generator)
            x = noise_at_sigma(x0, eps, axis_sigma(timesteps[k + 1])).detach()
    if taken is not None:
        x0 = taken
    if not commit:
        return x0
    v_commit = commit_cell(model, cache, cell, x0, text, sem_ids, return_output=record is not None)
    if record is not None:
        record.append({"cell": cell, "step": "commit", "x": x0.detach(), "t": 0.0, "v": v_commit})
    return x0


@torch.no_grad()
def commit_cell(
    model: Callable[..., Any],
    cache: KVCache,
    cell: int,
    x0: torch.Tensor,
    text: TextContext,
    sem_ids: torch.Tensor | None,
    return_output: bool = False,
) -> torch.Tensor | None:
    """The commit forward: the cell's clean x0 at t=0 writes its K/V into the cache (no grad)."""
    return model(
        x0.detach(),
        0.0,
        text,
        sem_ids,
        mode="kv",
        cell=cell,
        cache=cache,
        commit=True,
        return_output=return_output,
    )


class FoldedCommit(NamedTuple):
    """A cell denoised but not committed yet: its commit rides on the next cell's first forward
    (folded), or runs on its own later (``CausalStreamer.commit``, deferred)."""

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
        defer_commit: bool = False,
        static_attention: CellAttention | None = None,
    ):
        """``forward``: what runs the model's forwards (a training engine's wrapper: FSDP gathers
        its shards there); default the model itself. The cache is always the model's.
        ``checkpoint`` (training): grad forwards recompute their blocks in backward.
        ``fold_commit`` (deploy, no grad): each cell's commit runs inside the next cell's first
        forward (4 forwards per cell instead of 5); the last cell's commit stays pending.
        ``static_kv`` (deploy, no grad, batch 1): the preallocated ``StaticKVCache`` (same results;
        what ``GraphedKVForward`` replays against, the fold included).
        ``defer_commit`` (deploy, no grad): ``step`` returns the cell denoised and leaves its commit
        forward to ``commit()`` — the runtime calls it after the cell's decode, so the frames are
        not held behind it and the host's next world step overlaps it on the device — or to the
        next ``step``, which runs a pending commit first. The same forwards on the same inputs in
        the same order on the cache: the same latents as committing at once.
        ``static_attention`` (with ``static_kv``): the static cache's attention kernel in place of
        SDPA (``StaticKVCache.attn_fn``; deploy's FlashAttention-4), set when the cache is made."""
        if fold_commit and defer_commit:
            raise ValueError("fold_commit and defer_commit do not combine (the commit goes one way)")
        self.model, self.spec, self.timesteps = model, spec, tuple(float(t) for t in timesteps)
        self.forward = model if forward is None else forward
        self.fold_commit = fold_commit
        self.static_kv = static_kv
        self.checkpoint = checkpoint
        self.defer_commit = defer_commit
        if static_attention is not None and not static_kv:
            raise ValueError("static_attention is the static cache's kernel (static_kv)")
        self.static_attention = static_attention
        self.cache: KVCache | None = None
        self.next_cell = 0
        self.pending: FoldedCommit | None = None
        self.deferred: FoldedCommit | None = None

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
                if self.static_attention is not None:
                    c.attn_fn = self.static_attention
            self.cache = c
        else:
            self.cache = self.model.new_kv_cache(self.spec, anchor.shape[-2:])
        self.forward(
            anchor, 0.0, text, sem_ids, mode="kv", cell=0, cache=self.cache, commit=True, return_output=False
        )
        self._cell_like = anchor
        self.next_cell = 1
        self.pending = None
        self.deferred = None

    def commit(self) -> None:
        """Run the deferred commit of the last cell stepped, if one is pending (``defer_commit``)."""
        p, self.deferred = self.deferred, None
        if p is not None:
            assert self.cache is not None
            commit_cell(self.forward, self.cache, p.cell, p.x0, p.text, p.sem_ids)

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
        self.commit()  # a deferred commit not run yet comes first: the cache must hold its cell
        if x_init is None:
            groups = kwargs.get("groups")
            x_init = (
                _noise_like(self._cell_like, generator) if groups is None else groups.noise(self._cell_like)
            )
        if self.fold_commit:
            kwargs.update(commit=False, fold=self.pending)
        elif self.defer_commit:
            kwargs.update(commit=False)
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
        elif self.defer_commit:
            self.deferred = FoldedCommit(self.next_cell, x0.detach(), text, sem_ids)
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
    groups: RowGroups | None = None,
) -> torch.Tensor:
    """Generate cells 1..num_cells-1 after the clean ``anchor`` [B, C, 1, H, W]; returns
    ``[B, C, num_cells, H, W]`` (cell 0 = anchor). ``context``: shared [B, Lc, Dt], per cell
    [B, N, Lc, Dt], or a bank [B, P, Lc, Dt] with ``context_index`` [B, N]. ``sem_ids``: the clip's
    raw ids [B, 1 + 4(N-1), H*16, W*16]. ``groups`` instead of ``generator``: row groups that each
    draw their noise as they would alone (``RowGroups``)."""
    from gc25d_core.models.sem_cond import cell_frame_slice

    streamer = CausalStreamer(model, spec, timesteps)

    def sem(cell: int) -> torch.Tensor | None:
        return None if sem_ids is None else sem_ids[:, cell_frame_slice(cell)]

    texts = model.per_cell_text(context, context_index, num_cells)
    streamer.start(anchor, texts(0), sem(0))
    cells = [anchor]
    for cell in range(1, num_cells):
        how: dict[str, Any] = {"generator": generator} if groups is None else {"groups": groups}
        cells.append(streamer.step(texts(cell), sem(cell), record=record, **how))
    return torch.cat(cells, dim=2)
