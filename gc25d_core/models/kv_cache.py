"""The KV cache of the causal rollout (``models.causal``'s rule applied to committed cells) and the
attention plans of a KV forward.

``KVCache`` keeps each committed cell's K / V as its own tensors (the stage-3 rollout's recomputed
exit forwards hold references to what a forward saw); ``StaticKVCache`` keeps them in preallocated
buffers in cell order (deploy, CUDA graphs: ``models.kv_graphs``). Both give the same attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from gc25d_core.models.causal import (
    RopeTable,
    apply_rope,
    query_time_position,
    rope_time_positions,
    sdpa,
    visible,
)
from gc25d_core.models.configs import CausalConfig

if TYPE_CHECKING:
    pass


def query_freqs(
    rope: RopeTable, cell: int, spec: CausalConfig, grid_hw: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables of query ``cell``'s tokens in a KV forward (its capped time position)."""
    return rope.token_freqs(torch.tensor([query_time_position(cell, spec)]), *grid_hw)


def key_freqs(
    rope: RopeTable,
    cells: list[int] | tuple[int, ...],
    q_cell: int,
    spec: CausalConfig,
    grid_hw: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables of the cached ``cells``' keys as query ``q_cell`` sees them (sink cells keep
    their positions, window cells shift past the cap)."""
    return rope.token_freqs(rope_time_positions(torch.tensor(cells), q_cell, spec), *grid_hw)


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
            if which == "q":
                self._freqs[which] = query_freqs(rope, self._cell, self.spec, self.grid_hw)
            else:
                self._freqs[which] = key_freqs(rope, self.cells, self._cell, self.spec, self.grid_hw)
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

    def snapshot(self, cell: int) -> CellSnapshot:
        """What a forward of query ``cell`` sees, every layer, by reference (no copies): the cells it
        may attend to after its eviction and their K / V. Later commits and evictions leave it as
        it is (a cell's tensors are never rewritten), so a forward over it can run any time later."""
        if type(self) is not KVCache:
            raise TypeError("a snapshot needs the per-cell KVCache (the static cache rewrites its buffers)")
        if self.cells and cell <= self.cells[-1]:
            raise ValueError(f"query cell {cell} must come after the cached cells {self.cells}")
        self.evict_for(cell)
        return CellSnapshot(
            cell, tuple(self.cells), tuple(tuple(k) for k in self.k), tuple(tuple(v) for v in self.v)
        )

    # -- the folded commit (deploy): one forward commits cell k and runs cell k + 1's first step

    def begin_fold(self, cell: int) -> None:
        """Start a forward whose first ``tokens_per_cell`` tokens are ``cell`` clean at t=0 (committed
        at ``end_fold``) and whose other tokens are ``cell + 1`` (not committed). Each group sees
        exactly what its own forward would: ``cell`` the cache as it is, ``cell + 1`` the cache after
        the commit (evicted for it, with ``cell`` itself), each rotated for its own query cell."""
        self.begin(cell)
        kept = self._fold_kept(cell)
        self._fold = {"cells": kept, "slots": [self.cells.index(c) for c in kept[:-1]], "rot": {}}

    def _fold_kept(self, cell: int) -> list[int]:
        """The cells ``cell + 1`` sees once ``cell`` is committed (``cell`` last)."""
        after = [*self.cells, cell]
        keep = visible(cell + 1, torch.tensor(after), self.spec).tolist()
        kept = [c for c, k in zip(after, keep, strict=True) if k]
        if kept[-1] != cell:
            raise RuntimeError(
                f"cell {cell + 1} cannot see cell {cell}: the window must be at least 2 to fold"
            )
        return kept

    def _fold_freqs(self, rope: RopeTable) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        fold = self._fold
        if "freqs" not in fold:
            assert self._cell is not None
            nxt = self._cell + 1
            q = query_freqs(rope, nxt, self.spec, self.grid_hw)
            kv = key_freqs(rope, fold["cells"], nxt, self.spec, self.grid_hw)
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

    def _check_commit(self, cell: int | None) -> int:
        """The committed cell: a commit must follow a forward that gave every layer's K/V."""
        if cell is None or len(self._pending) != self.num_layers:
            raise RuntimeError(f"commit of cell {cell} saw {len(self._pending)}/{self.num_layers} layers")
        return cell

    def end(self, commit: bool) -> None:
        """Finish the forward; a commit appends this cell's K/V and evicts for the next cell."""
        cell = self._cell
        if commit:
            cell = self._check_commit(cell)
            for layer, (k, v) in sorted(self._pending.items()):
                self.k[layer].append(k)
                self.v[layer].append(v)
            self.cells.append(cell)
            self._pending.clear()
            self._invalidate()
            self.evict_for(cell + 1)
        self._pending.clear()


# an attention kernel of [B, L, H*D] q, k, v and the head count (``sdpa``, ``models.fa4.fa4_attention``)
CellAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def rotate_query_cell(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The query cell's q and new k rotated for it (``apply_rope`` on each): one function so that a
    compile fuses both into few kernels (``StaticKVCache.compile_query_rotation``)."""
    return apply_rope(q, cos, sin, num_heads), apply_rope(k, cos, sin, num_heads)


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
    The folded commit works on the buffers in place (``begin_fold``). No grad (deploy)."""

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
        # the folded commit's tables of cell k + 1 (query, kept cells): ``begin_fold``
        self.cos_qn: torch.Tensor | None = None
        self.sin_qn: torch.Tensor | None = None
        self.cos_kn: torch.Tensor | None = None
        self.sin_kn: torch.Tensor | None = None
        self._rotated_for: int | None = None
        self._gather: dict[tuple[int, ...], torch.Tensor] = {}
        self._tables: tuple[int, tuple[int, ...]] | None = None
        self.rotate_fn: Callable[..., torch.Tensor] = apply_rope  # the full window's key rotation
        self.rotate_part_fn: Callable[..., torch.Tensor] = apply_rope  # a filling window's
        self.query_rotate_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rotate_query_cell
        # the attention of a query cell over the buffers ([B, L, H*D] q, k, v, heads): PyTorch SDPA,
        # or FlashAttention-4 (``models.fa4.fa4_attention``, the deploy's ``kv_attention='fa4'``)
        self.attn_fn: CellAttention = sdpa
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

    def compile_query_rotation(self) -> None:
        """GPU speed: each block's rotation of the query cell's q and k (``attend``, eager beside the
        compiled block bodies, so that one body serves every fill level) as one compiled function:
        its shapes are the query cell's at every fill level, so it compiles once a batch size. Eager,
        it is a score of small elementwise kernels a block and a forward (the bulk of a stage-3
        rollout's unfused GPU work: docs/benchmarks/2026-12-07_stage3-profile_h100.md). With it the
        cached keys' rotation for a new query cell, at every fill level (a rollout of 21-27 cells
        spends most of its cells filling the window): one compile whose token count is symbolic,
        where a compile per fill level would pass dynamo's recompile limit; the full window's too,
        unless ``compile_rotation`` gave it its own kernel. The same arithmetic up to the
        compiler's rounding."""
        self.query_rotate_fn = torch.compile(rotate_query_cell, dynamic=False)
        self.rotate_part_fn = torch.compile(apply_rope, dynamic=True)
        if self.rotate_fn is apply_rope:
            self.rotate_fn = self.rotate_part_fn

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
                    if buf is not None:
                        buf[:, : len(slots) * n].copy_(buf.index_select(1, self._gather_index(slots, buf)))
        self.cells = keep
        self._rotated_for = None

    def _gather_index(self, slots: tuple[int, ...], buf: torch.Tensor) -> torch.Tensor:
        """The token index of ``slots`` in cell order (the eviction's compaction), kept per slots."""
        if slots not in self._gather:
            n = self.tokens_per_cell
            idx = torch.cat([torch.arange(s * n, (s + 1) * n) for s in slots])
            self._gather[slots] = idx.to(buf.device)
        return self._gather[slots]

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
        fn = self.rotate_fn if m == self.slots * self.tokens_per_cell else self.rotate_part_fn
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
        qr, kr = self.query_rotate_fn(q, k, self.cos_q, self.sin_q, h)
        k_rot[:, lo : lo + n].copy_(kr)
        v_buf[:, lo : lo + n].copy_(v)
        if commit:
            k_raw[:, lo : lo + n].copy_(k)
            self._pending[layer] = (k_raw, v_buf)
        return self.attn_fn(qr, k_rot[:, : lo + n], v_buf[:, : lo + n], h)

    # -- the folded commit on the buffers (deploy; a CUDA graph per fill level: models.kv_graphs)

    def begin_fold(self, cell: int, rotate: bool = True) -> None:
        """``KVCache.begin_fold`` on the buffers: the cache as it is for ``cell`` (rotated for it),
        and the plan of cell + 1's group — the slots it keeps after the commit and their RoPE
        tables for it, in static buffers (``cos_qn`` / ``sin_qn`` / ``cos_kn`` / ``sin_kn``)."""
        self.begin(cell, rotate=rotate)
        nxt = cell + 1
        kept = self._fold_kept(cell)
        after = [*self.cells, cell]
        self._fold = {"cells": kept, "slots": tuple(after.index(c) for c in kept)}
        cos_q, sin_q = query_freqs(self.rope, nxt, self.spec, self.grid_hw)
        cos_k, sin_k = key_freqs(self.rope, kept, nxt, self.spec, self.grid_hw)
        if self.cos_qn is None or self.sin_qn is None or self.cos_kn is None or self.sin_kn is None:
            full = ((self.slots + 1) * self.tokens_per_cell, cos_k.shape[1])
            self.cos_qn, self.sin_qn = cos_q.clone(), sin_q.clone()
            self.cos_kn = torch.zeros(full, dtype=cos_k.dtype, device=cos_k.device)
            self.sin_kn = torch.zeros(full, dtype=sin_k.dtype, device=sin_k.device)
        self.cos_qn.copy_(cos_q)
        self.sin_qn.copy_(sin_q)
        self.cos_kn[: cos_k.shape[0]].copy_(cos_k)
        self.sin_kn[: sin_k.shape[0]].copy_(sin_k)

    @torch.compiler.disable
    def attend_fold(self, layer: int, q, k, v, rope: RopeTable) -> torch.Tensor:
        """Cell k's group commits as its own commit forward would (slot ``len(cells)``); then the
        buffers become what cell k + 1's forwards find after that commit — the kept slots
        compacted in cell order (the eviction's gather), their keys rotated for k + 1 into
        ``k_rot`` (the rotation its next forwards then skip) — and cell k + 1's group attends
        there, as its first forward would. In place: a graph of it replays once per fold."""
        n, h = self.tokens_per_cell, self.num_heads
        out_a = self.attend(layer, q[:, :n], k[:, :n], v[:, :n], rope, commit=True)
        k_raw, k_rot, v_buf = self.k_raw[layer], self.k_rot[layer], self.v_buf[layer]
        assert k_raw is not None and k_rot is not None and v_buf is not None
        assert self.cos_qn is not None and self.sin_qn is not None
        assert self.cos_kn is not None and self.sin_kn is not None
        slots: tuple[int, ...] = self._fold["slots"]
        lo = len(slots) * n
        if slots != tuple(range(len(slots))):
            for buf in (k_raw, v_buf):
                buf[:, :lo].copy_(buf.index_select(1, self._gather_index(slots, buf)))
        fn = self.rotate_fn if lo == self.slots * n else self.rotate_part_fn
        k_rot[:, :lo].copy_(fn(k_raw[:, :lo], self.cos_kn[:lo], self.sin_kn[:lo], h))
        qb, kb = self.query_rotate_fn(q[:, n:], k[:, n:], self.cos_qn, self.sin_qn, h)
        k_rot[:, lo : lo + n].copy_(kb)
        v_buf[:, lo : lo + n].copy_(v[:, n:])
        out_b = self.attn_fn(qb, k_rot[:, : lo + n], v_buf[:, : lo + n], h)
        return torch.cat([out_a, out_b], dim=1)

    def end_fold(self) -> None:
        """Cell k committed (its slot compacted in by ``attend_fold``); the cache is cell k + 1's,
        its keys already rotated for it."""
        fold, cell = self._fold, self._cell
        if cell is None or len(self._pending) != self.num_layers:
            raise RuntimeError(
                f"folded commit of cell {cell} saw {len(self._pending)}/{self.num_layers} layers"
            )
        self._pending.clear()
        self.cells = list(fold["cells"])
        self._cell = self._rotated_for = cell + 1
        self._set_freqs(cell + 1)
        self._fold = {}

    def end(self, commit: bool) -> None:
        """Finish the forward; a commit keeps the cell's slot and evicts for the next cell."""
        cell = self._cell
        if commit:
            cell = self._check_commit(cell)
            self.cells.append(cell)
            self._pending.clear()
            self.evict_for(cell + 1)
            self._cell = None
        self._pending.clear()


class KVLayerView(NamedTuple):
    """One layer's attention inputs from the cache for one query cell: the query's and the cached
    keys' RoPE tables and the cached cells' raw K and V (references to the cache's tensors)."""

    q_freqs: tuple[torch.Tensor, torch.Tensor]
    kv_freqs: tuple[torch.Tensor, torch.Tensor] | None
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]


class CellSnapshot(NamedTuple):
    """``KVCache.snapshot``: the cached cells query ``cell`` sees and their K / V per layer."""

    cell: int
    cells: tuple[int, ...]
    k: tuple[tuple[torch.Tensor, ...], ...]  # [layer][cached cell]
    v: tuple[tuple[torch.Tensor, ...], ...]


class CellViews:
    """The ``cache`` of a forward over several consecutive query cells at once (``GcDiT`` mode
    ``"kv_cells"``; stage 3's exit forwards with grad as one forward): each cell's snapshot, taken
    when the rollout reached it. One forward of K cells gives what K replayable KV forwards give
    (one per cell, ``KVStepAttention(replayable=True)``), with one launch of each linear layer
    instead of K: the attention runs per cell, over what that cell saw, then itself."""

    def __init__(self, spec: CausalConfig, grid_hw: tuple[int, int], snapshots: list[CellSnapshot]):
        cells = [s.cell for s in snapshots]
        if not cells or cells != list(range(cells[0], cells[0] + len(cells))):
            raise ValueError(f"cell views must be of consecutive cells, got {cells}")
        self.spec, self.grid_hw, self.snapshots = spec, grid_hw, snapshots
        self.tokens_per_cell = grid_hw[0] * grid_hw[1]

    @property
    def first_cell(self) -> int:
        return self.snapshots[0].cell

    def __len__(self) -> int:
        return len(self.snapshots)

    def attention(self, rope: RopeTable, num_heads: int) -> KVCellsAttention:
        return KVCellsAttention(self, rope, num_heads)


# every SDPA kernel but cuDNN's, in torch's own order of preference (see KVCellsAttention)
_EXACT_GRAD_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class KVCellsAttention:
    """The plan of a ``CellViews`` forward: the tokens are the cells' in cell order; cell i's group
    attends as cell i's own KV forward would (``attend_view`` over its snapshot's layer). It reads
    the snapshots only, so a recomputation in backward sees the same cells."""

    def __init__(self, views: CellViews, rope: RopeTable, num_heads: int):
        self.views, self.rope, self.num_heads = views, rope, num_heads
        self._freqs: list[tuple[Any, Any]] | None = None

    def freqs(self) -> list[tuple[Any, Any]]:
        """Per cell: its query's RoPE table and its cached keys' (None without cached cells), as
        ``KVCache.layer_view`` makes them; built once for every layer and the recomputation."""
        if self._freqs is None:
            spec, hw = self.views.spec, self.views.grid_hw
            self._freqs = [
                (
                    query_freqs(self.rope, s.cell, spec, hw),
                    key_freqs(self.rope, s.cells, s.cell, spec, hw) if s.cells else None,
                )
                for s in self.views.snapshots
            ]
        return self._freqs

    @torch.compiler.disable
    def __call__(self, layer: int, q, k, v) -> torch.Tensor:
        n, out = self.views.tokens_per_cell, []
        # cuDNN's attention is left out here: fed the cells' row slices (and, in backward, the
        # slices of the concatenated output's gradient) it returns gradients several times further
        # from the exact ones than the same cells' own KV forwards get, on an H200; flash,
        # memory-efficient and math all match them (bench/quality/exit_grad_kernels.py, issue 33).
        # The context sits in the call so a recomputation in backward runs under it too.
        with sdpa_kernel(_EXACT_GRAD_SDPA):
            for i, (snap, (q_freqs, kv_freqs)) in enumerate(
                zip(self.views.snapshots, self.freqs(), strict=True)
            ):
                rows = slice(i * n, (i + 1) * n)
                view = KVLayerView(q_freqs, kv_freqs, snap.k[layer], snap.v[layer])
                out.append(attend_view(view, q[:, rows], k[:, rows], v[:, rows], self.num_heads))
        return torch.cat(out, dim=1)


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
