"""The deploy rollout is stage 3's training rollout (Stage3Run.rollout: CausalStreamer through the
engine's forward wrapper) with the exit step forced to the last step and no grad: same anchor, ids,
prompts and seed give the same latents, with and without the folded commit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gc25d_core.deploy.runtime import DeployRuntime, RuntimeOptions, load_deploy_model
from gc25d_core.models.configs import DEPLOY_CAUSAL
from gc25d_core.models.sem_cond import cell_frame_slice
from gc25d_core.text import TextBank, load_text_table
from gc25d_core.train.data import TrainingSample
from gc25d_core.train.stage3_dmd import Stage3Run
from gc25d_core.vocab import valid_raw_ids

CELLS = 25  # the clip (21) and 4 extension cells: past the RoPE cap


class _Wrapper:
    """What the training engine hands the streamer: a callable around the module."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _sample(cfg, keys, seed=0) -> TrainingSample:
    g = torch.Generator().manual_seed(seed)
    h, w = cfg.geometry.dst_height, cfg.geometry.dst_width
    values = torch.tensor(valid_raw_ids("parts"), dtype=torch.uint8)
    ids = values[torch.randint(0, len(values), (81 + 28, h, w), generator=g)]
    latent = torch.randn(48, 21, h // 16, w // 16, generator=g).to(torch.bfloat16)
    k = [keys[int(i)] for i in torch.randint(0, len(keys), (28,), generator=g)]
    k[0] = k[1]
    return TrainingSample("clip", latent, ids[:81], k[:21], ext_ids=ids[81:], ext_keys=k[21:])


@pytest.mark.parametrize("fold", [False, True], ids=["separate_commit", "folded_commit"])
def test_deploy_rollout_equals_the_stage3_rollout(tiny_export, deploy_cfg, fold):
    model, meta = load_deploy_model(tiny_export)
    table = load_text_table(deploy_cfg)
    sample = _sample(deploy_cfg, sorted(table))
    run = SimpleNamespace(
        section=SimpleNamespace(grad_horizon=CELLS - 1),
        model=_Wrapper(model),
        device=torch.device("cpu"),
        text=TextBank(table, torch.device("cpu")),
        rollout_causal=DEPLOY_CAUSAL,
        rollout_checkpoint=False,
        axis=tuple(meta.denoise_axis),
        # the training module's path (the fast path's equality to it: tests/models/test_fast_rollout.py)
        rollout_path="module",
    )
    gen = torch.Generator().manual_seed(7)
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(7)))
    with torch.no_grad():
        ((train, _, _),) = Stage3Run.rollout_groups(
            run, [[sample]], [(CELLS, len(run.axis) - 1)], [gen], grad=False
        )

    from gc25d_core.models.vae import build_vae

    rt = DeployRuntime(
        model, meta, table, build_vae(tiny=True), RuntimeOptions(seed=seed, fold_commit=fold, decode=False)
    )
    ids, keys = sample.all_ids().numpy(), sample.all_keys()
    rt.start(sample.latent[None, :, :1].float(), ids[cell_frame_slice(0)], keys[0])
    cells = [rt.step(ids[cell_frame_slice(c)], keys[c]).latent for c in range(1, CELLS)]
    deploy = torch.cat([sample.latent[None, :, :1].float(), *cells], dim=2)
    assert train.shape == deploy.shape == (1, 48, CELLS, *sample.latent.shape[-2:])
    torch.testing.assert_close(deploy, train, rtol=1e-5, atol=1e-5)
    assert np.isfinite(deploy.numpy()).all()
