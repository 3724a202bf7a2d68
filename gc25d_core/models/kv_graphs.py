"""CUDA graphs of the model's KV forwards over a ``StaticKVCache``: one graph per window fill level,
captured at load (the live loop's fast path, deploy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gc25d_core.models.kv_cache import StaticKVCache

if TYPE_CHECKING:
    pass


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
    all at load. The folded commit (``fold=``: cell k's commit in cell k + 1's first forward) is
    captured the same way, per fill level (``_replay_fold``). Everything else (the anchor prefill,
    another cache, a CPU, grad) runs the model eagerly.
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
        if sem_ids is not None and getattr(self.model, "check_sem_ids", False):
            # the vocab check of raw ids reads a flag back to the host: no capture can hold it
            self.disabled = (
                "the model checks its ids on the device (check_sem_ids), a host sync no CUDA graph "
                "can hold: check them on the host and turn it off (DeployRuntime does)"
            )
            return self._eager(latent, timestep, text, sem_ids, **kwargs)
        commit = bool(kwargs.get("commit", False))
        want_out = bool(kwargs.get("return_output", True))
        fold = kwargs.get("fold")
        if fold is not None and not (
            isinstance(fold.text, TextContext)
            and fold.text.raw is text.raw
            and fold.text.num_groups == 1
            and (fold.sem_ids is None) == (sem_ids is None)
        ):
            return self._eager(latent, timestep, text, sem_ids, **kwargs)
        try:
            if fold is not None:
                return self._replay_fold(latent, timestep, text, sem_ids, cache, cell, fold)
            return self._replay(latent, timestep, text, sem_ids, cache, cell, commit, want_out)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # capture trouble: say so and stay eager from here on
            self.disabled = f"{type(e).__name__}: {e}"
            self.graphs.clear()
            cache._pending.clear()
            cache._rotated_for = None
            return self._eager(latent, timestep, text, sem_ids, **kwargs)

    def _inputs(self, latent, timestep, text, sem_ids, fold: Any = None) -> None:
        st = self.static
        t = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1).expand(latent.shape[0])
        new = {"x": latent, "t": t, "idx": text.index}
        if sem_ids is not None:
            new["sem"] = sem_ids
        if fold is not None:  # the previous cell's clean x0, prompt and ids (the fold's commit)
            new.update(x_prev=fold.x0, idx_prev=fold.text.index)
            if fold.sem_ids is not None:
                new["sem_prev"] = fold.sem_ids
        for name, value in new.items():
            if name not in st:
                st[name] = torch.empty_like(value, device=latent.device)
                if name == "idx":
                    self._text_raw = text.raw
            if st[name].shape != value.shape or st[name].dtype != value.dtype:
                raise RuntimeError(f"graph input {name}: {tuple(value.shape)} {value.dtype} changed")
            st[name].copy_(value, non_blocking=True)

    def _capture(self, fn: Callable[[], Any], keep: StaticKVCache | None = None) -> tuple[Any, Any]:
        """``keep``: a cache the body rewrites in place (a fold compacts and rotates it): each
        warm-up run starts from its buffers as they were, and so does the first replay."""
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        if keep is not None:
            bufs = [b for kind in (keep.k_raw, keep.k_rot, keep.v_buf) for b in kind if b is not None]
            saved = [(b, b.clone()) for b in bufs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: kernels picked, workspaces allocated, memos filled
                    for buf, copy in saved:
                        buf.copy_(copy)
                    fn()
        finally:  # also when a run fails: the eager fallback finds the cache as it was
            with torch.cuda.stream(side):
                for buf, copy in saved:
                    buf.copy_(copy)
            torch.cuda.current_stream().wait_stream(side)
        del saved
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
            self._rotation(cache, fill)
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

    def _rotation(self, cache: StaticKVCache, fill: int) -> None:
        """The cached keys rotated for a new query cell (a graph per fill level)."""
        if fill not in self._rotate:

            def rotate() -> torch.Tensor:
                cache.rotate()
                return torch.empty(0)

            self._rotate[fill], _ = self._capture(rotate)
        self._rotate[fill].replay()

    def _replay_fold(self, latent, timestep, text, sem_ids, cache, cell, fold) -> torch.Tensor:
        """The folded forward (commit of ``fold.cell`` + the first denoise step of ``cell``): one
        graph per (fill level, slots kept for ``cell``), replayed between the cache's host-side
        ``begin_fold`` and ``end_fold``; the next forwards of ``cell`` find its keys rotated."""
        from gc25d_core.models.gcdit import TextContext
        from gc25d_core.models.sampler import FoldedCommit

        if fold.cell != cell - 1:
            raise ValueError(f"a fold carries the previous cell: got cell {fold.cell} for {cell}")
        if self._cache is not cache:
            self.reset()
            self._cache = cache
        new_cell = cache._rotated_for != fold.cell or cache._cell != fold.cell
        cache.begin_fold(fold.cell, rotate=False)
        fill = len(cache.cells)
        if new_cell:
            self._rotation(cache, fill)
        self._inputs(latent, timestep, text, sem_ids, fold)
        key = ("fold", fill, cache._fold["slots"], sem_ids is None)
        if key not in self.graphs:
            st = self.static
            view = TextContext(text.raw, st["idx"], _shared=text._shared)
            prev = TextContext(text.raw, st["idx_prev"], _shared=text._shared)
            folded = FoldedCommit(fold.cell, st["x_prev"], prev, st.get("sem_prev"))

            def body() -> torch.Tensor:
                cache._pending.clear()
                return self.model.kv_fold_body(st["x"], st["t"], view, st.get("sem"), cache, folded)

            self.graphs[key] = self._capture(body, keep=cache)
        graph, out = self.graphs[key]
        graph.replay()
        self.replays += 1
        cache._pending = {layer: None for layer in range(cache.num_layers)}
        cache.end_fold()
        assert out is not None
        return out.clone()
