import json
import os
import re

import pytest
import torch

from gc25d_core.atomic import atomic_path, atomic_write_text, create_exclusive
from gc25d_core.checkpoint import (
    DIGESTS,
    CheckpointDir,
    StateFileError,
    load_torch,
    read_digests,
    recorded_digest,
    save_torch,
    seal_digests,
    write_digest_part,
)
from gc25d_core.distributed import shard
from gc25d_core.hashing import sha256_file


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


class RunsCode:
    """Unpickled with weights_only=False this calls ``os.mkdir(marker)``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_state_files_load_only_with_their_recorded_sha256(tmp_path):
    path = tmp_path / "state.pt"
    digest = save_torch({"w": torch.arange(6.0), "step": 3}, path)
    assert digest == sha256_file(path)
    loaded = load_torch(path, digest)
    assert torch.equal(loaded["w"], torch.arange(6.0)) and loaded["step"] == 3
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte somewhere in the archive
    path.write_bytes(bytes(data))
    with pytest.raises(
        StateFileError, match=re.escape(f"{path}: SHA256 ") + f".* differs from the recorded {digest}"
    ):
        load_torch(path, digest)


def test_a_pickle_with_a_matching_hash_is_still_only_data(tmp_path):
    path, marker = tmp_path / "state.pt", tmp_path / "code-ran"
    digest = save_torch({"w": RunsCode(marker)}, path)
    with pytest.raises(
        StateFileError, match=re.escape(f"{path}: refused by torch.load(weights_only=True)") + ".*GLOBAL"
    ):
        load_torch(path, digest)
    assert not marker.exists()


def test_digest_record_is_merged_from_rank_parts_and_validated(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    a, b = "a" * 64, "b" * 64
    write_digest_part(slot, 0, {"deepspeed/model.pt": a, "rng-rank0.pt": b})
    write_digest_part(slot, 1, {"rng-rank1.pt": a})
    merged = seal_digests(slot)
    assert merged == read_digests(slot) == {"deepspeed/model.pt": a, "rng-rank0.pt": b, "rng-rank1.pt": a}
    assert sorted(p.name for p in slot.iterdir()) == [DIGESTS]
    assert recorded_digest(merged, slot, "rng-rank1.pt") == a
    with pytest.raises(
        StateFileError, match=re.escape(f"{slot / 'trainer.pt'}: not listed in {slot / DIGESTS}")
    ):
        recorded_digest(merged, slot, "trainer.pt")
    for name, digest, field in (
        ("../outside.pt", a, "'../outside.pt'"),
        ("/abs/x.pt", a, "'/abs/x.pt'"),
        (".tmp-x.pt", a, "'.tmp-x.pt'"),
        ("x.pt", "A" * 64, "x.pt: 'AAAA"),
        ("x.pt", 7, "x.pt: 7"),
    ):
        (slot / DIGESTS).write_text(json.dumps({name: digest}))
        with pytest.raises(StateFileError, match=re.escape(f"{slot / DIGESTS}: {field}")):
            read_digests(slot)
    (slot / DIGESTS).unlink()
    with pytest.raises(StateFileError, match=re.escape(f"{slot / DIGESTS}: missing")):
        read_digests(slot)


def test_two_ranks_recording_one_file_differently_is_refused(tmp_path):
    write_digest_part(tmp_path, 0, {"x.pt": "a" * 64})
    write_digest_part(tmp_path, 1, {"x.pt": "b" * 64})
    with pytest.raises(StateFileError, match="two different SHA256"):
        seal_digests(tmp_path)
