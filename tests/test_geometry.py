import numpy as np
import pytest

from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import (
    dst_to_src,
    index_maps,
    player_anchor_dst,
    resample_ids,
    resample_rgb,
    src_to_dst,
    src_to_dst_px,
)

V10 = GeometryConfig()


def test_crop_and_output_size():
    ids = np.zeros((704, 1280), np.uint8)
    assert resample_ids(ids).shape == (480, 832)
    rgb = np.zeros((2, 704, 1280, 3), np.uint8)
    assert resample_rgb(rgb).shape == (2, 480, 832, 3)
    assert resample_rgb(rgb[0]).shape == (480, 832, 3)


def test_index_maps_are_centre_aligned_inside_the_crop():
    idx_y, idx_x = index_maps(V10)
    assert idx_x.min() == 30 and idx_x.max() == 1249  # never samples outside x ∈ [30, 1250)
    assert idx_y.min() == 0 and idx_y.max() == 703
    # dst x=0 centre 0.5 → 0.5*1220/832 = 0.733 → column 30; dst y=0 → 0.5*704/480 = 0.733 → row 0
    assert idx_x[0] == 30 and idx_y[0] == 0
    # dst x=415 centre 415.5 → 609.27 → 30+609 = 639; dst y=239 → 239.5*704/480 = 351.27 → 351
    assert idx_x[415] == 639 and idx_y[239] == 351
    assert idx_x[831] == 30 + int(831.5 * 1220 / 832)


def test_resample_ids_is_nearest_and_ignores_pixels_outside_the_crop():
    ids = np.full((704, 1280), 3, np.uint8)
    ids[:, :30] = 7  # left of the crop
    ids[:, 1250:] = 9  # right of the crop
    out = resample_ids(ids)
    assert set(np.unique(out)) == {3}
    ids2 = (np.arange(1280)[None, :] % 256).astype(np.uint8).repeat(704, 0)
    out2 = resample_ids(ids2)
    assert np.array_equal(out2[0], (index_maps(V10)[1] % 256).astype(np.uint8))  # picks, never blends


def test_resample_rgb_uses_inter_area_on_the_crop():
    rgb = np.zeros((704, 1280, 3), np.uint8)
    rgb[:, :30] = 255  # outside the crop: must not leak into the output
    rgb[:, 1250:] = 255
    assert resample_rgb(rgb).max() == 0
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 256, (704, 1280, 3), dtype=np.uint8)
    out = resample_rgb(noisy)
    assert abs(float(out.mean()) - float(noisy[:, 30:1250].mean())) < 1.0  # area averaging keeps the mean
    assert out.std() < noisy.std() / 1.2  # and smooths (nearest would not)


def test_player_lands_at_the_destination_centre():
    assert player_anchor_dst() == (415.5, 239.5)
    x, y = src_to_dst(639.5, 351.5)  # source image centre
    assert x == pytest.approx(415.5, abs=1e-9) and y == pytest.approx(239.5, abs=1e-9)
    sx, sy = dst_to_src(415.5, 239.5)
    assert sx == pytest.approx(639.5) and sy == pytest.approx(351.5)
    # crop edges map to the destination edges
    assert src_to_dst(29.5, 0)[0] == pytest.approx(-0.5)
    assert src_to_dst(1249.5, 0)[0] == pytest.approx(831.5)
    assert src_to_dst(0, 703.5)[1] == pytest.approx(479.5)


def test_src_to_dst_px_rounds_and_clips():
    px = src_to_dst_px(np.array([640.0, -100.0]), np.array([352.0, 5000.0]))  # → (415.84, 239.84)
    assert px.dtype == np.int32
    assert px[0].tolist() == [416, 240] and px[1].tolist() == [0, 479]


def test_tiny_geometry_follows_the_same_rules():
    tiny = GeometryConfig(src_width=200, src_height=96, crop_x0=6, crop_x1=194, dst_width=128, dst_height=64)
    assert resample_ids(np.zeros((96, 200), np.uint8), tiny).shape == (64, 128)
    x, y = src_to_dst(99.5, 47.5, tiny)
    assert (x, y) == pytest.approx(player_anchor_dst(tiny))


def test_wrong_source_size_is_an_error():
    with pytest.raises(ValueError, match="1280x704"):
        resample_ids(np.zeros((700, 1280), np.uint8))
