"""The ids probe (gc25d_core/eval/ids_probe.py): it reads the code world's frames back into their ids,
a frame that does not show the scene scores low, and the fit is the same every time."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from gc25d_core.codeworld import TINY_GEOMETRY, get_preset
from gc25d_core.codeworld.presets import stable_seed
from gc25d_core.codeworld.render import render_frame
from gc25d_core.codeworld.sim import simulate
from gc25d_core.codeworld.writer import scene_cache
from gc25d_core.config import load_config
from gc25d_core.eval.ids_probe import (
    IdsProbe,
    ProbeSettings,
    ensure_probe,
    fit_probe,
    load_probe,
    save_probe,
    score_frames,
    scores_from_ids,
)
from gc25d_core.geometry import resample_ids, resample_rgb
from gc25d_core.vocab import PLAYER_PART_IDS
from tests.codeworld_fixtures import TinyRaw

# a short fit on 24 frames of one run: seconds, enough to read that run's scene
SETTINGS = ProbeSettings(steps=300, batch=1024, per_class=2000)


@pytest.fixture(scope="module")
def pairs() -> tuple[np.ndarray, np.ndarray]:
    """48 frames (every 2nd of the first 96) of the tiny preset's P9_golden run at 128×64: RGB and
    the "parts" ids on the destination grid."""
    spec = next(s for s in get_preset("tiny").runs(0) if s.run == "P9_golden_s2909")
    scene_of = scene_cache(spec)
    _, states = simulate(spec, scene_of)
    g = TINY_GEOMETRY
    texture_seed = stable_seed(spec.scene_seed, "texture")
    rgb, ids = [], []
    for st in itertools.islice(states, 0, 96, 2):
        img = render_frame(scene_of(st.look), st, g.src_width, g.src_height, spec.style, texture_seed)
        rgb.append(resample_rgb(img.rgb, g))
        ids.append(resample_ids(img.parts, g))
    return np.stack(rgb), np.stack(ids)


@pytest.fixture(scope="module")
def probe(pairs) -> IdsProbe:
    rgb, ids = pairs
    return fit_probe(rgb[::2], ids[::2], SETTINGS)[0]


def test_scores_on_known_ids():
    ids = np.zeros((2, 4, 8), np.uint8)  # sky
    ids[:, 2:] = 1  # terrain below
    ids[:, 2:, 3:5] = 10  # the player's core
    ids[:, 3, 3] = 14  # its left leg
    same = scores_from_ids(ids, ids)
    assert same["miou"] == same["miou_parts"] == same["player_iou"] == same["pixel_acc"] == 1.0
    # the player (4 of a frame's 16 lower pixels) read as terrain: its IoU is 0, terrain's 12 / 16
    lost = ids.copy()
    lost[np.isin(lost, PLAYER_PART_IDS)] = 1
    s = scores_from_ids(lost, ids)
    assert s["player_iou"] == 0.0 and s["player_parts_miou"] == 0.0
    assert s["miou"] == pytest.approx((1 + 12 / 16 + 0) / 3)
    # two parts of the player swapped: the player is found, its parts are not
    swapped = np.where(ids == 14, 10, np.where(ids == 10, 14, ids)).astype(np.uint8)
    s = scores_from_ids(swapped, ids)
    assert s["player_iou"] == 1.0 and s["player_parts_miou"] == 0.0
    # pixels the conditioning ids leave UNKNOWN (the live world's unseen places) are not scored
    unknown = ids.copy()
    unknown[:, :, 6:] = 255
    guess = ids.copy()
    guess[:, :, 6:] = 4  # whatever the frame shows there: rock
    assert scores_from_ids(guess, unknown)["miou"] == 1.0
    # a player absent from the ids is not scored
    assert math.isnan(scores_from_ids(lost, lost)["player_iou"])


def test_probe_reads_frames_it_was_not_fitted_on(pairs, probe):
    rgb, ids = pairs
    s = score_frames(rgb[1::2], ids[1::2], probe)
    assert s["miou"] > 0.55, s
    assert s["player_iou"] > 0.6, s
    assert s["pixel_acc"] > 0.8, s


def test_a_frame_without_the_scene_scores_low(pairs, probe):
    rgb, ids = pairs
    truth = score_frames(rgb[1::2], ids[1::2], probe)
    blank = np.full_like(rgb[1::2], 128)
    rng = np.random.default_rng(0)
    flat = rgb[1::2].reshape(len(blank), -1, 3)
    shuffled = np.stack([f[rng.permutation(len(f))] for f in flat]).reshape(blank.shape)
    for name, frames in (("blank", blank), ("pixels shuffled", shuffled)):
        s = score_frames(frames, ids[1::2], probe)
        assert s["miou"] < truth["miou"] / 2, (name, s, truth)
    # a frame that shows another moment: the player and the sky line elsewhere
    other = score_frames(rgb[1::2][::-1], ids[1::2], probe)
    assert other["player_iou"] < truth["player_iou"] / 2, (other, truth)


def test_fit_is_deterministic_and_the_file_checked(pairs, tmp_path):
    rgb, ids = pairs
    quick = ProbeSettings(steps=3, batch=64, hidden=8, per_class=200)
    a, b = fit_probe(rgb[:8], ids[:8], quick)[0], fit_probe(rgb[:8], ids[:8], quick)[0]
    for (k, va), vb in zip(a.net.state_dict().items(), b.net.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    path = tmp_path / "probe.safetensors"
    digest = save_probe(a, path)
    assert save_probe(b, tmp_path / "again.safetensors") == digest
    back = load_probe(path, expected_sha256=digest)
    assert back.settings == quick
    assert np.array_equal(back.predict(rgb[:2]), a.predict(rgb[:2]))
    with pytest.raises(ValueError, match="sha256"):
        load_probe(path, expected_sha256="0" * 64)


def test_ensure_probe_fits_once_per_inputs(tiny_raw: TinyRaw, tmp_path):
    cfg = load_config("tiny", {"raw": {"root": str(tiny_raw.root)}, "paths": {"data_root": str(tmp_path)}})
    quick = ProbeSettings(steps=2, batch=64, hidden=8, per_class=200, every=40)
    probe, rec = ensure_probe(cfg, quick)
    assert rec["fitted"] and rec["frames"] > 0
    record = json.loads((tmp_path / "ids_probe.json").read_text())
    assert record["sha256"] == rec["sha256"]
    assert record["path"] == "ids_probe.safetensors" and str(tmp_path) not in json.dumps(record)
    again, rec2 = ensure_probe(cfg, quick)
    assert not rec2["fitted"] and rec2["sha256"] == rec["sha256"]
    # other settings are other inputs: fitted again
    _, rec3 = ensure_probe(cfg, ProbeSettings(steps=3, batch=64, hidden=8, per_class=200, every=40))
    assert rec3["fitted"] and rec3["inputs_key"] != rec["inputs_key"]


@pytest.mark.parametrize("k", [3, 7, 15, 31])
def test_box_mean_in_two_passes_is_the_square_box_mean_cut_at_the_edges(k: int) -> None:
    """The features' local means: two 1-D passes give the k × k box's mean, the box cut at the
    frame's edges (a frame narrower than the box included), as one k × k pool gives it."""
    from gc25d_core.eval.ids_probe import _box_mean

    x = torch.randn(2, 6, 40, 24, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    square = torch.nn.functional.avg_pool2d(x, k, 1, k // 2, count_include_pad=False)
    got = _box_mean(x, k)
    assert got.shape == x.shape
    torch.testing.assert_close(got, square, rtol=0, atol=1e-12)
    # a pixel's box by hand, at a corner: only the pixels inside the frame count
    r = k // 2
    assert torch.allclose(got[:, :, 0, 0], x[:, :, : r + 1, : r + 1].mean((2, 3)), atol=1e-12)
