"""The EMA's arithmetic: the shadow follows the weights until the start step, then
shadow' = d·shadow + (1 − d)·θ in fp32; the swap puts the shadow into the model and back."""

from __future__ import annotations

import torch

from gc25d_core.stage_config import EmaConfig, OptimConfig
from gc25d_core.train.ema import Ema
from gc25d_core.train.engine import TorchEngine, default_groups


def _trained(dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).to(dtype)
    optim = OptimConfig(lr=0.1, cond_lr=None, warmup_steps=0)
    return TorchEngine(torch.device("cpu"), "fp32", grad_accum=1).train(
        "m", model, optim, default_groups(optim)
    )


def _step(trained) -> None:
    x = torch.randn(8, 4, dtype=next(trained.module.parameters()).dtype)
    trained.backward(trained(x).float().pow(2).mean())
    trained.step(True)


def test_shadow_follows_until_the_start_step_then_averages_in_fp32():
    trained = _trained()
    ema = Ema(trained, EmaConfig(enabled=True, decay=0.9, start_step=3))
    for step in (1, 2):
        _step(trained)
        ema.update(step)
        assert not ema.started
        assert all(torch.equal(s, p) for s, (_, p) in zip(ema.shadow, trained.local_params(), strict=True))
    before = [s.clone() for s in ema.shadow]
    _step(trained)
    ema.update(3)
    assert ema.started and ema.updates == 1
    for s, s0, (_, p) in zip(ema.shadow, before, trained.local_params(), strict=True):
        torch.testing.assert_close(s, 0.9 * s0 + 0.1 * p.detach(), rtol=0, atol=1e-7)
        assert not torch.equal(s, p)


def test_bf16_weights_get_an_fp32_shadow_and_the_swap_restores_them():
    trained = _trained(torch.bfloat16)
    ema = Ema(trained, EmaConfig(enabled=True, decay=0.5, start_step=0))
    weights = [p.detach().clone() for _, p in trained.local_params()]
    _step(trained)
    ema.update(1)
    assert all(s.dtype == torch.float32 for s in ema.shadow)
    after_step = [p.detach().clone() for _, p in trained.local_params()]
    with ema.swapped_in():
        for (_, p), s in zip(trained.local_params(), ema.shadow, strict=True):
            assert torch.equal(p, s.to(torch.bfloat16))
    assert all(torch.equal(p, a) for (_, p), a in zip(trained.local_params(), after_step, strict=True))
    assert any(not torch.equal(a, w) for a, w in zip(after_step, weights, strict=True))
    sd = ema.full_state_dict()  # a snapshot of the shadow, not the live weights
    assert torch.equal(sd["0.weight"], ema.shadow[0].to(torch.bfloat16))
