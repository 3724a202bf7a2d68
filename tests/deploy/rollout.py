"""One streamed rollout of the tiny causal model from seeded inputs (anchor, per-cell prompts, ids),
with any CausalStreamer option: the reference and the variant of the deploy equality tests."""

from __future__ import annotations

from typing import Any

import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.flow import DEPLOY_AXIS  # noqa: E402
from gc25d_core.models.gcdit import TextContext  # noqa: E402
from gc25d_core.models.sampler import CausalStreamer  # noqa: E402
from gc25d_core.models.sem_cond import cell_frame_slice  # noqa: E402
from tests.models.tiny import LATENT_HW, TEXT_DIM, TEXT_LEN, random_ids  # noqa: E402


def streamed_rollout(
    model,
    spec,
    num_cells: int,
    seed: int = 0,
    streamer: CausalStreamer | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    **streamer_options: Any,
):
    """(x0 of cells 1.., the streamer's cache). With ``fold_commit`` the last cell's commit is still
    pending after its step: it runs as a plain commit, so both caches hold every committed cell.
    ``streamer``: run this one's next session (a static cache is then reused). ``device`` /
    ``dtype``: the inputs' (the model's), drawn on the CPU and moved there (the same draws)."""
    g = torch.Generator().manual_seed(seed)
    anchor = torch.randn(1, 48, 1, *LATENT_HW, generator=g).to(device, dtype)
    bank = torch.randn(1, 5, TEXT_LEN, TEXT_DIM, generator=g).to(device, dtype)
    index = torch.randint(0, 5, (1, num_cells), generator=g).to(device)
    ids = random_ids(1 + 4 * (num_cells - 1), seed).to(device)
    text = TextContext.build(bank, index)
    if streamer is None:
        streamer = CausalStreamer(model, spec, DEPLOY_AXIS.timesteps, **streamer_options)
    with torch.no_grad():
        streamer.start(anchor, text.select(index[:, :1]), ids[:, cell_frame_slice(0)])
        gen = torch.Generator(device).manual_seed(seed + 1)
        out = [
            streamer.step(text.select(index[:, c : c + 1]), ids[:, cell_frame_slice(c)], generator=gen)
            for c in range(1, num_cells)
        ]
        if streamer_options.get("fold_commit"):
            p = streamer.pending
            assert p is not None and p.cell == num_cells - 1
            model(p.x0, 0.0, p.text, p.sem_ids, mode="kv", cell=p.cell, cache=streamer.cache, commit=True)
    return torch.cat(out, dim=2), streamer.cache


def cuda_session_cells(export, cfg, num_cells: int = 26, **options: Any):
    """A CUDA session of the tiny export (no decode) under ``num_cells`` seeded action blocks:
    (x0 of every cell on the host, the runtime, its graph replays before the session's first
    cell — what the load-time warm-up captured and replayed)."""
    import numpy as np

    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    rng = np.random.default_rng(0)
    blocks = [np.array([rng.integers(0, 9), rng.integers(0, 2), 0, 0, 0], np.uint8) for _ in range(num_cells)]
    s = open_session(export, cfg, device="cuda", options=RuntimeOptions(decode=False, **options))
    s.start()
    before = s.runtime.graphed.replays if s.runtime.graphed is not None else 0
    lat = [s.step(b).out.latent.float().cpu() for b in blocks]
    return torch.cat(lat, dim=2), s.runtime, before
