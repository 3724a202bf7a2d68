import numpy as np
import pytest

from gc25d_core.timeline import (
    blocks20,
    cell_blocks,
    cell_frames,
    check_clip_start,
    clip_end,
    clip_starts,
    ext_blocks,
    extension_frames,
    extension_valid,
    frame_to_cell,
)


def test_cells():
    assert cell_frames(0) == [0]
    assert cell_frames(1) == [1, 2, 3, 4]
    assert cell_frames(20) == [77, 78, 79, 80]
    all_frames = [f for c in range(21) for f in cell_frames(c)]
    assert all_frames == list(range(81))  # 81 frames = 21 cells, no gaps or overlaps
    assert cell_frames(21) == [81, 82, 83, 84] and cell_frames(27) == [105, 106, 107, 108]
    assert [frame_to_cell(f) for f in (0, 1, 4, 5, 76, 77, 80)] == [0, 1, 1, 2, 19, 20, 20]


def test_clip_starts_and_ends():
    assert clip_end(0) == 81 and clip_end(96) == 177  # end exclusive
    for bad in (1, 48, 95, -96):
        with pytest.raises(ValueError, match="multiple of 96"):
            check_clip_start(bad)
    assert clip_starts(81) == [0]
    assert clip_starts(80) == []
    assert clip_starts(96 + 81) == [0, 96]
    assert clip_starts(96 + 80) == [0]


def test_blocks20_and_cell_blocks():
    actions = np.arange(60 * 5, dtype=np.uint8).reshape(60, 5) % 3
    actions[:, 0] = np.arange(60)  # block index in column 0
    b = blocks20(actions, 96)  # s//4 = 24 → blocks 24..43
    assert b.shape == (20, 5) and b.dtype == np.uint8
    assert b[:, 0].tolist() == list(range(24, 44))
    cb = cell_blocks(b)
    assert cb.shape == (21, 5)
    assert cb[0, 0] == cb[1, 0] == 24  # cell 0 = cell 1
    assert cb[20, 0] == 43  # cell j takes block j-1
    with pytest.raises(ValueError, match="needs blocks"):
        blocks20(actions[:40], 96)


def test_extension_cells_and_blocks():
    assert extension_frames(96) == list(range(96 + 81, 96 + 109))  # s+81 … s+108
    actions = np.zeros((60, 5), np.uint8)
    actions[:, 0] = np.arange(60)
    eb = ext_blocks(actions, 96)
    assert eb.shape == (7, 5) and eb[:, 0].tolist() == list(range(24 + 20, 24 + 27))  # s//4+20 … s//4+26


def test_extension_validity():
    n = 300
    ep = [0] * n
    cam = ["a"] * n
    assert extension_valid(ep, cam, 0)
    assert extension_valid(ep, cam, 96)
    assert not extension_valid(ep[:108], cam[:108], 0)  # frame s+108 missing
    assert extension_valid(ep[:109], cam[:109], 0)  # frames 0..108 exactly
    ep2 = list(ep)
    ep2[108] = 1  # episode changes at the last extension frame
    assert not extension_valid(ep2, cam, 0)
    cam2 = list(cam)
    cam2[96 + 81] = "b"  # camera variant changes at the first extension frame
    assert not extension_valid(ep, cam2, 96)
    assert extension_valid(ep, cam2, 0)  # frames 0..108 are unaffected
