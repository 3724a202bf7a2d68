"""The static-buffer KV cache (deploy, CUDA graphs) gives the KVCache's results bit for bit on a CPU:
same outputs, same cached K/V, past the RoPE cap and a full window; the graph runner falls back to
the eager forward where it cannot replay (a CPU here)."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.flow import DEPLOY_AXIS  # noqa: E402
from gc25d_core.models.causal import CausalStreamer, GraphedKVForward, StaticKVCache  # noqa: E402
from gc25d_core.models.configs import DEPLOY_CAUSAL, CausalConfig  # noqa: E402
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


def test_static_cache_steady_only_at_a_full_window_past_the_cap():
    model = make_model(seed=0)
    _, cache = streamed_rollout(model, DEPLOY_CAUSAL, 12, static_kv=True)
    assert not cache.steady(12)  # 12 cached cells < 19, positions still absolute
    with pytest.raises(NotImplementedError):
        cache.begin_fold(12)


def test_graph_runner_falls_back_to_eager_on_a_cpu():
    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    ref, _ = streamed_rollout(model, spec, 9)
    runner = GraphedKVForward(model)
    got, _ = streamed_rollout(model, spec, 9, static_kv=True, forward=runner)
    assert torch.equal(got, ref)
    assert runner.replays == 0 and runner.disabled is None


def test_static_cache_refuses_fold_with_it_and_no_window():
    model = make_model(seed=0)
    with pytest.raises(ValueError, match="fold_commit and static_kv"):
        CausalStreamer(model, DEPLOY_CAUSAL, DEPLOY_AXIS.timesteps, fold_commit=True, static_kv=True)
    with pytest.raises(ValueError, match="window"):
        model.new_kv_cache(CausalConfig(sink=0, window=None, rope_cap=None), LATENT_HW, static=True)
