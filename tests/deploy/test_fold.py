"""Deploy's folded commit: one forward over [clean cell k | noisy cell k + 1] gives the same outputs
and the same cache as the separate commit forward, beyond the RoPE cap and the window — on the
KVCache, on the static buffers (in place: compacted and rotated for cell k + 1 by the fold), and
through the graph runner (eager on a CPU; its CUDA graphs in the gpu test)."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.models.configs import DEPLOY_CAUSAL, CausalConfig  # noqa: E402
from gc25d_core.models.gcdit import TextContext  # noqa: E402
from tests.deploy.rollout import streamed_rollout  # noqa: E402
from tests.models.tiny import LATENT_HW, TEXT_DIM, TEXT_LEN, make_model  # noqa: E402


@pytest.mark.parametrize(
    "spec", [DEPLOY_CAUSAL, CausalConfig(sink=1, window=3, rope_cap=4)], ids=["deploy", "small_window"]
)
def test_folded_commit_equals_the_separate_commit(spec):
    model = make_model(seed=0)
    cells = 26  # past the RoPE cap (20) and a full window (sink 3 + 17)
    ref, ref_cache = streamed_rollout(model, spec, cells)
    got, cache = streamed_rollout(model, spec, cells, fold_commit=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert cache.cells == ref_cache.cells
    for layer in range(cache.num_layers):
        torch.testing.assert_close(cache.layer_kv(layer), ref_cache.layer_kv(layer), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spec", [DEPLOY_CAUSAL, CausalConfig(sink=1, window=3, rope_cap=4)], ids=["deploy", "small_window"]
)
def test_folded_commit_on_the_static_cache_equals_the_separate_commit(spec):
    from gc25d_core.models.kv_cache import StaticKVCache
    from gc25d_core.models.kv_graphs import GraphedKVForward

    model = make_model(seed=0)
    cells = 26 if spec == DEPLOY_CAUSAL else 9  # past the RoPE cap and a full window
    ref, ref_cache = streamed_rollout(model, spec, cells)
    runner = GraphedKVForward(model)  # on a CPU: the eager forward, the fold on the buffers
    got, cache = streamed_rollout(model, spec, cells, fold_commit=True, static_kv=True, forward=runner)
    assert isinstance(cache, StaticKVCache) and runner.replays == 0 and runner.disabled is None
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert cache.cells == ref_cache.cells
    for layer in range(cache.num_layers):
        torch.testing.assert_close(cache.layer_kv(layer), ref_cache.layer_kv(layer), rtol=1e-5, atol=1e-5)


def test_fold_refuses_grad_and_a_wrong_cell():
    from gc25d_core.models.sampler import FoldedCommit, denoise_cell

    model = make_model(seed=0)
    cache = model.new_kv_cache(DEPLOY_CAUSAL, LATENT_HW)
    x = torch.zeros(1, 48, 1, *LATENT_HW)
    text = TextContext.build(torch.zeros(1, TEXT_LEN, TEXT_DIM))
    with pytest.raises(ValueError, match="previous cell"):
        denoise_cell(model, cache, 3, x, (1000.0,), text=text, fold=FoldedCommit(1, x, text, None))


def test_a_cpu_session_with_graphs_and_the_fold_gives_the_unfolded_latents(tiny_export, deploy_cfg):
    """The CLI's ``--fold-commit`` on the fast path's options (CUDA graphs, hence the static cache)
    on a CPU: the fold runs eagerly on the buffers, the latents those of the unfolded session."""
    import numpy as np

    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    blocks = [np.array([i % 9, i % 2, 0, 0, 0], np.uint8) for i in range(6)]

    def run(**opts):
        s = open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(decode=False, **opts))
        s.start()
        return torch.cat([s.step(b).out.latent for b in blocks], dim=2), s.runtime

    ref, _ = run()
    got, rt = run(cuda_graphs=True, fold_commit=True)
    assert rt.graphed is None and "cuda_graphs: no CUDA device" in rt.notes[0]
    assert rt.streamer.fold_commit and rt.streamer.static_kv
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_fold_replays_graphs_from_cell_1(tiny_export, deploy_cfg):
    """On CUDA with cuda_graphs + fold_commit every forward of every cell from cell 1 replays a
    graph captured at load (4 per cell: the first commits the previous cell), with the eager
    fold's latents on the same buffers bit for bit — and the exact path's: the fold's linear
    layers run over two cells (other GEMM shapes), yet on the H200 each row came out the same
    (2026-12-02: max abs diff 0.0 here and over 42 full-size cells in bench/speed/deploy.py)."""
    from tests.deploy.rollout import cuda_session_cells

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cells = 26

    exact, _, _ = cuda_session_cells(tiny_export, deploy_cfg, cells)
    eager_fold, _, _ = cuda_session_cells(tiny_export, deploy_cfg, cells, static_kv=True, fold_commit=True)
    graphed, rt, before = cuda_session_cells(
        tiny_export, deploy_cfg, cells, cuda_graphs=True, fold_commit=True
    )
    assert rt.graphed is not None and rt.graphed.disabled is None
    assert rt.graphed.replays - before == 4 * cells
    assert torch.equal(graphed, eager_fold)
    diff, scale = float((graphed - exact).abs().max()), float(exact.abs().max())
    print(f"fold vs exact over {cells} cells: max abs diff {diff:.3g} (max |x0| {scale:.3g})")
    assert diff == 0.0, f"fold vs exact: max abs diff {diff} against max |x0| {scale}"
