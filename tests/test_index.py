import json

import pytest

from gc25d_core.config import V10_VAL_RUNS, DropListConfig, load_config
from gc25d_core.index import IndexBuildError, build_and_write, build_index, read_index
from gc25d_core.layout import Layout
from gc25d_core.raw_layout import RawLayoutError, RawSource

from .conftest import RunSpec, write_index_raw


def _cfg(tmp_path, **index):
    return load_config("tiny", {"paths": {"data_root": str(tmp_path / "data")}, "index": index})


def test_v10_val_runs_are_the_spec_ten():
    assert V10_VAL_RUNS == (
        "R10_s1512",
        "R10_s3512",
        "R10_s5512",
        "R10_s7511",
        "R10_s9511",
        "P9_golden_s2909",
        "P9_autumn_s4908",
        "P9C_golden_s6946",
        "P9C_default_s8946",
        "P9C_snow_s10945",
    )
    assert load_config("v10").index.val_runs == V10_VAL_RUNS


def test_rows_have_every_spec_column(tmp_path):
    raw = write_index_raw(
        tmp_path / "raw",
        [
            RunSpec(
                "R10_s1512",
                num_frames=300,
                look_changes={96 + 81: "look_1"},
                dead_frames={5, 6},
                event_frames={10, 20, 30},
            ),
            RunSpec("R10_s2000", num_frames=200, episode_changes={150: 1}),
            RunSpec(
                "P9_golden_s2909",
                subset="v9_stylized",
                scene="forest",
                num_frames=200,
                framed=True,
                camera_changes={100: "cam_b"},
                ortho_frames={3},
            ),
        ],
    )
    cfg = _cfg(tmp_path, val_runs=["R10_s1512", "P9_golden_s2909"])
    summary = build_and_write(raw, cfg)
    rows = {r.clip_id: r for r in read_index(Layout(cfg.paths.data_root))}
    spec_cols = {
        "clip_id",
        "subset",
        "scene",
        "run",
        "start",
        "end",
        "split",
        "drop",
        "drop_reason",
        "episode",
        "camera_variant",
        "look_name",
        "centered",
        "n_events",
        "dead_frac",
        "has_ext",
        "ortho",
    }
    line = (cfg.paths.data_root / "index" / "clips.jsonl").read_text().splitlines()[0]
    assert spec_cols <= set(json.loads(line))
    assert summary["num_clips"] == 3 + 2 + 2
    r0 = rows["arena__R10_s1512__000000"]
    assert (r0.start, r0.end, r0.split, r0.n_events, r0.dead_frac) == (0, 81, "val", 3, 2 / 81)
    assert r0.has_ext and not r0.ext_look_change
    r1 = rows["arena__R10_s1512__000096"]
    assert r1.has_ext and r1.ext_look_change  # look swaps exactly at s+81
    assert not rows["arena__R10_s1512__000192"].has_ext  # 192+109 > 300 frames
    assert rows["arena__R10_s2000__000000"].has_ext  # frames 0..108 share episode 0
    assert not rows["arena__R10_s2000__000096"].has_ext  # 96+108 > 200 (and episode change at 150)
    assert rows["arena__R10_s2000__000000"].split == "train"
    p0 = rows["forest__P9_golden_s2909__000000"]
    assert not p0.has_ext and not p0.centered and p0.ortho  # camera variant changes at frame 100 ≤ 108
    runs = json.loads((cfg.paths.data_root / "index" / "runs.json").read_text())
    assert runs["R10_s1512"] == "val" and runs["R10_s2000"] == "train" and "_rule" in runs


def test_episode_change_inside_extension_invalidates(tmp_path):
    raw = write_index_raw(tmp_path / "raw", [RunSpec("R10_s1512", num_frames=200, episode_changes={108: 1})])
    rows, _ = build_index(RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"]))
    assert not rows[0].has_ext


def test_missing_val_runs_are_an_error_unless_allowed(tmp_path):
    raw = write_index_raw(tmp_path / "raw", [RunSpec("R10_s2000", num_frames=90)])
    with pytest.raises(IndexBuildError, match="R10_s1512"):
        build_index(RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"]))
    rows, splits = build_index(
        RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"], allow_missing_val_runs=True)
    )
    assert splits == {"R10_s2000": "train"}


def test_drop_list(tmp_path):
    raw = write_index_raw(tmp_path / "raw", [RunSpec("R10_s1512", num_frames=200)])
    drop = tmp_path / "buried.txt"
    drop.write_text("# buried players\narena__R10_s1512__000096\n\n")
    cfg = _cfg(tmp_path, val_runs=["R10_s1512"], drop_lists=[{"path": str(drop), "reason": "buried_player"}])
    rows, _ = build_index(RawSource(raw), cfg)
    assert [(r.drop, r.drop_reason) for r in rows] == [(False, ""), (True, "buried_player")]
    drop.write_text("arena__R10_s1512__000960\n")
    with pytest.raises(IndexBuildError, match="not in the index"):
        build_index(RawSource(raw), cfg)
    drop.write_text("arena/../x\n")
    with pytest.raises(IndexBuildError, match=f"{drop}:1"):
        build_index(RawSource(raw), cfg)
    assert DropListConfig(path=drop, reason="x").reason == "x"


def test_malformed_raw_files_name_path_and_field(tmp_path):
    raw = write_index_raw(tmp_path / "raw", [RunSpec("R10_s1512", num_frames=100)])
    frames = raw / "v10_real" / "arena" / "R10_s1512" / "frames.jsonl"
    lines = frames.read_text().splitlines()
    row = json.loads(lines[3])
    del row["camera_variant"]
    lines[3] = json.dumps(row)
    frames.write_text("\n".join(lines))
    with pytest.raises(RawLayoutError) as e:
        build_index(RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"]))
    assert f"{frames}:4" in str(e.value) and "camera_variant" in str(e.value)
    clips = raw / "index" / "clips_81.json"
    clips.write_text(
        json.dumps(
            {"clips": [{"subset": "v10_real", "scene": "arena", "run": "R10_s1512", "start": 48, "end": 129}]}
        )
    )
    frames.write_text("\n".join(json.dumps({**json.loads(line), "camera_variant": "a"}) for line in lines))
    with pytest.raises(IndexBuildError, match="field 'start'"):
        build_index(RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"]))
    clips.write_text(
        json.dumps(
            {"clips": [{"subset": "v10_real", "scene": "..", "run": "R10_s1512", "start": 0, "end": 81}]}
        )
    )
    with pytest.raises(RawLayoutError, match="clips.0.scene"):
        build_index(RawSource(raw), _cfg(tmp_path, val_runs=["R10_s1512"]))
