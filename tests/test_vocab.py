import numpy as np
import pytest

from gc25d_core import vocab as V


def test_raw_ids():
    assert V.STATIC_IDS == {
        0: "sky",
        1: "terrain",
        2: "paving",
        3: "architecture",
        4: "rock",
        5: "vegetation",
        6: "prop",
    }
    assert V.NUM_STATIC == 7  # "static" = raw id < 7 (masking, canvas agreement)
    assert V.PLAYER_PART_IDS == (10, 12, 13, 14, 15, 16)
    assert V.BOSS_PART_IDS == (11, 17, 18, 19, 20, 21)
    assert V.UNKNOWN == 255


def test_vocabularies():
    assert V.valid_raw_ids("parts") == (
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        21,
        255,
    )
    assert V.valid_raw_ids("ids") == (0, 1, 2, 3, 4, 5, 6, 10, 11, 255)
    assert V.num_classes("parts") == 20 and V.num_classes("ids") == 10
    assert 64 * V.num_classes("parts") == 1280  # sem-cond input width (DESIGN §4.2)
    m = V.raw_to_class_map("parts")
    assert m[0] == 0 and m[10] == 7 and m[21] == 18 and m[255] == 19
    with pytest.raises(ValueError):
        V.valid_raw_ids("nope")


def test_collapse_parts():
    parts = np.array(list(V.valid_raw_ids("parts")), np.uint8)
    out = V.collapse_parts(parts)
    expected = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 10: 10, 11: 11, 255: 255}
    expected.update({p: 10 for p in (12, 13, 14, 15, 16)})
    expected.update({p: 11 for p in (17, 18, 19, 20, 21)})
    assert dict(zip(parts.tolist(), out.tolist(), strict=True)) == expected
    assert out.dtype == np.uint8
    assert set(np.unique(out).tolist()) <= set(V.valid_raw_ids("ids"))


def test_invalid_values_are_listed():
    ids = np.array([[0, 7, 9], [22, 255, 7]], np.uint8)
    with pytest.raises(ValueError) as e:
        V.check_ids(ids, "parts", "cond/x.npz:ids")
    assert "[7, 9, 22]" in str(e.value) and "cond/x.npz:ids" in str(e.value)
    with pytest.raises(ValueError, match=r"\[12\]"):
        V.raw_to_class(np.array([12]), "ids")
    assert V.raw_to_class(np.array([0, 21, 255]), "parts").tolist() == [0, 18, 19]
    with pytest.raises(ValueError, match=r"\[8\]"):
        V.collapse_parts(np.array([8], np.uint8))


def test_invalid_values_uint8_count_path_matches_the_sort_path():
    rng = np.random.default_rng(0)
    ids = rng.choice(np.array([0, 3, 6, 10, 21, 255, 7, 200], np.uint8), size=(4, 16, 16))
    assert V.invalid_values(ids, "parts") == V.invalid_values(ids.astype(np.int32), "parts") == [7, 200]
    assert V.invalid_values(ids[ids != 7][ids[ids != 7] != 200], "parts") == []
