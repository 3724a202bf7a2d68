"""Evaluation metrics and sweep rules on hand-made inputs: exact values, no network, no model."""

import json
import math

import numpy as np
import pytest
import torch

from gc25d_core.config import TimelineConfig
from gc25d_core.eval import metrics as M
from gc25d_core.eval.evaluate import Reference, aggregate, score_case
from gc25d_core.eval.sweeps import ClipInfo, EvalClip, build_case, chain_score, select_chain241, with_swaps

TL = TimelineConfig()


def test_identical_rollouts_have_zero_error_and_capped_psnr():
    lat = torch.randn(48, 5, 2, 3)
    assert M.latent_mse_per_cell(lat, lat.clone(), [True] * 5) == [0.0] * 5
    frames = np.random.default_rng(0).integers(0, 256, (17, 8, 8, 3), dtype=np.uint8)
    psnr = M.psnr_per_cell(frames, frames.copy(), [True] * 5)
    assert psnr == [M.PSNR_CAP_DB] * 5  # an exact match is the cap, not inf
    assert json.loads(json.dumps(M.json_safe({"psnr": psnr}), allow_nan=False)) == {"psnr": [100.0] * 5}


def test_psnr_values_and_missing_ground_truth():
    assert M.psnr_from_mse(255.0**2 / 100.0) == pytest.approx(20.0)
    assert M.psnr_from_mse(1e-30) == M.PSNR_CAP_DB
    assert math.isnan(M.psnr_from_mse(math.nan))
    a = np.zeros((9, 2, 2, 3), np.uint8)
    b = a.copy()
    b[1:5] = 10  # cell 1 off by 10 everywhere: MSE 100
    out = M.psnr_per_cell(b, a, [True, True, False])
    assert out[0] == M.PSNR_CAP_DB and out[1] == pytest.approx(10 * math.log10(255**2 / 100))
    assert math.isnan(out[2])
    mse = M.latent_mse_per_cell(torch.ones(4, 3, 1, 1), torch.zeros(4, 3, 1, 1), [True, False, True])
    assert mse[0] == 1.0 and math.isnan(mse[1]) and mse[2] == 1.0
    assert M.json_safe([math.nan, math.inf, -math.inf, np.float32(2.0)]) == [None, None, None, 2.0]
    assert M.nan_mean([1.0, math.nan, 3.0]) == 2.0 and math.isnan(M.nan_mean([math.nan]))


def test_cell_frames_follow_the_timeline():
    assert list(M.cell_frames(0)) == [0]
    assert list(M.cell_frames(1)) == [1, 2, 3, 4]
    assert list(M.cell_frames(27)) == [105, 106, 107, 108]
    assert M.num_frames(28) == 109 and M.num_frames(61) == 241


def test_flicker_boundary_against_within():
    cells = range(1, 4)
    static = np.full((13, 4, 4, 3), 7, np.uint8)
    assert M.flicker(static, cells) == {"boundary": 0.0, "within": 0.0, "excess": 0.0, "ratio": 1.0}
    ramp = np.stack([np.full((4, 4, 3), 10 * f, np.uint8) for f in range(13)])  # no seam: ratio 1
    f = M.flicker(ramp, cells)
    assert f["boundary"] == pytest.approx(10 / 255) and f["ratio"] == pytest.approx(1.0)
    steps = np.stack(
        [np.full((4, 4, 3), 51 * ((k + 3) // 4), np.uint8) for k in range(13)]
    )  # one value per cell
    f = M.flicker(steps, cells)
    assert f["boundary"] == pytest.approx(0.2) and f["within"] == 0.0 and math.isnan(f["ratio"])
    assert M.json_safe(f)["ratio"] is None
    seams = ramp.copy()
    seams[5:] = np.minimum(seams[5:].astype(int) + 20, 255).astype(np.uint8)  # a jump entering cell 2
    f = M.flicker(seams, cells)
    assert f["boundary"] == pytest.approx((10 + 30 + 10) / 3 / 255)
    assert f["within"] == pytest.approx(10 / 255) and f["ratio"] == pytest.approx(5 / 3)


def _clip(run: str, start: int, ext: str | None, c: int) -> EvalClip:
    """ids[f, 0, 0] = the clip-local frame (ext frames 81..108), ids[f, 0, 1] = c; latent cell j = 100c + j."""
    ids = torch.zeros(81, 1, 2, dtype=torch.uint8)
    ids[:, 0, 0] = torch.arange(81)
    ids[:, 0, 1] = c
    ext_ids = None
    if ext is not None:
        ext_ids = torch.zeros(28, 1, 2, dtype=torch.uint8)
        ext_ids[:, 0, 0] = torch.arange(81, 109)
        ext_ids[:, 0, 1] = c
    latent = (100 * c + torch.arange(21.0))[None, :, None, None].expand(2, 21, 1, 1).clone()
    return EvalClip(
        sample_id=f"{run}@{start}",
        run=run,
        start=start,
        latent=latent,
        ids=ids,
        keys=[f"k{c}_{j}" for j in range(21)],
        ext_ids=ext_ids,
        ext_keys=[f"e{c}_{j}" for j in range(21, 28)] if ext else None,
        ext_source=ext,
    )


def test_chain241_cells_come_from_the_clip_whose_frames_they_are():
    run = {96 * c: _clip("r", 96 * c, "cond_ext" if c < 2 else None, c) for c in range(3)}
    case = build_case("chain241", run, 0, 61, TL, "NULL", own_clip_only=False, gt_from_later=True)
    gt = [g for g in range(61) if case.has_gt[g]]
    assert gt == [*range(0, 21), *range(25, 45), *range(49, 61)]
    assert case.gt_from[25] == ("r@96", 1) and case.gt_from[60] == ("r@192", 12)
    assert not any(case.filled)
    assert case.ids.shape[0] == 241
    # cell g = frames 4g-3..4g; cell 25 is clip 1's local cell 1 (local frames 1..4), cell 24 clip 0's ext
    assert case.ids[97:101, 0, 0].tolist() == [1, 2, 3, 4] and case.ids[97:101, 0, 1].tolist() == [1] * 4
    assert case.ids[93:97, 0, 0].tolist() == [93, 94, 95, 96] and case.ids[93:97, 0, 1].tolist() == [0] * 4
    assert case.keys[24] == "e0_24" and case.keys[25] == "k1_1" and case.keys[0] == "k0_0"
    ref = Reference({c.sample_id: c for c in run.values()}, None)
    assert ref.latents(case)[0, 44, 0, 0] == 120.0 and ref.latents(case)[0, 22, 0, 0] == 0.0
    # without the third clip's extension nothing is missing; without clip 1's, cells 45..48 are filled
    run[96] = _clip("r", 96, None, 1)
    case = build_case("chain241", run, 0, 61, TL, "NULL", own_clip_only=False, gt_from_later=True)
    assert [g for g in range(61) if case.filled[g]] == [45, 46, 47, 48]
    assert case.keys[45] == "NULL" and int(case.ids[4 * 45, 0, 0]) == 255


def test_clip28_own_conditioning_and_later_ground_truth_only_for_a_raw_extension():
    run = {0: _clip("r", 0, "cond_ext", 0), 96: _clip("r", 96, "cond_ext", 1)}
    case = build_case("clip28", run, 0, 28, TL, "NULL", own_clip_only=True, gt_from_later=True)
    assert case.ids[:, 0, 1].tolist() == [0] * 109  # every cell from the clip itself
    assert case.ids[:, 0, 0].tolist() == list(range(109)) and case.keys[27] == "e0_27"
    assert [g for g in range(28) if not case.has_gt[g]] == [21, 22, 23, 24]
    canvas = build_case("clip28", run, 0, 28, TL, "NULL", own_clip_only=True, gt_from_later=False)
    assert [g for g in range(28) if canvas.has_gt[g]] == list(range(21))


def test_chain_start_and_swaps():
    infos = [ClipInfo(f"r@{s}", "r", s, s < 192) for s in (0, 96, 192, 288)]
    assert chain_score({i.start: i for i in infos}, 0, 61, TL) == (61, 53)
    assert select_chain241(infos, 5, TL) == [("r", 0)]
    run = {96 * c: _clip("r", 96 * c, "cond_ext", c) for c in range(2)}
    a = build_case("clip28", run, 0, 28, TL, "NULL", own_clip_only=True, gt_from_later=True)
    (single,) = with_swaps([a])
    assert single.other_keys == [a.keys[0], *a.keys[1:][::-1]] and single.other_from == "reversed"
    assert single.other_ids is not None and single.other_ids[1:5, 0, 0].tolist() == [105, 106, 107, 108]


def test_score_of_a_rollout_equal_to_its_ground_truth():
    run = {96 * c: _clip("r", 96 * c, "cond_ext", c) for c in range(2)}
    clips = {c.sample_id: c for c in run.values()}
    case = build_case("clip28", run, 0, 28, TL, "NULL", own_clip_only=True, gt_from_later=True)

    def decode(lat: torch.Tensor) -> torch.Tensor:  # any fixed decoder: 4 frames per cell after the first
        x = torch.tanh(lat[:, :1] / 200.0).expand(-1, 3, -1, -1, -1).repeat_interleave(4, dim=2)[:, :, 3:]
        return x.repeat_interleave(8, dim=3).repeat_interleave(4, dim=4)

    ref = Reference(clips, decode)
    own = ref.latents(case)
    for g in range(28):
        if not case.has_gt[g]:
            own[:, g] = own[:, 20]  # what a rollout may put where nothing is known
    frames = M.to_uint8_frames(decode(own[None]))
    other = own + 1.0
    s = score_case(case, own, other, ref, M.PSNR_CAP_DB, (frames, M.to_uint8_frames(decode(other[None]))))
    assert s["regions"]["1_20"]["latent_mse"] == 0.0 and s["regions"]["22_27"]["latent_mse"] == 0.0
    assert s["regions"]["1_20"]["psnr"] == M.PSNR_CAP_DB
    assert s["regions"]["1_20"]["latent_mse_other"] == 1.0 and s["regions"]["all"]["delta_psnr"] > 0
    assert math.isnan(s["curves"]["latent_mse"][22]) and s["regions"]["21_24"]["gt_cells"] == 0.0
    agg = aggregate([s, s])
    assert agg["regions"]["1_20"]["latent_mse"] == 0.0 and agg["num_cases"] == 2
    text = json.dumps(M.json_safe(agg), allow_nan=False)
    assert json.loads(text)["curves"]["latent_mse"][22] is None
