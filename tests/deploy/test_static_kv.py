"""The static-buffer KV cache (deploy, CUDA graphs) gives the KVCache's results bit for bit on a CPU:
same outputs, same cached K/V, past the RoPE cap and a full window; the graph runner falls back to
the eager forward where it cannot replay (a CPU here)."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.flow import DEPLOY_AXIS  # noqa: E402
from gc25d_core.models.configs import DEPLOY_CAUSAL, CausalConfig  # noqa: E402
from gc25d_core.models.kv_cache import StaticKVCache  # noqa: E402
from gc25d_core.models.kv_graphs import GraphedKVForward  # noqa: E402
from gc25d_core.models.sampler import CausalStreamer  # noqa: E402
from tests.deploy.rollout import streamed_rollout  # noqa: E402
from tests.models.tiny import LATENT_HW, make_model  # noqa: E402


@pytest.mark.parametrize(
    "spec", [DEPLOY_CAUSAL, CausalConfig(sink=1, window=3, rope_cap=4)], ids=["deploy", "small_window"]
)
def test_static_cache_equals_the_kv_cache_exactly(spec):
    model = make_model(seed=0)
    cells = 26  # past the RoPE cap (20) and a full window (sink 3 + 17)
    ref, ref_cache = streamed_rollout(model, spec, cells)
    got, cache = streamed_rollout(model, spec, cells, static_kv=True)
    assert isinstance(cache, StaticKVCache)
    assert torch.equal(got, ref)
    assert cache.cells == ref_cache.cells
    assert len(cache.cells) == cache.slots == spec.sink + spec.window - 1
    assert cache.steady(cells)
    for layer in range(cache.num_layers):
        kv = cache.layer_kv(layer)
        assert kv is not None
        ref_kv = ref_cache.layer_kv(layer)
        assert ref_kv is not None
        assert torch.equal(kv[0], ref_kv[0]) and torch.equal(kv[1], ref_kv[1])


def test_the_static_cache_attends_through_its_kernel_and_the_streamer_sets_it():
    """``static_attention`` (deploy's FlashAttention-4 hook) is the kernel of every query cell's
    attention over the buffers, the folded commit's too: a counting SDPA gives SDPA's cells."""
    from gc25d_core.models.causal import sdpa

    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    calls = []

    def counted(q, k, v, num_heads):
        calls.append(k.shape[1])
        return sdpa(q, k, v, num_heads)

    for fold in (False, True):
        calls.clear()
        ref, _ = streamed_rollout(model, spec, 9, static_kv=True, fold_commit=fold)
        got, cache = streamed_rollout(
            model, spec, 9, static_kv=True, fold_commit=fold, static_attention=counted
        )
        assert isinstance(cache, StaticKVCache) and cache.attn_fn is counted
        assert torch.equal(got, ref)
        # every layer of every forward but the anchor's prefill (which the cache also attends)
        assert len(calls) >= len(model.blocks) * (4 * 8) and len(set(calls)) > 1  # every fill level
    with pytest.raises(ValueError, match="static_attention"):
        CausalStreamer(model, spec, DEPLOY_AXIS.timesteps, static_attention=counted)


def test_a_session_asking_for_fa4_refuses_naming_what_is_missing(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    with pytest.raises(ValueError, match="kv_attention='fa4' runs over the static KV buffers"):
        open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(kv_attention="fa4"))
    with pytest.raises(RuntimeError, match="kv_attention='fa4' needs a CUDA device"):
        open_session(
            tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(kv_attention="fa4", static_kv=True)
        )


def test_auto_kv_attention_takes_fa4_only_where_it_measured_faster(monkeypatch):
    """``auto``: FA4 on an sm90+ GPU with the package, a bf16 / fp16 model at the 5B's width; else
    SDPA, saying why."""
    from gc25d_core.models import fa4

    bf16 = torch.bfloat16
    kind, why = fa4.auto_kv_attention(3072, bf16, "cpu")
    assert kind == "sdpa" and why == "kv attention sdpa: FlashAttention-4 needs a CUDA device, got cpu"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(fa4, "fa4_available", lambda: False)
    assert fa4.auto_kv_attention(3072, bf16, "cuda")[1].endswith(
        "needs the flash-attn-4 package (flash_attn.cute)"
    )
    monkeypatch.setattr(fa4, "fa4_available", lambda: True)
    assert fa4.auto_kv_attention(3072, bf16, "cuda")[0] == "fa4"
    assert fa4.auto_kv_attention(fa4.AUTO_KV_MIN_DIM - 1, bf16, "cuda") == (
        "sdpa",
        "kv attention sdpa: dim 3071 < 3072, where FlashAttention-4 is not measured "
        "(--kv-attention fa4 forces it)",
    )
    assert "runs bf16/fp16" in fa4.auto_kv_attention(3072, torch.float32, "cuda")[1]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    assert fa4.auto_kv_attention(3072, bf16, "cuda") == (
        "sdpa",
        "kv attention sdpa: FlashAttention-4 needs sm90 or newer, cuda is A100",
    )


def test_a_session_with_auto_kv_attention_on_a_cpu_keeps_sdpa_and_says_so(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    for static in (False, True):
        session = open_session(
            tiny_export,
            deploy_cfg,
            device="cpu",
            options=RuntimeOptions(kv_attention="auto", static_kv=static),
        )
        runtime = session.runtime
        assert runtime.options.kv_attention == "sdpa" and runtime.kv_choice.startswith("kv attention sdpa: ")
        assert ("static KV buffers" in runtime.kv_choice) is not static


def test_static_cache_steady_only_at_a_full_window_past_the_cap():
    model = make_model(seed=0)
    _, cache = streamed_rollout(model, DEPLOY_CAUSAL, 12, static_kv=True)
    assert not cache.steady(12)  # 12 cached cells < 19, positions still absolute


def test_graph_runner_falls_back_to_eager_on_a_cpu():
    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    ref, _ = streamed_rollout(model, spec, 9)
    runner = GraphedKVForward(model)
    got, _ = streamed_rollout(model, spec, 9, static_kv=True, forward=runner)
    assert torch.equal(got, ref)
    assert runner.replays == 0 and runner.disabled is None


def test_the_rope_compiles_keep_the_full_windows_own_kernel():
    """Deploy compiles the full window's key rotation for its one shape (``compile_rotation``) and
    may add the rest (``compile_query_rotation``: the query cell's rotation, and the filling
    window's through one symbolic compile) without replacing it; a stage-3 rollout, which has only
    the latter, takes the symbolic compile for the full window too. Eager until asked."""
    from gc25d_core.models.causal import apply_rope
    from gc25d_core.models.kv_cache import rotate_query_cell

    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    deploy = model.new_kv_cache(spec, LATENT_HW, static=True)
    rollout = model.new_kv_cache(spec, LATENT_HW, static=True)
    for c in (deploy, rollout):
        assert c.rotate_fn is c.rotate_part_fn is apply_rope and c.query_rotate_fn is rotate_query_cell
    deploy.compile_rotation()
    full = deploy.rotate_fn
    deploy.compile_query_rotation()
    assert deploy.rotate_fn is full and deploy.rotate_part_fn not in (apply_rope, full)
    assert deploy.query_rotate_fn is not rotate_query_cell
    rollout.compile_query_rotation()
    assert rollout.rotate_fn is rollout.rotate_part_fn is not apply_rope


def test_static_cache_refuses_no_window():
    model = make_model(seed=0)
    with pytest.raises(ValueError, match="window"):
        model.new_kv_cache(CausalConfig(sink=0, window=None, rope_cap=None), LATENT_HW, static=True)


def test_a_new_session_reuses_the_static_cache_and_gives_the_same_cells():
    """The streamer keeps its static cache (the buffers the CUDA graphs point at) from session to
    session; a reset cache gives the fresh cache's results, whatever ran on it before."""
    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    ref, _ = streamed_rollout(model, spec, 9)
    streamer = CausalStreamer(model, spec, DEPLOY_AXIS.timesteps, static_kv=True)
    a, cache_a = streamed_rollout(model, spec, 9, streamer=streamer)
    other, cache_o = streamed_rollout(model, spec, 6, seed=3, streamer=streamer)  # another session between
    b, cache_b = streamed_rollout(model, spec, 9, streamer=streamer)
    assert cache_a is cache_o is cache_b and isinstance(cache_b, StaticKVCache)
    assert torch.equal(a, ref) and torch.equal(b, ref)
    assert not torch.equal(other, ref[:, :, : other.shape[2]])


@pytest.mark.gpu
def test_cuda_session_replays_graphs_from_cell_1_with_the_exact_latents(tiny_export, deploy_cfg):
    """On CUDA a session with cuda_graphs replays a captured graph for every forward of every cell
    from cell 1 (the warm-up at load captured every window fill level) and gives the exact path's
    latents, bit for bit, past a full window and the RoPE cap."""
    from tests.deploy.rollout import cuda_session_cells

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cells = 26

    exact, _, _ = cuda_session_cells(tiny_export, deploy_cfg, cells)
    for defer in (False, True):  # the commit before the decode, or after it (the CLI's default)
        graphed, rt, before = cuda_session_cells(
            tiny_export, deploy_cfg, cells, cuda_graphs=True, defer_commit=defer
        )
        assert rt.graphed is not None and rt.graphed.disabled is None
        assert rt.warmup_s > 0 and before > 0  # captured at load, before the session's first cell
        assert rt.graphed.replays - before == 5 * cells  # 4 denoise + 1 commit per cell, from cell 1
        assert torch.equal(graphed, exact)


@pytest.mark.gpu
def test_cuda_session_with_the_rope_compiled_stays_within_rounding(tiny_export, deploy_cfg):
    """``rope_compile`` (the query cell's q/k rotation and the filling window's key rotation
    compiled, beside ``rotate_compile``'s full-window kernel) on a graphed CUDA session: every
    forward from cell 1 still replays a graph captured at load, the compiled functions are the
    cache's, and the latents stay within rounding of the exact path past a full window and the cap
    (relative max error printed)."""
    from gc25d_core.models.causal import apply_rope
    from gc25d_core.models.kv_cache import rotate_query_cell
    from tests.deploy.rollout import cuda_session_cells

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cells = 26
    exact, _, _ = cuda_session_cells(tiny_export, deploy_cfg, cells)
    got, rt, before = cuda_session_cells(
        tiny_export, deploy_cfg, cells, cuda_graphs=True, rotate_compile=True, rope_compile=True
    )
    cache = rt.streamer.cache
    assert isinstance(cache, StaticKVCache)
    assert cache.query_rotate_fn is not rotate_query_cell and cache.rotate_part_fn is not apply_rope
    assert cache.rotate_fn is not cache.rotate_part_fn  # the full window keeps its own kernel
    assert rt.graphed is not None and rt.graphed.disabled is None
    assert rt.graphed.replays - before == 5 * cells
    err = float((got - exact).abs().max() / exact.abs().max())
    print(f"rope compiled vs exact: max rel {err:.2e}")
    assert err <= 2e-2, err
