"""The extension canvas (SPEC §8 stage 3): camera geometry against capsules.py, the pyramid, the
pop-up points against the code world's true depth, latest wins, unseen = 255, characters from the meta
capsules, agreement on the code world, and the task."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from gc25d_core.canvas import (
    ROLE_UPRIGHT,
    CanvasParams,
    FrameCamera,
    Pyramid,
    build_canvas,
    canvas_plane_z,
    clip_canvas,
    ext_canvas_ids,
    ground_hits,
    pixel_roles,
    project_dst,
    ray_dirs,
    render_frames,
    render_static,
    static_agreement,
)
from gc25d_core.capsules import PixelRays, dst_sample_coords, ground_points, render_capsules
from gc25d_core.geometry import src_to_dst
from gc25d_core.layout import Shapes, read_cond, read_cond_ext, read_meta
from gc25d_core.preprocess.canvas_task import ext_canvas_task, ext_text
from gc25d_core.preprocess.tasks import RunCache
from gc25d_core.vocab import CHARACTER_IDS, UNKNOWN

from .canvas_fixtures import MiniWorld


@pytest.fixture(scope="module")
def clip(mini_world: MiniWorld):
    shapes = Shapes.of(mini_world.cfg)
    meta = read_meta(mini_world.layout, mini_world.row.clip_id, shapes, True)
    cond = read_cond(mini_world.layout, mini_world.row.clip_id, shapes)
    return meta, cond


def _is_char(a: np.ndarray) -> np.ndarray:
    return np.isin(a, sorted(CHARACTER_IDS))


def test_plane_and_rays_match_capsules(mini_world: MiniWorld, clip):
    meta, _ = clip
    g = mini_world.cfg.geometry
    m, v = meta["world_to_clip"][10], meta["world_to_view"][10]
    cam = FrameCamera.of(m, v, 0.0, g.src_width, g.src_height)
    sx, sy = dst_sample_coords(g)
    hit = ground_hits(cam, sx, sy, g)
    dx, dy = src_to_dst(sx, sy, g)
    ref = ground_points(m, v, 0.0, g, np.stack([dx, dy], axis=-1))
    ok = np.isfinite(ref).all(-1)
    assert (hit.hit == ok).mean() > 0.995
    both = ok & hit.hit
    np.testing.assert_allclose(hit.coords[both], ref[both, :2], rtol=1e-6, atol=1e-4)
    rays = PixelRays.through(sx[::37], sy[::37], m, v, g.src_width, g.src_height)
    np.testing.assert_allclose(ray_dirs(cam, sx[::37], sy[::37]), rays.direction, atol=1e-9)
    # the ground points project back onto their pixels, at the view depth of the plane hit
    px, py, depth, _ = project_dst(cam, ref[both], g)
    np.testing.assert_allclose(np.stack([px, py], 1), np.stack([dx, dy], 1)[both], atol=1e-6)
    np.testing.assert_allclose(depth, hit.depth[both], rtol=1e-9)


def test_pop_up_depth_against_the_code_world(mini_world: MiniWorld, clip):
    """Upright pixels stand at their true distance (the scene's ray depth), far better than the
    ground-plane smear; rock / vegetation patches on the plane vote ground, standing ones upright."""
    from gc25d_core.canvas import _cameras, upright_points
    from gc25d_core.codeworld import get_preset
    from gc25d_core.codeworld.scene import GridRays, build_scene
    from gc25d_core.codeworld.scene import render_static as scene_static
    from gc25d_core.geometry import index_maps

    meta, cond = clip
    g, tl, row = mini_world.cfg.geometry, mini_world.cfg.timeline, mini_world.row
    spec = next(s for s in get_preset("full").runs(0) if s.run == row.run)
    scene = build_scene(spec.scene_seed, spec.look_at(row.start + 40).seed)
    n = tl.num_frames
    cams = _cameras(meta["world_to_clip"][:n], meta["world_to_view"][:n], canvas_plane_z(meta, tl), g)
    sx, sy = dst_sample_coords(g)
    hits = [ground_hits(c, sx, sy, g) for c in cams]
    roles = pixel_roles(cond, cams, hits, g, CanvasParams())
    iy, ix = index_maps(g)
    pop, smear, role_ok = [], [], []
    for k in (20, 40, 60):
        pts, idx = upright_points(roles[k], cond[k].reshape(-1), cams[k], hits[k], sx, sy, g)
        rays = GridRays.build(
            ix, iy, meta["world_to_clip"][k], meta["world_to_view"][k], g.src_width, g.src_height
        )
        true = scene_static(scene, rays)
        t_true = true.t.reshape(-1)
        pop.append(np.linalg.norm(pts - cams[k].eye, axis=1) / t_true[idx])
        on = idx[hits[k].hit[idx]]  # the old model's smear: the plane hit of the same pixels
        smear.append(
            np.linalg.norm(np.c_[hits[k].coords[on], np.full(len(on), cams[k].z)] - cams[k].eye, axis=1)
            / t_true[on]
        )
        flat_normal = np.abs(true.normal.reshape(-1, 3)[:, 2]) > 0.99
        mixed = np.isin(cond[k].reshape(-1), (4, 5)) & np.isfinite(t_true)
        role_ok.append(
            (roles[k][mixed] == ROLE_UPRIGHT) != (flat_normal[mixed] & (true.t.reshape(-1)[mixed] > 0))
        )
    pop_err, smear_err = np.abs(np.concatenate(pop) - 1), np.abs(np.concatenate(smear) - 1)
    # measured: median relative error 0.13 (pop-up) against 0.63 (plane smear); roles right 0.67
    assert np.median(pop_err) < 0.2 and np.median(smear_err) > 3 * np.median(pop_err)
    assert np.mean(np.concatenate(role_ok)) > 0.6


def test_pyramid_levels_fallback_and_latest_wins():
    pyr = Pyramid(1.0, 3)
    pts = np.array([[0.5, 0.5], [0.5, 0.5], [3.2, 3.9]])
    pyr.write(0, pts, np.array([(1 << 8) | 4, (2 << 8) | 1, (1 << 8) | 6], np.uint16))
    pyr.propagate()
    got = pyr.read(
        np.array([[0.5, 0.5], [3.5, 3.5], [1.5, 0.5], [2.5, 2.5]]), np.zeros(4, int), np.zeros(4, int)
    )
    assert list(got & 0xFF) == [1, 6, 0, 0]  # the later stamp wins; empty cells stay 0
    # (1.5, 0.5) is empty at level 0 but its level-1 parent (0..2 cm) holds the stamp-2 value
    got = pyr.read(np.array([[1.5, 0.5], [5.5, 5.5]]), np.zeros(2, int), np.ones(2, int))
    assert list(got & 0xFF) == [1, 0]
    # a write outside grows the level and keeps what it held
    pyr.write(0, np.array([[-40.5, 90.0]]), np.array([(3 << 8) | 5], np.uint16))
    got = pyr.read(np.array([[-40.5, 90.0], [0.5, 0.5]]), np.zeros(2, int), np.zeros(2, int))
    assert list(got & 0xFF) == [5, 1] and pyr.num_cells > 64


def test_self_render_and_latest_frame_wins(mini_world: MiniWorld, clip):
    meta, cond = clip
    g, tl = mini_world.cfg.geometry, mini_world.cfg.timeline
    k = 40
    z = canvas_plane_z(meta, tl)
    m, v = meta["world_to_clip"][[k, k]], meta["world_to_view"][[k, k]]
    static = cond[k] < 7
    # another id of the same kind (terrain ↔ paving, architecture ↔ prop, rock ↔ vegetation): the
    # same placement, so the frame that wins shows through unmixed
    swap = np.array([0, 2, 1, 6, 5, 4, 3], np.uint8)
    other = np.where(static, swap[np.minimum(cond[k], 6)], cond[k]).astype(np.uint8)
    assert (other != cond[k])[static & (cond[k] > 0)].all()
    for frames, want in (((cond[k], other), other), ((other, cond[k]), cond[k])):
        canvas = build_canvas(np.stack(frames), m, v, z, g)
        got = render_static(canvas, m[0], v[0])
        alone = render_static(build_canvas(want[None], m[:1], v[:1], z, g), m[0], v[0])
        # the later frame wins everywhere: the same as its canvas alone
        assert (got == alone).mean() > 0.995
        # which gives the frame back (pixels without a foot in view are dropped; splat rounding)
        assert (got[static] == want[static]).mean() > 0.93  # measured 0.96
        assert ((got < 7) | (got == UNKNOWN)).all()  # the static layer holds no character ids


def test_unseen_is_255(mini_world: MiniWorld, clip):
    meta, cond = clip
    g, tl = mini_world.cfg.geometry, mini_world.cfg.timeline
    canvas = clip_canvas(cond, meta, g, tl, frames=slice(0, 1))
    m = np.asarray(meta["world_to_clip"][0]).reshape(4, 4)
    v = np.asarray(meta["world_to_view"][0]).reshape(4, 4)
    p = np.asarray(meta["projection"][0]).reshape(4, 4)
    np.testing.assert_allclose(p @ v, m, rtol=1e-9, atol=1e-9)
    eye = np.linalg.inv(v)[:3, 3]
    turn = np.diag([-1.0, -1.0, 1.0, 1.0])  # 180° about the vertical through the eye
    to_eye, back = np.eye(4), np.eye(4)
    to_eye[:3, 3], back[:3, 3] = -eye, eye
    v_back = v @ back @ turn @ to_eye
    behind = render_static(canvas, p @ v_back, v_back)
    assert (behind == UNKNOWN).mean() > 0.95
    # frames that hold no static pixel leave the whole canvas unseen
    empty = build_canvas(
        np.full((2, g.dst_height, g.dst_width), 10, np.uint8),
        meta["world_to_clip"][:2],
        meta["world_to_view"][:2],
        0.0,
        g,
    )
    assert (render_static(empty, m, v) == UNKNOWN).all()


def test_extension_characters_from_capsules(mini_world: MiniWorld, clip):
    meta, cond = clip
    cfg, lay, row = mini_world.cfg, mini_world.layout, mini_world.row
    g, tl = cfg.geometry, cfg.timeline
    ext = ext_canvas_ids(cond, meta, g, tl)
    assert ext.shape == (tl.num_ext_frames, g.dst_height, g.dst_width) and ext.dtype == np.uint8
    canvas = clip_canvas(cond, meta, g, tl)
    n = tl.num_frames
    for j in (0, 13, 27):
        f = n + j
        blank = np.full((g.dst_height, g.dst_width), UNKNOWN, np.uint8)
        chars = render_capsules(
            meta["capsules"][f], meta["world_to_clip"][f], meta["world_to_view"][f], blank, g
        )
        drawn = chars != UNKNOWN
        assert drawn.sum() > 20  # the player is in view
        np.testing.assert_array_equal(ext[j][drawn], chars[drawn])  # capsules on top
        bg = render_static(canvas, meta["world_to_clip"][f], meta["world_to_view"][f])
        np.testing.assert_array_equal(ext[j][~drawn], bg[~drawn])
        assert not _is_char(bg).any()
    # against the real (look-changed) extension: the characters agree, the statics were never seen
    real = read_cond_ext(lay.cond_ext(row.clip_id), Shapes.of(cfg))["ids"]
    a, b = _is_char(ext), _is_char(real)
    assert (a & b).sum() / (a | b).sum() > 0.9  # measured 0.99


def test_agreement_on_the_code_world(mini_world: MiniWorld, clip):
    """Canvas of frames 0..80 re-rendered at in-look frames against the real cond's statics."""
    meta, cond = clip
    g, tl = mini_world.cfg.geometry, mini_world.cfg.timeline
    canvas = clip_canvas(cond, meta, g, tl)
    frames = list(range(0, tl.num_frames, 8))
    got = static_agreement(render_frames(canvas, meta, frames), cond[frames])
    assert got["agreement"] > 0.92 and got["coverage"] > 0.97  # measured 0.943, 0.986
    # forward: frames 53..80 (28 frames, like the extension) from the canvas of 0..52
    early = clip_canvas(cond, meta, g, tl, frames=slice(0, 53))
    fwd = static_agreement(render_frames(early, meta, range(53, 81, 3)), cond[53:81:3])
    assert fwd["agreement"] > 0.88 and 0.0 < fwd["unknown"] < 0.3  # measured 0.93, 0.06
    # one frame's canvas re-rendered with its own camera gives that frame back
    for k in (10, 70):
        own = clip_canvas(cond, meta, g, tl, frames=slice(k, k + 1))
        assert static_agreement(render_frames(own, meta, [k]), cond[k : k + 1])["agreement"] > 0.98


def test_task_build_is_done_and_text(mini_world: MiniWorld, clip, tmp_path):
    cfg, lay, row = mini_world.cfg, mini_world.layout, mini_world.row
    shapes = Shapes.of(cfg)
    task = ext_canvas_task(cfg)
    assert task.name == "ext_canvas" and task.outputs(row) == [lay.cond_ext_canvas(row.clip_id)]
    assert not task.is_done(row)
    nbytes = task.build(row)
    assert nbytes == lay.cond_ext_canvas(row.clip_id).stat().st_size > 0
    assert task.is_done(row)
    got = read_cond_ext(lay.cond_ext_canvas(row.clip_id), shapes)  # validates keys, dtypes, shapes, vocab
    raw = read_cond_ext(lay.cond_ext(row.clip_id), shapes)
    np.testing.assert_array_equal(got["blocks"], raw["blocks"])
    np.testing.assert_array_equal(got["prompts"], raw["prompts"])
    meta, cond = clip
    np.testing.assert_array_equal(got["ids"], ext_canvas_ids(cond, meta, cfg.geometry, cfg.timeline))
    # without cond_ext the blocks and prompts come from the raw actions, identically
    moved = tmp_path / "cond_ext.npz"
    shutil.move(lay.cond_ext(row.clip_id), moved)
    try:
        blocks, prompts = ext_text(lay, shapes, row, RunCache(cfg.raw.root), cfg)
    finally:
        shutil.move(moved, lay.cond_ext(row.clip_id))
    np.testing.assert_array_equal(blocks, raw["blocks"])
    np.testing.assert_array_equal(prompts, raw["prompts"])
    # a torn file is not done
    path = lay.cond_ext_canvas(row.clip_id)
    path.write_bytes(path.read_bytes()[:100])
    assert not task.is_done(row)
    with pytest.raises(ValueError, match="has no extension"):
        task.build(row.model_copy(update={"has_ext": False}))
