"""gc_sem_cond: pooled one-hot, cell-0 replication, zero init, vocab detection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.models.sem_cond import (
    SemCondEncoder,
    cell_frame_slice,
    detect_vocab,
    install_sem_cond,
    num_cells_for_frames,
    pooled_onehot,
    sem_cond_keys,
)
from gc25d_core.vocab import collapse_parts, num_classes, raw_to_class, valid_raw_ids

from .tiny import random_ids


def _reference_pooled(ids: np.ndarray, vocab: str) -> np.ndarray:
    cls = raw_to_class(ids, vocab)  # [F, H, W]
    k = num_classes(vocab)
    onehot = np.eye(k, dtype=np.float64)[cls]  # [F, H, W, K]
    f, h, w = cls.shape
    pooled = onehot.reshape(f, h // 8, 8, w // 8, 8, k).mean(axis=(2, 4))
    return pooled.transpose(3, 0, 1, 2)  # [K, F, H/8, W/8]


@pytest.mark.parametrize("vocab", ["parts", "ids"])
def test_pooled_onehot_matches_reference(vocab):
    ids = random_ids(5, seed=3, vocab=vocab)[0]  # [5, 64, 96]
    got = pooled_onehot(ids, vocab)
    assert got.shape == (1, num_classes(vocab), 5, 8, 12) and got.dtype == torch.float32
    np.testing.assert_allclose(got[0].numpy(), _reference_pooled(ids.numpy(), vocab), atol=1e-7)
    torch.testing.assert_close(got.sum(dim=1), torch.ones(1, 5, 8, 12))


def test_pooled_onehot_rejects_values_outside_vocab():
    ids = random_ids(1, seed=0, vocab="ids")
    ids[0, 0, 0, 0] = 12  # l_arm: valid for parts, not for ids
    pooled_onehot(ids, "parts")
    with pytest.raises(ValueError, match=r"\[12\].*'ids'"):
        pooled_onehot(ids, "ids")
    pooled_onehot(torch.from_numpy(collapse_parts(ids.numpy())), "ids")
    with pytest.raises(ValueError, match="multiples of 8"):
        pooled_onehot(ids[..., :60], "parts")
    with pytest.raises(TypeError):
        pooled_onehot(ids.float(), "parts")


def test_unknown_is_last_class():
    ids = torch.full((1, 8, 8), 255, dtype=torch.uint8)
    pooled = pooled_onehot(ids, "parts")
    assert pooled[0, -1].item() == 1.0 and pooled[0, :-1].abs().sum().item() == 0.0


def test_encoder_shapes_zero_init_and_cell0_replication():
    torch.manual_seed(0)
    enc = SemCondEncoder("parts", dim=24, hidden=16)
    assert enc.proj_in.weight.shape == (16, 20, 4, 4, 4)  # 64*K = 1280 inputs per token
    ids = random_ids(9, seed=1)  # 1 + 4*2 frames = 3 cells
    assert torch.count_nonzero(enc(ids)) == 0  # zero-initialised last layer
    torch.nn.init.normal_(enc.proj_out.weight)
    out = enc(ids)
    assert out.shape == (1, 24, 3, 2, 3)
    # cell 0 alone equals its frame replicated x4 fed as an ordinary cell
    cell0 = enc(ids[:, :1])
    replicated = enc(ids[:, :1].expand(1, 4, 64, 96).contiguous(), first_cell=1)
    torch.testing.assert_close(cell0, replicated, rtol=0, atol=0)
    torch.testing.assert_close(out[:, :, :1], cell0, rtol=1e-6, atol=1e-6)
    # cells are independent: cell 2 from its own 4 frames equals the clip encoding's cell 2
    torch.testing.assert_close(
        enc(ids[:, cell_frame_slice(2)], first_cell=2), out[:, :, 2:3], rtol=1e-6, atol=1e-6
    )


def test_frame_cell_bookkeeping():
    assert num_cells_for_frames(81) == 21 and num_cells_for_frames(28, first_cell=21) == 7
    assert cell_frame_slice(0) == slice(0, 1) and cell_frame_slice(20) == slice(77, 81)
    with pytest.raises(ValueError):
        num_cells_for_frames(80)
    with pytest.raises(ValueError):
        num_cells_for_frames(5, first_cell=3)


def test_detect_vocab_from_shapes():
    for vocab in ("parts", "ids"):
        enc = SemCondEncoder(vocab, dim=8, hidden=4)
        sd = {f"gc_sem_cond.{k}": v for k, v in enc.state_dict().items()}
        assert detect_vocab(sd) == vocab
        assert detect_vocab({f"dit.{k}": tuple(v.shape) for k, v in sd.items()}) == vocab
    with pytest.raises(ValueError, match="not a gc25d checkpoint"):
        detect_vocab({"patch_embedding.weight": (8, 48, 1, 2, 2)})
    with pytest.raises(ValueError, match="K=13"):
        detect_vocab({"gc_sem_cond.proj_in.weight": (4, 13, 4, 4, 4)})


def test_install_on_plain_wan_model():
    from gc25d_core.compat import import_diffsynth
    from gc25d_core.models.configs import tiny_config

    import_diffsynth()
    from diffsynth.models.wan_video_dit import WanModel

    dit = WanModel(**tiny_config().wan_kwargs())
    enc = install_sem_cond(dit, "ids", hidden=16)
    keys = [k for k in dit.state_dict() if k.startswith("gc_sem_cond.")]
    assert sorted(keys) == sorted(sem_cond_keys()) and len(keys) == 6
    assert enc.num_classes == len(valid_raw_ids("ids")) == 10
    assert detect_vocab(dit.state_dict()) == "ids"
