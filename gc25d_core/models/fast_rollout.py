"""The fast path of a trained generator's no-grad self-rollout (stage 3): the same causal sampler
(``sampler.CausalStreamer`` / ``denoise_cell``) run on a no-grad replica of the generator, against a
``StaticKVCache`` of the batch, with the KV forwards as CUDA graphs (``kv_graphs.GraphedKVForward``,
one per window fill level, captured on the first rollout and replayed from then on).

Why: a one-cell forward through a sharded training module is host-bound (≈ 45 ms of launches, FSDP
hooks and cache bookkeeping around ≈ 2 ms of GPU work at 10 blocks); a graph replays it in one launch.

What stays on the training module: the forwards that carry gradients (the generator update's exit
forwards, with their recomputation). ``RolloutRunner.streamer(slow=...)`` routes each forward by
``torch.is_grad_enabled()``: no-grad forwards (denoise steps before the exit, non-scored cells,
every commit) run on the replica; grad forwards on ``slow`` against a ``KVCache`` that mirrors every
commit of the static cache (the same K/V, kept per cell as the recomputation needs them).
``streamer(exits=ExitCapture(...))`` instead runs the whole rollout on the replica and keeps what the
scored cells' exit forwards took (latent, snapshot of the mirror); ``ExitCapture.forward`` then runs
those K forwards with grad on the training module as one forward over the K cells: a one-cell
forward through a training module is host-bound (FSDP hooks, autocast, ≈ 40 ops a block, and as
many again in the recomputation), so K of them cost K times the host work of one.

Same results: the replica holds the training forward's weights in the dtype that forward computes
in and runs under the same autocast (``ReplicaMode``); the static cache gives the KVCache's attention
(bit for bit on a CPU); each cell's text memo (its embedding and every block's cross K/V) is
recomputed per cell, as the training forward does, into fixed tensors that the graphs read.
On a CPU (CI) everything runs eagerly over the replica.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from gc25d_core.flow import axis_sigma, x0_at_sigma
from gc25d_core.models.configs import CausalConfig
from gc25d_core.models.kv_cache import CellSnapshot, CellViews, KVCache, StaticKVCache
from gc25d_core.models.kv_graphs import GraphedKVForward
from gc25d_core.models.sampler import CausalStreamer

if TYPE_CHECKING:
    from gc25d_core.models.gcdit import GcDiT, TextContext

__all__ = ["BatchStaticKVCache", "ExitCapture", "ReplicaMode", "RolloutRunner"]

_WRAP = "_fsdp_wrapped_module."


@dataclass(frozen=True)
class ReplicaMode:
    """How the training forward computes, so that the replica computes the same: its weights'
    ``dtype`` (FSDP's bf16 mixed precision: bf16; fp32 masters under autocast: fp32), ``autocast``
    (bf16 autocast around each forward), ``cast_inputs`` (FSDP's root casts float inputs to the
    weights' dtype) and ``fp32_out`` (accelerate converts the outputs to fp32)."""

    dtype: torch.dtype = torch.float32
    autocast: bool = False
    cast_inputs: bool = False
    fp32_out: bool = False

    @property
    def activ_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.autocast else self.dtype


class BatchStaticKVCache(StaticKVCache):
    """``StaticKVCache`` for a batch of streams (B rollouts, one per sample; the buffers take the
    batch of the first forward). ``mirror``: a ``KVCache`` that receives a copy of every committed
    cell's K/V (the grad forwards of a training module read it)."""

    mirror: KVCache | None = None

    def _alloc(self, layer: int, k: torch.Tensor) -> None:
        shape = (k.shape[0], (self.slots + 1) * self.tokens_per_cell, k.shape[2])
        self.k_raw[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.k_rot[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.v_buf[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)

    def end(self, commit: bool) -> None:
        if commit and self.mirror is not None and self._cell is not None:
            # the committed cell's slot, before ``end`` compacts the buffers for the next cell
            n, lo, cell, m = (
                self.tokens_per_cell,
                len(self.cells) * self.tokens_per_cell,
                self._cell,
                self.mirror,
            )
            pending = {}
            for layer in range(self.num_layers):
                k, v = self.k_raw[layer], self.v_buf[layer]
                assert k is not None and v is not None
                pending[layer] = (k[:, lo : lo + n].clone(), v[:, lo : lo + n].clone())
            m.begin(cell)
            m._pending = pending
            m.end(commit=True)
        super().end(commit)


class _MemoRope:
    """A ``RopeTable`` whose ``token_freqs`` keeps each (positions, grid) table it made: the table
    builds from a host index (a blocking copy, so a device sync), and a rollout's cells ask for the
    same few tables again and again (``StaticKVCache._set_freqs``, once per query cell)."""

    def __init__(self, rope: Any):
        self.rope = rope
        self.memo: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def token_freqs(self, time_pos: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (tuple(time_pos.tolist()), h, w)
        if key not in self.memo:
            self.memo[key] = self.rope.token_freqs(time_pos, h, w)
        return self.memo[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rope, name)


class _TextSlot:
    """One cell's text context for the replica, in fixed tensors: the raw bank ``[B, P, Lc, Dt]``
    (P padded to the batch: the distinct prompts of a batch are at most B), the index ``[B, 1]`` and
    the memo (text embedding, each block's cross K/V), refreshed in place per cell."""

    def __init__(self, model: GcDiT):
        self.model = model
        self.ctx: TextContext | None = None
        self.key: Any = None  # what the memo holds (the caller's prompt keys), None: unknown
        self._index: dict[tuple[Any, ...], torch.Tensor] = {}  # host index values -> device index

    def _memo(self, raw: torch.Tensor, index: torch.Tensor) -> dict[Any, Any]:
        from gc25d_core.models.gcdit import TextContext

        fresh = TextContext(raw, index)
        bound = fresh.bind(self.model.text_embedding)
        for block in self.model.blocks:
            bound.kv(block.cross_attn)
        return fresh._shared

    def _device_index(self, index: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The cell's index on the device: a host index (text.TextBank.context gives one) is looked
        up by its values, so a rollout copies each distinct index once, not once per cell (a
        pinned copy per cell costs a host allocation)."""
        if index.device.type != "cpu" or device.type == "cpu":
            return index.to(device).long()
        key = (tuple(index.shape), *index.flatten().tolist())
        if key not in self._index:
            self._index[key] = index.long().to(device)
        return self._index[key]

    @torch.no_grad()
    def load(self, raw: torch.Tensor, index: torch.Tensor, batch: int, key: Any = None) -> TextContext:
        """``key``: names the cell's prompts (equal keys: equal bank and index); a cell with the
        key the slot holds keeps its memo (the same weights give the same embedding and K/V)."""
        from gc25d_core.models.gcdit import TextContext

        if key is not None and key == self.key and self.ctx is not None:
            return self.ctx
        self.key = key
        index = self._device_index(index, raw.device)
        if raw.shape[1] < batch:  # rows no index points at: the shapes stay the batch's
            pad = raw.new_zeros(raw.shape[0], batch - raw.shape[1], *raw.shape[2:])
            raw = torch.cat([raw, pad], dim=1)
        ctx = self.ctx
        if ctx is None or ctx.raw.shape != raw.shape or ctx.index is None or ctx.index.shape != index.shape:
            ctx = self.ctx = TextContext(raw.clone(), index.clone())
            ctx._shared.update(self._memo(ctx.raw, index))
            return ctx
        assert ctx.index is not None
        ctx.raw.copy_(raw)
        ctx.index.copy_(index)
        for key, new in self._memo(ctx.raw, ctx.index).items():
            old = ctx._shared[key]
            pairs = zip(old, new, strict=True) if isinstance(old, tuple) else [(old, new)]
            for o, n in pairs:
                o.copy_(n)
        return ctx


@dataclass
class ExitCapture:
    """A rollout's exit forwards with grad, deferred: the scored ``cells`` (consecutive) exit at
    ``timestep``. While the replica runs every forward of the rollout without grad, ``take`` keeps
    each scored cell's latent at its exit forward and the snapshot of the mirror that forward saw
    (the cells it attends to, by reference). The replica's x0 of those cells is what the rollout
    commits; ``forward`` gives the x0 that carries the gradient (the same forward on the training
    module, all K cells at once): equal up to the rounding of the replica's kernels."""

    cells: range
    timestep: float
    latents: dict[int, torch.Tensor] = field(default_factory=dict)
    snapshots: dict[int, CellSnapshot] = field(default_factory=dict)
    mirror: KVCache | None = None

    def take(self, latent: torch.Tensor, timestep: Any, cell: Any, commit: bool) -> None:
        if commit or cell not in self.cells or timestep != self.timestep:
            return
        if self.mirror is None:
            raise RuntimeError("an exit capture needs the streamer's mirror cache (RolloutRunner.streamer)")
        self.latents[cell] = latent.detach()
        self.snapshots[cell] = self.mirror.snapshot(cell)

    def forward(
        self, slow: Callable[..., Any], text: Any, sem_ids: Any, checkpoint: bool = False
    ) -> torch.Tensor:
        """x0 ``[B, C, K, H, W]`` of the scored cells with grad through ``slow`` (the training
        forward, mode "kv_cells"). ``text``: the K cells' contexts (an index [B, K]); ``sem_ids``:
        their frames. ``checkpoint``: the blocks recompute in backward."""
        missing = [c for c in self.cells if c not in self.latents]
        if missing or self.mirror is None:
            raise RuntimeError(f"exit capture: the rollout did not reach the exits of cells {missing}")
        latents = torch.cat([self.latents[c] for c in self.cells], dim=2)
        views = CellViews(self.mirror.spec, self.mirror.grid_hw, [self.snapshots[c] for c in self.cells])
        v = slow(
            latents,
            self.timestep,
            text,
            sem_ids,
            mode="kv_cells",
            cache=views,
            use_gradient_checkpointing=checkpoint,
        )
        return x0_at_sigma(latents, v, axis_sigma(self.timestep))


class _Route:
    """The forward a rollout's streamer calls: no-grad forwards on the replica (graphs where they
    apply) against the static cache, grad forwards on ``slow`` against the cache's mirror;
    ``exits``: the scored cells' exit forwards are kept for ``ExitCapture.forward``."""

    def __init__(
        self,
        runner: RolloutRunner,
        slow: Callable[..., Any] | None,
        mirror: KVCache | None,
        exits: ExitCapture | None = None,
    ):
        self.runner, self.slow, self.mirror, self.exits = runner, slow, mirror, exits

    def __call__(
        self, latent: torch.Tensor, timestep: Any, text: TextContext, sem_ids: Any = None, **kw: Any
    ):
        if torch.is_grad_enabled():
            from gc25d_core.models.gcdit import TextContext

            if self.slow is None or self.mirror is None:
                raise RuntimeError("a grad forward in a rollout started without a training forward (slow=)")
            assert text.index is not None
            # its own copy: the slot is rewritten by the next cell, before this forward's backward
            own = TextContext(text.raw.clone(), text.index.clone())
            return self.slow(latent, timestep, own, sem_ids, **{**kw, "cache": self.mirror})
        if self.exits is not None:
            self.exits.take(latent, timestep, kw.get("cell"), bool(kw.get("commit")))
        return self.runner.replica_forward(latent, timestep, text, sem_ids, **kw)


@dataclass
class _Lane:
    """What the rollouts of one batch size reuse: the static cache, the graphs and the text slot.
    The graphs read the cache's and the slot's tensors, so each batch size keeps its own (stage 3
    alternates the critic updates' batched rollout and the generator's)."""

    text: _TextSlot
    graphs: GraphedKVForward | None
    cache: BatchStaticKVCache | None = None


class RolloutRunner:
    """A no-grad replica of a generator and the state its fast rollouts reuse (per batch size: static
    cache, graphs, text slot). ``load`` copies the generator's current weights in place (the graphs
    keep pointing at them); ``streamer`` gives a ``CausalStreamer`` over it for one rollout. Derived
    state: rebuilt from the generator, never saved."""

    def __init__(
        self,
        template: GcDiT,
        mode: ReplicaMode,
        device: torch.device,
        graphs: bool = True,
        compile: bool = False,
        compile_rope: bool = False,
    ):
        from gc25d_core.models.gcdit import GcDiT

        with torch.device("meta"):
            replica = GcDiT(template.gc_config)
        replica = replica.to_empty(device=device).to(mode.dtype)
        replica.requires_grad_(False).eval()
        replica.check_sem_ids = template.check_sem_ids
        replica.track_stats = False
        if compile:
            # the block bodies' elementwise work fused (the GPU's largest share of a rollout forward
            # at one cell's tokens); the KV attention stays eager, so one compiled body serves every
            # window fill level. Not bit-identical to the training forward: within bf16 rounding.
            replica.enable_compile(eager_attention=True)
        self.compiled = compile
        # the eager KV attention's RoPE rotations compiled (StaticKVCache.compile_query_rotation)
        self.compile_rope = compile and compile_rope
        self.model, self.mode, self.device = replica, mode, device
        self.use_graphs = graphs and device.type == "cuda"
        if self.use_graphs:
            # the vocab check of the ids syncs the device, which a capture cannot hold (training
            # checks the ids on the host: train.model.build_model turns it off on the generator too)
            replica.check_sem_ids = False
        self.lanes: dict[int, _Lane] = {}
        self.lane: _Lane | None = None  # the last rollout's
        self.version: Any = None  # what the caller says the weights are (e.g. the optimizer step)
        self._timesteps: dict[tuple[float, int], torch.Tensor] = {}

    @torch.no_grad()
    def load(self, named: Iterable[tuple[str, torch.Tensor]], version: Any = None) -> None:
        """Copy the generator's full weights (names as the template's, FSDP wrappers stripped)."""
        own = dict(self.model.named_parameters())
        seen = set()
        for name, value in named:
            name = name.replace(_WRAP, "")
            if name not in own:
                raise KeyError(f"rollout replica: the generator's parameter {name} is not the replica's")
            own[name].copy_(value)
            seen.add(name)
        if seen != set(own):
            raise KeyError(f"rollout replica: no weights for {sorted(set(own) - seen)[:5]}")
        self.version = version
        for lane in self.lanes.values():
            lane.text.key = None  # new weights: every memo is recomputed

    def _lane(self, batch: int) -> _Lane:
        if batch not in self.lanes:
            graphs = GraphedKVForward(self.model) if self.use_graphs else None
            self.lanes[batch] = _Lane(_TextSlot(self.model), graphs)
        return self.lanes[batch]

    @property
    def cache(self) -> BatchStaticKVCache | None:
        return None if self.lane is None else self.lane.cache

    @property
    def graphs(self) -> GraphedKVForward | None:
        return None if self.lane is None else self.lane.graphs

    @property
    def graphs_disabled(self) -> str | None:
        """Why a lane's graphs are off (a capture failure), if one is."""
        for lane in self.lanes.values():
            if lane.graphs is not None and lane.graphs.disabled:
                return lane.graphs.disabled
        return None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.mode.autocast)

    def replica_forward(self, latent: torch.Tensor, timestep: Any, text: Any, sem_ids: Any = None, **kw: Any):
        if self.mode.cast_inputs and latent.is_floating_point():
            latent = latent.to(self.mode.dtype)
        if latent.is_cuda and isinstance(timestep, float):  # a device tensor: no host copy per forward
            key = (timestep, latent.shape[0])
            if key not in self._timesteps:
                self._timesteps[key] = torch.full((latent.shape[0],), timestep, device=latent.device)
            timestep = self._timesteps[key]
        graphs = self._lane(int(latent.shape[0])).graphs
        fwd = graphs if graphs is not None else self.model
        with self._autocast():
            out = fwd(latent, timestep, text, sem_ids, **kw)
        return out.float() if out is not None and self.mode.fp32_out else out

    def cell_text(self, raw: torch.Tensor, index: torch.Tensor, key: Any = None) -> TextContext:
        """The cell's text context (``text.TextBank.context`` output: bank + index). ``key``: what
        names the cell's prompts (a cell with the previous cell's key reuses its memo)."""
        batch = int(index.shape[0])
        with self._autocast():
            return self._lane(batch).text.load(raw, index, batch=batch, key=key)

    def streamer(
        self,
        spec: CausalConfig,
        timesteps: Sequence[float],
        anchor: torch.Tensor,
        slow: Callable[..., Any] | None = None,
        checkpoint: bool = False,
        exits: ExitCapture | None = None,
    ) -> CausalStreamer:
        """A streamer for one rollout from ``anchor`` [B, C, 1, H, W] (its prefill is ``start``'s).
        ``slow``: the training forward that runs the grad forwards (a generator update's exits);
        ``exits``: keep the scored cells' exit forwards for one grad forward later (no ``slow``)."""
        if slow is not None and exits is not None:
            raise ValueError("the exit forwards run either per cell (slow=) or deferred (exits=)")
        hw = tuple(int(s) for s in anchor.shape[-2:])
        key = (hw, anchor.device, anchor.dtype)
        lane = self.lane = self._lane(int(anchor.shape[0]))
        c = lane.cache
        if c is None or c.grid_key != key or c.spec != spec:
            m = self.model
            grid = (hw[0] // m.patch_size[1], hw[1] // m.patch_size[2])
            rope = _MemoRope(m.rope_table(anchor.device, self.mode.activ_dtype))
            c = lane.cache = BatchStaticKVCache(spec, len(m.blocks), grid, m.num_heads, cast(Any, rope))
            c.grid_key = key
            if self.compile_rope:
                c.compile_query_rotation()
            if lane.graphs is not None:
                lane.graphs.reset()
        c.mirror = None if slow is None and exits is None else self.model.new_kv_cache(spec, hw)
        if exits is not None:
            exits.mirror = c.mirror
        s = CausalStreamer(
            self.model,
            spec,
            timesteps,
            forward=_Route(self, slow, c.mirror, exits),
            static_kv=True,
            checkpoint=checkpoint,
        )
        s.cache = c
        return s

    def start(self, streamer: CausalStreamer, anchor: torch.Tensor, text: TextContext, sem_ids: Any) -> None:
        """``streamer.start`` under the replica's autocast (the prefill is a replica forward)."""
        with self._autocast():
            streamer.start(anchor, text, sem_ids)
