"""capsules: (de)serialisation, ray geometry, label_parts / render_capsules / ground_points."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from gc25d_core.capsules import (
    CAPSULE_NAMES,
    CAPSULE_PART,
    CAPSULE_PART_IDS,
    PixelRays,
    capsules_from_array,
    capsules_from_json,
    capsules_to_array,
    cast_capsules,
    dst_sample_coords,
    ground_points,
    hits_to_part_ids,
    label_parts,
    project_points,
    ray_capsule_t,
    render_capsules,
)
from gc25d_core.codeworld.actors import (
    BOSS_SCALE,
    BOSS_SHAPE,
    PLAYER_SCALE,
    PLAYER_SHAPE,
    Pose,
    body_capsules,
)
from gc25d_core.codeworld.camera import CAMERA_VARIANTS, aimed_pose, camera_matrices
from gc25d_core.codeworld.presets import TINY_GEOMETRY
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import resample_ids
from gc25d_core.raw_layout import FrameJson
from gc25d_core.vocab import BOSS_PART_IDS, PLAYER_PART_IDS, collapse_parts, valid_raw_ids

V10 = GeometryConfig()


def _scene(variant: str = "tp_default", pose: Pose | None = None, boss_dist: float = 260.0):
    """Player at the origin facing +x, boss ``boss_dist`` ahead; camera behind the player.
    Returns (capsules f32 [2,12,7], world_to_clip, world_to_view) for the v10 source size."""
    pose = pose or Pose(walk_phase=0.7, stride=0.8, attack=1, attack_t=0.4)
    p, _ = body_capsules(np.zeros(3), 0.0, PLAYER_SCALE, pose, PLAYER_SHAPE)
    b, _ = body_capsules(np.array([boss_dist, 40.0, 0.0]), math.pi, BOSS_SCALE, Pose(stride=0.3), BOSS_SHAPE)
    caps = np.stack([p, b]).astype(np.float32)
    cam = aimed_pose(np.array([0.0, 0.0, 92.0]), 0.15, CAMERA_VARIANTS[variant])
    m = camera_matrices(cam, V10.src_width, V10.src_height)
    return caps, m.world_to_clip, m.world_to_view


def test_capsule_table_maps_twelve_capsules_to_six_parts():
    assert len(CAPSULE_NAMES) == 12 and len(CAPSULE_PART) == 12
    assert sorted(set(CAPSULE_PART)) == [0, 1, 2, 3, 4, 5]
    assert tuple(sorted(set(CAPSULE_PART_IDS[0].tolist()))) == PLAYER_PART_IDS
    assert tuple(sorted(set(CAPSULE_PART_IDS[1].tolist()))) == BOSS_PART_IDS


def test_json_round_trip_and_array_shapes():
    caps, _, _ = _scene()
    as_json = capsules_from_array(caps)[0]
    assert set(as_json) == {"player", "boss"} and len(as_json["player"]) == 12
    assert np.array_equal(capsules_from_json(as_json), caps)
    assert np.array_equal(capsules_from_json({"capsules": as_json}), caps)
    fj = FrameJson.model_validate(_frame_json_dict(as_json))
    assert np.array_equal(capsules_from_json(fj), caps)
    arr = capsules_to_array([fj, as_json, caps])
    assert arr.shape == (3, 2, 12, 7) and arr.dtype == np.float32
    assert np.array_equal(arr[1], caps)
    back = capsules_from_array(arr)
    assert len(back) == 3 and np.array_equal(capsules_to_array(back), arr)


def _frame_json_dict(caps_json):
    eye = list(np.eye(4).ravel())
    return {
        "frame": 0,
        "episode": 0,
        "camera_variant": "c",
        "look_name": "l",
        "world_to_clip": eye,
        "world_to_view": eye,
        "projection": eye,
        "orthographic": False,
        "fov_x_deg": 90.0,
        "ortho_width_cm": 512.0,
        "frame_offset_cm": [0, 0, 0],
        "capsules": caps_json,
        "actor_pos": {"player": [0, 0, 0], "boss": [0, 0, 0]},
        "player_state": "idle",
        "boss_state": "idle",
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"player": [[0.0] * 7] * 11, "boss": [[0.0] * 7] * 12},
        {"player": [[0.0] * 6] * 12, "boss": [[0.0] * 7] * 12},
        {"player": [[0.0] * 7] * 12},
        {"player": [[0.0] * 6 + [-1.0]] * 12, "boss": [[0.0] * 7] * 12},
    ],
)
def test_capsules_from_json_rejects_malformed(bad):
    with pytest.raises(ValueError, match="capsules"):
        capsules_from_json(bad)


def test_ray_capsule_distances():
    cap = np.array([0.0, -50.0, 0.0, 0.0, 50.0, 0.0, 10.0])  # along y through the origin, radius 10
    o = np.array([[-100.0, 0.0, 0.0], [-100.0, 55.0, 0.0], [-100.0, 0.0, 30.0], [100.0, 0.0, 0.0]])
    d = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    t = ray_capsule_t(o, d, cap)
    assert t[0] == pytest.approx(90.0)  # cylinder body
    assert t[1] == pytest.approx(100.0 - math.sqrt(100.0 - 25.0))  # end sphere at y=50, offset 5
    assert np.isinf(t[2])  # passes above
    assert np.isinf(ray_capsule_t(o[3:], d[3:], cap)[0])  # capsule is behind the ray


@pytest.mark.parametrize("variant", ["tp_default", "ortho_iso"])
def test_pixel_rays_pass_through_projected_points(variant):
    caps, w2c, w2v = _scene(variant)
    rng = np.random.default_rng(0)
    pts = rng.uniform([-300, -300, 0], [300, 300, 200], (200, 3))
    from gc25d_core.capsules import project_src

    x, y, w = project_src(pts, w2c, V10.src_width, V10.src_height)
    ok = w > 0
    rays = PixelRays.through(x[ok], y[ok], w2c, w2v, V10.src_width, V10.src_height)
    v = pts[ok] - rays.origin
    t = np.einsum("ij,ij->i", v, rays.direction)
    assert (t > 0).all()
    dist = np.linalg.norm(v - t[:, None] * rays.direction, axis=1)
    assert dist.max() < 1e-6
    assert np.allclose(np.linalg.norm(rays.direction, axis=1), 1.0)


@pytest.mark.parametrize("geom", [V10, TINY_GEOMETRY], ids=["v10", "tiny"])
@pytest.mark.parametrize("variant", ["tp_default", "tp_high", "ortho_iso"])
def test_ground_points_invert_projection(geom, variant):
    cam = aimed_pose(np.array([120.0, -40.0, 92.0]), 0.4, CAMERA_VARIANTS[variant])
    m = camera_matrices(cam, geom.src_width, geom.src_height)
    rng = np.random.default_rng(1)
    z = 3.5
    pts = np.concatenate([rng.uniform(-900, 900, (500, 2)) + [120.0, -40.0], np.full((500, 1), z)], axis=1)
    xy, front = project_points(pts, m.world_to_clip, geom)
    inside = front & (xy[:, 0] > -0.5) & (xy[:, 0] < geom.dst_width - 0.5) & (xy[:, 1] > -0.5)
    inside &= xy[:, 1] < geom.dst_height - 0.5
    assert inside.sum() > 50
    back = ground_points(m.world_to_clip, m.world_to_view, z, geom, xy[inside])
    assert np.abs(back - pts[inside]).max() < 1e-3


def test_ground_points_nan_above_horizon():
    cam = aimed_pose(np.array([0.0, 0.0, 92.0]), 0.0, CAMERA_VARIANTS["tp_wide"])
    m = camera_matrices(cam, V10.src_width, V10.src_height)
    g = ground_points(m.world_to_clip, m.world_to_view, 0.0, V10)
    assert g.shape == (480, 832, 3)
    assert np.isnan(g[0]).all()  # the top row looks at the sky
    assert np.isfinite(g[-1]).all() and np.allclose(g[-1, :, 2], 0.0)


def test_label_parts_agrees_with_render_capsules():
    caps, w2c, w2v = _scene()
    bg = np.full((480, 832), 1, np.uint8)
    drawn = render_capsules(caps, w2c, w2v, bg, V10)
    assert set(np.unique(drawn)) <= set(valid_raw_ids("parts"))
    chars = drawn >= 10
    assert chars.sum() > 2000
    assert len(set(np.unique(drawn[drawn < 50]).tolist()) & set(PLAYER_PART_IDS)) == 6
    ue = collapse_parts(drawn)  # what ids.png would hold: 10 / 11
    labelled = label_parts(ue, w2c, w2v, caps, V10)
    assert np.array_equal(labelled, drawn)
    assert set(np.unique(labelled)) <= set(valid_raw_ids("parts"))


def test_label_parts_misses_keep_core_and_statics_unchanged():
    caps, w2c, w2v = _scene()
    ids = np.zeros((480, 832), np.uint8)
    ids[:40, :40] = 10  # no capsule up there
    ids[:40, -40:] = 11
    ids[-5:] = 255
    ids[200:210, 0:50] = 4
    out = label_parts(ids, w2c, w2v, caps, V10)
    assert np.array_equal(out, ids)


def test_label_parts_uses_each_actors_own_capsules():
    caps, w2c, w2v = _scene()
    drawn = render_capsules(caps, w2c, w2v, np.zeros((480, 832), np.uint8), V10)
    player = np.isin(drawn, PLAYER_PART_IDS)
    ids = np.where(player, 11, 0).astype(np.uint8)  # claim the player's pixels are the boss's
    out = label_parts(ids, w2c, w2v, caps, V10)
    assert set(np.unique(out[player])) <= set(BOSS_PART_IDS)


def test_label_parts_rejects_bad_input():
    caps, w2c, w2v = _scene()
    with pytest.raises(ValueError, match="destination ids"):
        label_parts(np.zeros((704, 1280), np.uint8), w2c, w2v, caps, V10)
    bad = np.zeros((480, 832), np.uint8)
    bad[0, 0] = 7
    with pytest.raises(ValueError, match=r"\[7\]"):
        label_parts(bad, w2c, w2v, caps, V10)


def test_render_capsules_depth_order_and_background_depth():
    caps, w2c, w2v = _scene(boss_dist=120.0)
    only_boss = caps.copy()
    only_boss[0, :, :3] = only_boss[0, :, 3:6] = [0.0, 0.0, -5000.0]  # player far below ground, out of view
    boss_alone = render_capsules(only_boss, w2c, w2v, np.zeros((480, 832), np.uint8), V10)
    both = render_capsules(caps, w2c, w2v, np.zeros((480, 832), np.uint8), V10)
    overlap = np.isin(boss_alone, BOSS_PART_IDS) & np.isin(both, PLAYER_PART_IDS)
    assert overlap.sum() > 100  # the nearer player hides part of the boss
    near_wall = np.full((480, 832), 50.0)
    hidden = render_capsules(
        caps, w2c, w2v, np.full((480, 832), 3, np.uint8), V10, background_depth=near_wall
    )
    assert (hidden == 3).all()


def test_dst_labels_equal_resampled_source_labels():
    """Rays go through the source pixel resample_ids samples: labelling at source resolution and
    resampling gives exactly the destination labelling (tiny geometry)."""
    geom = TINY_GEOMETRY
    caps, _, _ = _scene()
    cam = aimed_pose(np.array([0.0, 0.0, 92.0]), 0.15, CAMERA_VARIANTS["tp_default"])
    m = camera_matrices(cam, geom.src_width, geom.src_height)
    ys, xs = np.mgrid[0 : geom.src_height, 0 : geom.src_width]
    rays = PixelRays.through(xs, ys, m.world_to_clip, m.world_to_view, geom.src_width, geom.src_height)
    _, actor, cap = cast_capsules(rays, caps)
    src = hits_to_part_ids(actor, cap, 0).reshape(geom.src_height, geom.src_width)
    dst = render_capsules(caps, m.world_to_clip, m.world_to_view, np.zeros((64, 128), np.uint8), geom)
    assert np.array_equal(resample_ids(src, geom), dst)
    sx, sy = dst_sample_coords(geom)
    assert sx.shape == (64 * 128,) and sy.max() < geom.src_height


def test_throughput_at_832x480(capsys):
    caps, w2c, w2v = _scene()
    drawn = render_capsules(caps, w2c, w2v, np.zeros((480, 832), np.uint8), V10)
    ue = collapse_parts(drawn)
    all_player = np.full((480, 832), 10, np.uint8)
    timings = {}
    for name, fn in {
        "label_parts": lambda: label_parts(ue, w2c, w2v, caps, V10),
        "label_parts_all_pixels_player": lambda: label_parts(all_player, w2c, w2v, caps, V10),
        "render_capsules": lambda: render_capsules(caps, w2c, w2v, np.zeros((480, 832), np.uint8), V10),
        "ground_points": lambda: ground_points(w2c, w2v, 0.0, V10),
    }.items():
        fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        timings[name] = (time.perf_counter() - t0) / 3
    with capsys.disabled():
        print(
            "\n832x480 per frame: "
            + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in timings.items())
            + f" (character pixels {int((ue >= 10).sum())})"
        )
    assert timings["label_parts"] < 5.0  # generous: shared CI cores; the target is well under 1 s
