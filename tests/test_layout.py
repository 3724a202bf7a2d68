import numpy as np
import pytest
import torch

from gc25d_core.config import GeometryConfig, TimelineConfig
from gc25d_core.layout import (
    META_SPEC,
    Layout,
    LayoutError,
    Shapes,
    clip_id,
    parse_clip_id,
    read_cond,
    read_cond_ext,
    read_latents,
    read_meta,
    write_cond,
    write_cond_ext,
    write_latents,
    write_meta,
)

V10 = Shapes(GeometryConfig(), TimelineConfig())
TINY = Shapes(
    GeometryConfig(src_width=200, src_height=96, crop_x0=6, crop_x1=194, dst_width=128, dst_height=64),
    TimelineConfig(),
)


def test_clip_id_is_zero_padded_and_parsed():
    assert clip_id("arena", "R10_s1512", 96) == "arena__R10_s1512__000096"
    assert clip_id("s", "r", 0) == "s__r__000000"
    assert clip_id("s", "r", 1234567) == "s__r__1234567"
    assert parse_clip_id("arena__R10_s1512__000096") == ("arena", "R10_s1512", 96)
    for bad in ("a__b__96", "a__b", "../x__r__000000", "a/b__r__000000", "a__b__c__000000"):
        with pytest.raises(ValueError):
            parse_clip_id(bad)
    with pytest.raises(ValueError, match="scene"):
        clip_id("../etc", "r", 0)


def test_spec_shapes():
    assert V10.latent == (48, 21, 30, 52)
    assert V10.cond == (81, 480, 832)
    assert V10.cond_ext == (28, 480, 832)
    assert V10.meta_frames(False) == 81 and V10.meta_frames(True) == 109


def test_layout_paths_reject_traversal(tmp_path):
    lay = Layout(tmp_path)
    assert lay.cond("s__r__000096") == tmp_path / "cond" / "s__r__000096.npz"
    assert lay.latents("s__r__000096") == tmp_path / "latents" / "s__r__000096.pt"
    assert lay.clips_jsonl == tmp_path / "index" / "clips.jsonl"
    with pytest.raises(ValueError):
        lay.meta("../../x__r__000000")


def test_cond_round_trip_and_validation(tmp_path):
    lay = Layout(tmp_path)
    ids = np.zeros(TINY.cond, np.uint8)
    ids[:, 10:20, 30:40] = 12
    write_cond(lay, "s__r__000000", ids, TINY)
    assert np.array_equal(read_cond(lay, "s__r__000000", TINY), ids)
    assert not list((tmp_path / "cond").glob(".tmp-*"))
    with pytest.raises(LayoutError, match="'ids' expected"):
        read_cond(lay, "s__r__000000", V10)  # wrong shape for v10
    bad = ids.copy()
    bad[0, 0, 0] = 7
    with pytest.raises(LayoutError, match=r"values \[7\]"):
        write_cond(lay, "s__r__000096", bad, TINY)
    with pytest.raises(LayoutError, match="does not exist"):
        read_cond(lay, "s__r__000192", TINY)
    lay.cond("s__r__000288").write_bytes(b"not a zip")
    with pytest.raises(LayoutError, match="unreadable"):
        read_cond(lay, "s__r__000288", TINY)


def test_cond_ext_keys(tmp_path):
    path = tmp_path / "cond_ext" / "s__r__000000.npz"
    arrays = {
        "ids": np.zeros(TINY.cond_ext, np.uint8),
        "blocks": np.zeros((7, 5), np.uint8),
        "prompts": ["p"] * 7,
    }
    write_cond_ext(path, arrays, TINY)
    got = read_cond_ext(path, TINY)
    assert got["prompts"].tolist() == ["p"] * 7 and got["blocks"].shape == (7, 5)
    with pytest.raises(LayoutError, match="'blocks'"):
        write_cond_ext(path, {**arrays, "blocks": np.zeros((6, 5), np.uint8)}, TINY)


def _meta(f: int) -> dict[str, np.ndarray]:
    out = {}
    for key, (dtype, trailing) in META_SPEC.items():
        if dtype == "U":
            out[key] = np.array(["idle"] * f)
        else:
            out[key] = np.zeros((f, *trailing), dtype)
    return out


def test_meta_exact_keys_dtypes(tmp_path):
    lay = Layout(tmp_path)
    assert set(META_SPEC) == {
        "world_to_clip",
        "world_to_view",
        "projection",
        "orthographic",
        "fov_x_deg",
        "ortho_width_cm",
        "frame_offset_cm",
        "capsules",
        "actor_pos",
        "ground_z",
        "player_state",
        "boss_state",
        "player_px",
        "boss_px",
    }
    assert META_SPEC["capsules"] == (np.float32, (2, 12, 7))
    write_meta(lay, "s__r__000000", _meta(109), TINY, has_ext=True)
    got = read_meta(lay, "s__r__000000", TINY, has_ext=True)
    assert got["world_to_clip"].dtype == np.float64 and got["world_to_clip"].shape == (109, 16)
    with pytest.raises(LayoutError, match="expected"):
        read_meta(lay, "s__r__000000", TINY, has_ext=False)  # 109 frames but no ext → 81 expected
    m = _meta(81)
    m["fov_x_deg"] = m["fov_x_deg"].astype(np.float64)
    with pytest.raises(LayoutError, match="fov_x_deg"):
        write_meta(lay, "s__r__000096", m, TINY, has_ext=False)
    m = _meta(81)
    m["extra"] = np.zeros(81)
    with pytest.raises(LayoutError, match="unexpected \\['extra'\\]"):
        write_meta(lay, "s__r__000096", m, TINY, has_ext=False)


def _latent_record(cid="s__r__000096"):
    return {
        "latent": torch.zeros(TINY.latent, dtype=torch.bfloat16),
        "prompts": ["p"] * 21,
        "actions_block": torch.zeros(21, 5, dtype=torch.uint8),
        "clip_id": cid,
        "subset": "v10_real",
        "scene": "s",
        "run": "r",
        "start": 96,
    }


def test_latents_round_trip(tmp_path):
    lay = Layout(tmp_path)
    path = write_latents(lay, _latent_record(), TINY)
    got = read_latents(path, TINY)
    assert got["latent"].shape == (48, 21, 4, 8) and got["start"] == 96
    with pytest.raises(LayoutError, match="disagrees"):
        write_latents(lay, {**_latent_record(), "start": 192}, TINY)
    with pytest.raises(LayoutError, match="'latent'"):
        write_latents(lay, {**_latent_record(), "latent": torch.zeros(TINY.latent)}, TINY)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(LayoutError, match="unreadable"):
        read_latents(path, TINY)


def test_latents_reader_refuses_pickled_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "latents" / "s__r__000096.pt"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        pickle.dump({"latent": Evil()}, f)
    with pytest.raises(LayoutError, match="unreadable"):
        read_latents(path, TINY)
