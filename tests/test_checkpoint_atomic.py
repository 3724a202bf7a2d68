import pytest

from gc25d_core.atomic import atomic_path, atomic_write_text, create_exclusive
from gc25d_core.checkpoint import CheckpointDir
from gc25d_core.distributed import shard


def test_atomic_write_leaves_old_file_on_crash(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_create_exclusive_never_overwrites(tmp_path):
    path = tmp_path / "v000001.json"
    assert create_exclusive(path, b"a")
    assert not create_exclusive(path, b"b")
    assert path.read_bytes() == b"a"


def test_checkpoint_dir_latest_rotation_and_partial_saves(tmp_path):
    ck = CheckpointDir(tmp_path / "ck", keep=2)
    assert ck.latest() is None
    for step in (1, 2, 3):
        ck.save_json(step, {"step": step})
    assert ck.steps() == [2, 3] and ck.latest() == 3
    assert ck.path(3).name == "step-000003"
    with pytest.raises(RuntimeError):
        ck.save(4, lambda d: (_ for _ in ()).throw(RuntimeError("killed while saving")))
    assert ck.latest() == 3  # a failed save never becomes the latest
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp-")]
    assert ck.load_json(3) == {"step": 3}


def test_shard_is_deterministic_and_disjoint():
    items = list(range(10))
    parts = [shard(items, r, 3) for r in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(sum(parts, [])) == items
    with pytest.raises(ValueError):
        shard(items, 3, 3)
