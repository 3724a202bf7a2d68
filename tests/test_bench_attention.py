"""bench/speed/attention.py's SDPA wrapper on the KV step's shapes (keys longer than the queries)."""

from __future__ import annotations

import torch

from bench.speed.attention import sdpa
from gc25d_core.models.causal import sdpa as model_sdpa


def test_the_bench_sdpa_takes_keys_longer_than_the_queries_as_the_kv_cache_does():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 4 * 8, generator=g)
    k, v = (torch.randn(1, 18, 4 * 8, generator=g) for _ in range(2))
    got = sdpa(4, None)(q, k, v)
    assert got.shape == q.shape
    torch.testing.assert_close(got, model_sdpa(q, k, v, 4))
