"""Every corruption case of the acceptance list is detected, names shard + sample + offset, and no
unverified byte is deserialised."""

from __future__ import annotations

import json
import tarfile

import pytest

from gc25d_core.cache import (
    ConsumerConfig,
    ManifestError,
    StreamingCache,
    read_snapshot,
)
from gc25d_core.cache.manifest import POINTER_PATH, parse_manifest, version_path


def _setup(tmp_path, kit, n_shards=1, per_shard=4):
    store, ref = kit.build_store(tmp_path / "s", n_shards=n_shards, per_shard=per_shard)
    snap = read_snapshot(store)
    sh = snap.manifest.shards[0]
    return store, snap, sh, store.root / sh.path


def _listed(snap) -> set[str]:
    return {s.pt_sha256 for sh in snap.manifest.shards for s in sh.samples}


def _assert_names(err, shard, sample, offset):
    msg = str(err)
    assert f"shard {shard}" in msg
    assert f"sample {sample if sample is not None else '-'}" in msg
    assert f"offset {offset}" in msg
    ev = err.event
    assert (ev.shard, ev.sample, ev.offset) == (shard, sample, offset)


def _run(store, kit, monkeypatch, **cfg):
    spy = kit.DeserialiseSpy(monkeypatch)
    ds = StreamingCache(store, ConsumerConfig(split="train", **cfg), rank=0, world_size=1)
    err, ids = kit.expect_failure(ds)
    return ds, err, ids, spy


def _eligible_ids(sh):
    return [s.id for s in sh.samples if s.split == "train"]


def test_flipped_pt_byte(tmp_path, kit, monkeypatch):
    store, snap, sh, path = _setup(tmp_path, kit)
    data = bytearray(path.read_bytes())
    members = kit.tar_layout(bytes(data))
    pt1 = members[2]  # sample 1's .pt
    data[pt1.offset_data + 40] ^= 0x01
    path.write_bytes(bytes(data))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, sh.path, sh.samples[1].id, pt1.offset_data)
    assert "PT SHA256 mismatch" in str(err)
    assert set(spy.seen) <= _listed(snap)  # the flipped PT never reached torch.load
    assert ids == []  # sample 0 was held back: the shard never passed
    assert ds.failures[0]["sample"] == sh.samples[1].id


def test_flipped_tar_header_byte(tmp_path, kit, monkeypatch):
    store, snap, sh, path = _setup(tmp_path, kit)
    data = bytearray(path.read_bytes())
    hdr = kit.tar_layout(bytes(data))[2].offset
    data[hdr + 3] ^= 0x20  # inside the member name: tarfile's checksum fails and it stops silently
    path.write_bytes(bytes(data))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, sh.path, sh.samples[1].id, hdr)
    assert "archive ended where member" in str(err)
    assert set(spy.seen) <= _listed(snap)


@pytest.mark.parametrize("where", ["member_boundary", "mid_header", "mid_member"])
def test_truncated_tar(tmp_path, kit, monkeypatch, where):
    store, snap, sh, path = _setup(tmp_path, kit)
    data = path.read_bytes()
    m = kit.tar_layout(data)
    cut = {
        "member_boundary": m[4].offset,
        "mid_header": m[4].offset + 100,
        "mid_member": m[4].offset_data + 50,
    }[where]
    path.write_bytes(data[:cut])
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, sh.path, sh.samples[2].id, m[4].offset)
    assert set(spy.seen) <= _listed(snap)
    # what was yielded is recorded with the failure; the shard's last sample never was
    assert ds.failures[0]["yielded_sample_ids"] == ids
    assert sh.samples[-1].id not in ids


def _malicious(tmp_path, kit, build):
    """Publish one shard whose TAR is ``build(a, b)``; the manifest lists a, b with the real
    size/SHA256 of that TAR, so only the structure checks can catch it."""
    from gc25d_core.cache import LocalStore

    store = LocalStore(tmp_path / "m")
    a = kit.encode(kit.gc_sample(1, "r0"))
    b = kit.encode(kit.gc_sample(2, "r0"))
    data = kit.craft_tar(build(a, b))
    entries = [kit.entry_for(a[0], a[1], a[2], "r0"), kit.entry_for(b[0], b[1], b[2], "r0")]
    kit.publish_raw(store, [("shards/w0/bad.tar", data, entries)])
    return store, a, b, data


REG = tarfile.REGTYPE


def _pair(s):
    return [(s[0] + ".pt", s[1], REG), (s[0] + ".json", s[2], REG)]


def _hdr_offset(data: bytes, name: str) -> int:
    import io

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return next(t.offset for t in tf.getmembers() if t.name == name)


def test_unlisted_member_at_end(tmp_path, kit, monkeypatch):
    store, a, b, data = _malicious(
        tmp_path, kit, lambda a, b: _pair(a) + _pair(b) + [("notes.txt", b"hi", REG)]
    )
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/bad.tar", "notes.txt", _hdr_offset(data, "notes.txt"))
    assert "unlisted member" in str(err)
    assert ids == [a[0]]  # b held back, never yielded: the shard did not pass
    assert set(spy.seen) <= {kit.entry_for(*a, "r0").pt_sha256, kit.entry_for(*b, "r0").pt_sha256}


def test_unlisted_member_in_the_middle(tmp_path, kit, monkeypatch):
    x = kit.encode(kit.gc_sample(9, "r0"))
    store, a, b, data = _malicious(tmp_path, kit, lambda a, b: _pair(a) + _pair(x) + _pair(b))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/bad.tar", b[0], _hdr_offset(data, x[0] + ".pt"))
    assert "unexpected member" in str(err)
    assert x[1] and kit.entry_for(*x, "r0").pt_sha256 not in spy.seen


def test_dotdot_member_name(tmp_path, kit, monkeypatch):
    store, a, b, data = _malicious(
        tmp_path,
        kit,
        lambda a, b: _pair(a) + [("../" + b[0] + ".pt", b[1], REG), (b[0] + ".json", b[2], REG)],
    )
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/bad.tar", b[0], _hdr_offset(data, "../" + b[0] + ".pt"))
    assert "unsafe member name" in str(err)
    assert kit.entry_for(*b, "r0").pt_sha256 not in spy.seen


def test_symlink_member(tmp_path, kit, monkeypatch):
    store, a, b, data = _malicious(
        tmp_path,
        kit,
        lambda a, b: _pair(a) + [(b[0] + ".pt", b"", tarfile.SYMTYPE), (b[0] + ".json", b[2], REG)],
    )
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/bad.tar", b[0], _hdr_offset(data, b[0] + ".pt"))
    assert "symlink" in str(err)


def test_json_before_pt(tmp_path, kit, monkeypatch):
    store, a, b, data = _malicious(tmp_path, kit, lambda a, b: _pair(a) + list(reversed(_pair(b))))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/bad.tar", b[0], _hdr_offset(data, b[0] + ".json"))


def test_duplicate_id_within_tar(tmp_path, kit, monkeypatch):
    store, a, b, data = _malicious(tmp_path, kit, lambda a, b: _pair(a) + _pair(a) + _pair(b))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    second = kit.tar_layout(data)[2].offset
    _assert_names(err, "shards/w0/bad.tar", b[0], second)
    assert "duplicate member" in str(err)


def test_sample_id_with_dots_is_split_from_the_right(tmp_path, kit, monkeypatch):
    from gc25d_core.cache import LocalStore

    store = LocalStore(tmp_path / "dots")
    sid, t, m = kit.gc_sample(5, "r0")
    a = kit.encode(("clip.v2.part.1", t, m))
    data = kit.craft_tar(_pair(a))
    kit.publish_raw(store, [("shards/w0/dots.tar", data, [kit.entry_for(*a, "r0")])])
    ds = StreamingCache(store, ConsumerConfig(), rank=0, world_size=1)
    assert kit.consume(ds) == ["clip.v2.part.1"]


def _mutate_manifest(store, fn):
    """Rewrite snapshot v1 in a copy of the store (simulating a bad publisher)."""
    head = store.head()
    doc = json.loads(store.read_bytes(version_path(1), head))
    fn(doc)
    data = (json.dumps(doc) + "\n").encode()
    (store.root / version_path(1)).write_bytes(data)
    (store.root / POINTER_PATH).write_bytes(data)
    return data


def test_duplicate_ids_across_shards_rejected_at_load(tmp_path, kit):
    store, snap, sh, path = _setup(tmp_path, kit, n_shards=2)

    def dup(doc):
        doc["shards"][1]["samples"][0]["id"] = doc["shards"][0]["samples"][3]["id"]

    data = _mutate_manifest(store, dup)
    with pytest.raises(ManifestError) as ei:
        parse_manifest(data)
    msg = str(ei.value)
    s0, s1 = snap.manifest.shards[0].path, snap.manifest.shards[1].path
    assert f"shard {s1} sample {snap.manifest.shards[0].samples[3].id} offset -" in msg and s0 in msg


def test_short_sha_revision_rejected(tmp_path, kit):
    store, snap, sh, path = _setup(tmp_path, kit)

    def short(doc):
        doc["shards"][0]["revision"] = doc["shards"][0]["revision"][:7]

    data = _mutate_manifest(store, short)
    with pytest.raises(ManifestError) as ei:
        parse_manifest(data)
    assert f"shard {sh.path}" in str(ei.value) and "40-hex" in str(ei.value)
    with pytest.raises(ManifestError):  # the consumer refuses it too (and the bytes changed)
        StreamingCache(store, ConsumerConfig(), manifest=1, rank=0, world_size=1)


def test_whole_tar_sha_mismatch_is_recorded_and_surfaced(tmp_path, kit, monkeypatch):
    store, snap, sh, path = _setup(tmp_path, kit)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF  # in the record padding tarfile never reads: only the drained SHA256 sees it
    path.write_bytes(bytes(data))
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, sh.path, None, len(data))
    assert "whole-TAR SHA256 mismatch" in str(err)
    elig = _eligible_ids(sh)
    assert ids == elig[:-1]  # all but the held-back last one were yielded ...
    assert ds.failures[0]["yielded_sample_ids"] == ids  # ... and are recorded in the state
    assert ds.state_dict()["failures"][0]["shard"] == sh.path


def test_quarantine_mode_skips_shard_later(tmp_path, kit, monkeypatch):
    store, snap, sh, path = _setup(tmp_path, kit, n_shards=3)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = StreamingCache(store, ConsumerConfig(on_shard_failure="quarantine"), rank=0, world_size=1)
    with pytest.warns(RuntimeWarning, match="quarantined"):
        ids = kit.consume(ds)
    assert ds.quarantined == {sh.sha256: sh.path}
    assert ds.rank_remaining() == 0  # the quarantined shard no longer counts
    ds.advance_epoch()
    ids2 = kit.consume(ds)
    assert not set(ids2) & {s.id for s in sh.samples}
    # the quarantine survives a checkpoint
    ds2 = StreamingCache(store, ConsumerConfig(on_shard_failure="quarantine"), rank=0, world_size=1)
    ds2.load_state_dict(ds.state_dict())
    assert ds2.quarantined == ds.quarantined
    assert ids and ids2


def test_schema_violation_names_sample(tmp_path, kit, monkeypatch):
    from gc25d_core.cache import LocalStore

    store = LocalStore(tmp_path / "schema")
    sid, t, m = kit.gc_sample(3, "r0")
    t["latent"] = t["latent"].float()  # wrong dtype
    a = kit.encode((sid, t, m))
    good = kit.encode(kit.gc_sample(4, "r0"))
    data = kit.craft_tar(_pair(good) + _pair(a))
    kit.publish_raw(store, [("shards/w0/s.tar", data, [kit.entry_for(*good, "r0"), kit.entry_for(*a, "r0")])])
    ds, err, ids, spy = _run(store, kit, monkeypatch)
    _assert_names(err, "shards/w0/s.tar", sid, _hdr_offset(data, sid + ".pt"))
    assert "dtype torch.float32 != bfloat16" in str(err)
