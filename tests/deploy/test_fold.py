"""Deploy's folded commit: one forward over [clean cell k | noisy cell k + 1] gives the same outputs
and the same cache as the separate commit forward, beyond the RoPE cap and the window."""

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


def test_fold_refuses_grad_and_a_wrong_cell():
    from gc25d_core.models.sampler import FoldedCommit, denoise_cell

    model = make_model(seed=0)
    cache = model.new_kv_cache(DEPLOY_CAUSAL, LATENT_HW)
    x = torch.zeros(1, 48, 1, *LATENT_HW)
    text = TextContext.build(torch.zeros(1, TEXT_LEN, TEXT_DIM))
    with pytest.raises(ValueError, match="previous cell"):
        denoise_cell(model, cache, 3, x, (1000.0,), text=text, fold=FoldedCommit(1, x, text, None))
