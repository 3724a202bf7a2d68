"""SPEC §7 per-sample dropouts and UNKNOWN world-anchored half-plane masking: distributions and rates
within binomial bounds, calibration bound, characters never masked, NaN ground points masked,
pooled-grid upsampling, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from gc25d_core.capsules import ground_points
from gc25d_core.layout import Shapes, read_cond, read_meta
from gc25d_core.masking import (
    HalfPlanes,
    apply_dropouts,
    apply_unknown_masking,
    beyond,
    calibrate,
    calibration_frames,
    draw_dropouts,
    draw_half_planes,
    masking_ground_xy,
    static_counts,
    unknown_mask,
    weighted_quantile,
)
from gc25d_core.vocab import CHARACTER_IDS, UNKNOWN

from .canvas_fixtures import MiniWorld


def _within_binomial(hits: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(hits - n * p) <= sigmas * np.sqrt(n * p * (1 - p))


@pytest.fixture(scope="module")
def clip(mini_world: MiniWorld):
    cfg = mini_world.cfg
    shapes = Shapes.of(cfg)
    meta = read_meta(mini_world.layout, mini_world.row.clip_id, shapes, True)
    cond = read_cond(mini_world.layout, mini_world.row.clip_id, shapes)
    xy = masking_ground_xy(meta, cfg.geometry, cfg.timeline.num_frames)
    return meta, cond, xy


def test_plane_counts_and_q_distributions():
    rng = np.random.default_rng(0)
    draws = [draw_half_planes(rng) for _ in range(6000)]
    one = [d for d in draws if d.num_planes == 1]
    two = [d for d in draws if d.num_planes == 2]
    assert len(one) + len(two) == len(draws)
    assert _within_binomial(len(one), len(draws), 0.7)
    q1 = np.concatenate([d.q for d in one])
    q2 = np.concatenate([d.q for d in two])
    assert q1.min() >= 0.05 and q1.max() <= 0.40 and q2.min() >= 0.05 and q2.max() <= 0.25
    # uniform: mean and the fraction below the midpoint
    assert abs(q1.mean() - 0.225) < 4.5 * 0.35 / np.sqrt(12 * len(q1))
    assert abs(q2.mean() - 0.15) < 4.5 * 0.20 / np.sqrt(12 * len(q2))
    assert _within_binomial(int((q1 < 0.225).sum()), len(q1), 0.5)
    assert _within_binomial(int((q2 < 0.15).sum()), len(q2), 0.5)
    theta = np.concatenate([d.theta for d in draws])
    assert theta.min() >= 0 and theta.max() < 2 * np.pi
    assert _within_binomial(int((theta < np.pi).sum()), len(theta), 0.5)
    assert all(np.isnan(d.tau).all() for d in draws[:10])


def test_dropout_rates_within_binomial_bounds():
    rng = np.random.default_rng(1)
    n = 20000
    d = [draw_dropouts(rng) for _ in range(n)]
    text = np.array([x.text for x in d])
    cond = np.array([x.cond for x in d])
    mask = np.array([x.unknown_mask for x in d])
    assert _within_binomial(int(text.sum()), n, 0.1)
    assert _within_binomial(int(cond.sum()), n, 0.05)
    assert not (cond & mask).any()  # masking only when the cond is kept
    assert _within_binomial(int(mask.sum()), int((~cond).sum()), 0.5)
    assert _within_binomial(int((text & cond).sum()), n, 0.1 * 0.05)  # independent


def test_apply_dropouts(clip):
    meta, cond, xy = clip
    seen = {"text": 0, "cond": 0, "mask": 0, "none": 0}
    calls = []

    def lazy():
        calls.append(1)
        return xy

    rng = np.random.default_rng(2)
    prompts = [f"p{i}" for i in range(21)]
    for _ in range(60):
        ids, out_prompts, d, planes = apply_dropouts(cond, prompts, "NULL", lazy, rng)
        assert out_prompts == (["NULL"] * 21 if d.text else prompts)
        if d.cond:
            assert (ids == UNKNOWN).all() and planes is None
            seen["cond"] += 1
        elif d.unknown_mask:
            assert planes is not None and (ids == UNKNOWN).any()
            seen["mask"] += 1
        else:
            assert ids is cond or np.array_equal(ids, cond)
            seen["none"] += 1
        seen["text"] += d.text
    assert len(calls) == seen["mask"] > 0 and seen["none"] > 0
    assert (cond != UNKNOWN).all()  # the input is not modified


def test_reproducible(clip):
    _, cond, xy = clip
    a, pa = apply_unknown_masking(cond, xy, np.random.default_rng(7))
    b, pb = apply_unknown_masking(cond, xy, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(pa.tau, pb.tau)
    c, _ = apply_unknown_masking(cond, xy, np.random.default_rng(8))
    assert not np.array_equal(a, c)


def test_characters_never_masked_and_pooled_grid(clip):
    _, cond, xy = clip
    chars = np.isin(cond, sorted(CHARACTER_IDS))
    assert chars.any()
    rng = np.random.default_rng(3)
    for _ in range(12):
        mask, planes = unknown_mask(cond, xy, rng)
        assert not (mask & chars).any()
        assert not (mask & (cond >= 7)).any()
        # a masked static pixel's whole 4×4 block is beyond: the mask is the grid upsampled on statics
        grid = beyond(planes, xy)
        up = np.repeat(np.repeat(grid, 4, axis=1), 4, axis=2)
        np.testing.assert_array_equal(mask, up & (cond < 7))
        out, _ = apply_unknown_masking(cond, xy, np.random.default_rng(4))
        np.testing.assert_array_equal(out[chars], cond[chars])


def test_pooled_ground_points(mini_world: MiniWorld, clip):
    meta, _, xy = clip
    g = mini_world.cfg.geometry
    assert xy.shape == (81, g.dst_height // 4, g.dst_width // 4, 2)
    ref = ground_points(
        meta["world_to_clip"][5],
        meta["world_to_view"][5],
        float(meta["ground_z"][0]),
        g,
        np.array([[4 * 3 + 1.5, 4 * 10 + 1.5]]),
    )
    np.testing.assert_allclose(xy[5, 10, 3], ref[0, :2])
    assert np.isnan(xy).any() and np.isfinite(xy).any()  # above-horizon centres have no ground point


def test_nan_ground_points_masked():
    f, h, w = 3, 8, 8
    ids = np.full((f, 4 * h, 4 * w), 2, np.uint8)
    ids[:, :4, :4] = 10  # a character block with a NaN point: never masked
    gy, gx = np.mgrid[0:h, 0:w].astype(float)
    xy = np.broadcast_to(np.stack([gx, gy], -1), (f, h, w, 2)).copy()
    xy[:, 0, :] = np.nan  # top grid row: rays above the horizon
    planes = calibrate(
        HalfPlanes(np.array([0.0]), np.array([0.2]), np.array([np.nan])),
        xy,
        static_counts(ids),
        calibration_frames(f),
    )
    grid = beyond(planes, xy)
    assert grid[:, 0, :].all()
    mask, _ = unknown_mask(ids, xy, np.random.default_rng(0))
    assert mask[:, :4, 4:].all() and not mask[:, :4, :4].any()


def test_calibration_bounds_each_frame(clip):
    """τ = max over calibration frames of the (1−q)-quantile: no calibration frame has more than q of
    its plane-hit static pixels beyond, and the frame that set τ has about q."""
    _, cond, xy = clip
    counts = static_counts(cond)
    frames = calibration_frames(len(cond))
    assert frames == list(range(0, 81, 4))
    rng = np.random.default_rng(5)
    for _ in range(20):
        planes = calibrate(draw_half_planes(rng), xy, counts, frames)
        dirs = planes.directions
        for p in range(planes.num_planes):
            fr = []
            for f in frames:
                ok = np.isfinite(xy[f]).all(-1) & (counts[f] > 0)
                proj, wts = xy[f][ok] @ dirs[p], counts[f][ok]
                fr.append(wts[proj > planes.tau[p]].sum() / wts.sum())
            assert max(fr) <= planes.q[p] + 1e-9
            assert max(fr) >= planes.q[p] - 0.05


def test_weighted_quantile():
    v = np.array([3.0, 1.0, 2.0, 4.0])
    w = np.array([1, 1, 1, 1])
    assert weighted_quantile(v, w, 0.5) == 2.0 and weighted_quantile(v, w, 0.51) == 3.0
    assert weighted_quantile(v, np.array([0, 0, 0, 5]), 0.1) == 4.0
    assert np.isnan(weighted_quantile(v, np.zeros(4), 0.5))
