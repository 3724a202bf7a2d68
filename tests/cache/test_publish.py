"""Publication on the local store: receipts, parent-checked snapshots, races, imports."""

from __future__ import annotations

import json
import threading

import pytest

from gc25d_core.cache import (
    SCHEMA_GC25D,
    AlreadyExistsError,
    CommitUncertainError,
    ConsumerConfig,
    LocalStore,
    ManifestError,
    SplitRule,
    StaleParentError,
    StreamingCache,
    entries_from_listing,
    entries_from_manifest,
    import_shards,
    list_versions,
    pack_shard,
    publish_snapshot,
    read_snapshot,
    verify_receipt,
    verify_snapshot,
)
from gc25d_core.cache.manifest import POINTER_PATH, SampleEntry, sha256_hex, version_path
from gc25d_core.cache.stores import Store


def test_pack_publish_read(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    assert list_versions(store) == []
    receipts = kit.pack_many(store, n_shards=3, per_shard=4)
    head = store.head()
    for rp in receipts:
        r = verify_receipt(store, rp, revision=head)
        assert r.schema_name == SCHEMA_GC25D and len(r.samples) == 4
    res = publish_snapshot(store, split_rule=SplitRule(method="explicit", val_groups=("r3",)))
    assert (res.version, res.added_samples, res.noop) == (1, 12, False)
    assert list_versions(store) == [1]
    snap = read_snapshot(store)
    assert snap.ref == res.ref
    assert store.read_bytes(POINTER_PATH, store.head()) == store.read_bytes(version_path(1), store.head())
    m = snap.manifest
    assert m.totals.num_samples == 12 and m.totals.per_split == {"train": 10, "val": 2}
    assert m.dims == {"H": 1, "W": 1}
    assert all(sh.revision == head for sh in m.shards)  # pinned at the commit they were verified at
    # nothing new: no new version
    assert publish_snapshot(store).noop and list_versions(store) == [1]
    # more shards + an exclusion: v2 = v1 + additions
    (rp,) = kit.pack_many(store, worker="w1", n_shards=1, per_shard=4, start=500)
    res2 = publish_snapshot(store, exclude_add=["scene__r0__000000"])
    assert res2.version == 2 and res2.added_shards == [
        rp.replace("receipts/", "shards/").replace(".json", ".tar")
    ]
    m2 = read_snapshot(store).manifest
    assert m2.shards[:3] == m.shards and m2.exclude_sample_ids == ("scene__r0__000000",)
    assert m2.parent_version == 1 and m2.totals.num_excluded == 1
    assert read_snapshot(store, 1).manifest == m  # immutable history
    assert verify_snapshot(store, deep=True).ok


def test_pack_is_create_only_and_idempotent(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    samples = [kit.gc_sample(i, "r0") for i in range(3)]
    a = pack_shard(store, worker="w0", name="x", samples=samples, schema=SCHEMA_GC25D)
    b = pack_shard(store, worker="w0", name="x", samples=samples, schema=SCHEMA_GC25D)
    assert a.created and not b.created and a.receipt.sha256 == b.receipt.sha256
    with pytest.raises(AlreadyExistsError):
        pack_shard(store, worker="w0", name="x", samples=samples[:2], schema=SCHEMA_GC25D)
    with pytest.raises(Exception, match="missing tensor 'latent'"):
        pack_shard(
            store,
            worker="w0",
            name="y",
            samples=[("a", {"actions_block": samples[0][1]["actions_block"]}, samples[0][2])],
            schema=SCHEMA_GC25D,
        )


def test_invalid_or_duplicate_receipts_are_not_listed(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    good = pack_shard(
        store,
        worker="w0",
        name="good",
        samples=[kit.gc_sample(i, "r0") for i in range(3)],
        schema=SCHEMA_GC25D,
    )
    rot = pack_shard(
        store,
        worker="w0",
        name="rot",
        samples=[kit.gc_sample(i, "r1") for i in range(10, 13)],
        schema=SCHEMA_GC25D,
    )
    dup = pack_shard(
        store,
        worker="w1",
        name="dup",
        samples=[kit.gc_sample(2, "r0"), kit.gc_sample(20, "r2")],
        schema=SCHEMA_GC25D,
    )
    p = store.root / rot.shard_path
    data = bytearray(p.read_bytes())
    data[700] ^= 1  # bit rot after the worker wrote its receipt
    p.write_bytes(bytes(data))
    res = publish_snapshot(store)
    assert res.added_shards == [good.shard_path]
    assert "PT SHA256 mismatch" in res.rejected[rot.receipt_path]
    assert (
        "duplicate sample id" in res.rejected[dup.receipt_path]
        and good.shard_path in res.rejected[dup.receipt_path]
    )


class _Racer(Store):
    """Delegates to a LocalStore; lets a test interleave a competitor or fake an ambiguous error."""

    def __init__(self, inner: LocalStore, *, land_then_fail: int = 0, fail_without_landing: int = 0):
        self.inner, self.land_then_fail, self.fail_without_landing = (
            inner,
            land_then_fail,
            fail_without_landing,
        )
        self.commits = 0

    def head(self):
        return self.inner.head()

    def read_bytes(self, path, revision):
        return self.inner.read_bytes(path, revision)

    def open_range(self, path, revision, size):
        return self.inner.open_range(path, revision, size)

    def exists(self, path, revision):
        return self.inner.exists(path, revision)

    def list_files(self, prefix, revision):
        return self.inner.list_files(prefix, revision)

    def describe(self):
        return "racer"

    def commit(self, files, *, parent, check_parent=True, message=""):
        self.commits += 1
        if self.fail_without_landing:
            self.fail_without_landing -= 1
            raise CommitUncertainError("HTTP 500 (nothing landed)")
        out = self.inner.commit(files, parent=parent, check_parent=check_parent, message=message)
        if self.land_then_fail:
            self.land_then_fail -= 1
            raise CommitUncertainError("HTTP 500 (but it landed)")
        return out


def test_two_publishers_one_parent_exactly_one_lands(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    ra = kit.pack_many(store, worker="wa", n_shards=1, per_shard=3)
    rb = kit.pack_many(store, worker="wb", n_shards=1, per_shard=3, start=300)
    results = {}

    def b_publishes_first(attempt):
        if attempt == 1:  # A has read the head; B lands on the same parent before A commits
            results["b"] = publish_snapshot(store, receipts=rb)

    results["a"] = publish_snapshot(store, receipts=ra, before_commit=b_publishes_first)
    a, b = results["a"], results["b"]
    assert b.version == 1 and a.version == 2 and a.attempts == 2  # A lost, rebased, landed N+1
    assert list_versions(store) == [1, 2]
    m1, m2 = read_snapshot(store, 1).manifest, read_snapshot(store, 2).manifest
    assert [s.path for s in m1.shards] == ["shards/wb/wb-000100.tar"]
    assert [s.path for s in m2.shards] == ["shards/wb/wb-000100.tar", "shards/wa/wa-000000.tar"]
    assert m2.parent_version == 1


def test_concurrent_publishers_threads(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    receipts = [
        kit.pack_many(store, worker=f"w{i}", n_shards=1, per_shard=2, start=100 * i)[0] for i in range(4)
    ]
    out, errs = [], []

    def run(rp):
        try:
            out.append(
                publish_snapshot(LocalStore(store.root), receipts=[rp], backoff_s=0.01, max_attempts=30)
            )
        except Exception as e:  # pragma: no cover
            errs.append(e)

    ts = [threading.Thread(target=run, args=(rp,)) for rp in receipts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    assert sorted(r.version for r in out) == [1, 2, 3, 4] == list_versions(store)
    last = read_snapshot(store).manifest
    assert sorted(s.receipt for s in last.shards) == sorted(receipts)


def test_error_but_it_landed_does_not_publish_twice(tmp_path, kit):
    inner = LocalStore(tmp_path / "s")
    kit.pack_many(inner, n_shards=1, per_shard=3)
    racer = _Racer(inner, land_then_fail=1)
    res = publish_snapshot(racer)
    assert res.landed_after_error and res.version == 1 and racer.commits == 1
    assert list_versions(inner) == [1]
    assert publish_snapshot(racer).noop


def test_error_without_landing_is_retried(tmp_path, kit):
    inner = LocalStore(tmp_path / "s")
    kit.pack_many(inner, n_shards=1, per_shard=3)
    racer = _Racer(inner, fail_without_landing=2)
    res = publish_snapshot(racer, backoff_s=0)
    assert res.version == 1 and not res.landed_after_error and racer.commits == 3
    assert list_versions(inner) == [1]


def test_local_store_cas_and_create_only(tmp_path):
    s = LocalStore(tmp_path / "s")
    c1 = s.commit({"manifests/v000001.json": b"one"}, parent=None)
    with pytest.raises(StaleParentError):
        s.commit({"manifests/v000002.json": b"two"}, parent=None)
    with pytest.raises(AlreadyExistsError):
        s.commit({"manifests/v000001.json": b"other"}, parent=c1)
    assert s.commit({"manifests/v000001.json": b"one"}, parent=c1) == c1  # identical: no-op
    c2 = s.commit({POINTER_PATH: b"p1", "manifests/v000002.json": b"p1"}, parent=c1)
    c3 = s.commit({POINTER_PATH: b"p2", "manifests/v000003.json": b"p2"}, parent=c2)
    assert s.read_bytes(POINTER_PATH, c2) == b"p1" and s.read_bytes(POINTER_PATH, c3) == b"p2"
    assert not s.exists("manifests/v000003.json", c2)
    # a crashed commit leaves an unlisted orphan: invisible, and replaced by the next commit
    (s.root / "shards").mkdir()
    (s.root / "shards" / "x.tar").write_bytes(b"torn")
    assert not s.exists("shards/x.tar", c3)
    c4 = s.commit({"shards/x.tar": b"whole"}, parent=c3)
    assert s.read_bytes("shards/x.tar", c4) == b"whole"
    with open(s.root / ".gc25d" / "log.jsonl", "ab") as f:  # torn log line of a crashed commit
        f.write(b'{"commit": "dead')
    assert LocalStore(s.root).head() == c4
    assert s.commit({"a/b.json": b"{}"}, parent=c4) != c4
    assert LocalStore(s.root).head() == s.head()


def test_import_is_byte_for_byte_and_verified(tmp_path, kit):
    src, ref = kit.build_store(tmp_path / "old", n_shards=2, per_shard=3)
    dst = LocalStore(tmp_path / "new")
    done = import_shards(
        src,
        entries_from_manifest(read_snapshot(src).manifest),
        dst,
        worker="imp",
        schema_name=SCHEMA_GC25D,
        source_repo="old/cache",
    )
    assert [d.created for d in done] == [True, True]
    for d, sh in zip(done, read_snapshot(src).manifest.shards, strict=True):
        assert (dst.root / d.shard_path).read_bytes() == (src.root / sh.path).read_bytes()
        assert d.receipt.source.sha256 == sh.sha256 and d.receipt.source.revision == sh.revision
    again = import_shards(
        src,
        entries_from_manifest(read_snapshot(src).manifest),
        dst,
        worker="imp",
        schema_name=SCHEMA_GC25D,
        source_repo="old/cache",
    )
    assert [d.created for d in again] == [False, False]
    res = publish_snapshot(dst, split_rule=SplitRule(method="explicit", val_groups=kit.VAL_RUNS))
    assert res.added_samples == 6
    ids_old = kit.consume(StreamingCache(src, ConsumerConfig(), rank=0, world_size=1))
    ids_new = kit.consume(StreamingCache(dst, ConsumerConfig(), rank=0, world_size=1))
    assert sorted(ids_old) == sorted(ids_new)


def test_import_legacy_listing_and_corrupt_source(tmp_path, kit):
    src, ref = kit.build_store(tmp_path / "old", n_shards=2, per_shard=3)
    shards = read_snapshot(src).manifest.shards
    listing = json.dumps(
        [{"path": s.path, "revision": s.revision, "size": s.size, "sha256": s.sha256} for s in shards]
    )
    dst = LocalStore(tmp_path / "new")
    p = src.root / shards[1].path
    data = bytearray(p.read_bytes())
    data[-3] ^= 1
    p.write_bytes(bytes(data))
    entries = entries_from_listing(listing)
    with pytest.raises(Exception, match="whole-TAR SHA256 mismatch") as ei:
        import_shards(src, entries, dst, worker="imp", schema_name=SCHEMA_GC25D, source_repo="old/cache")
    assert shards[1].path in str(ei.value)
    head = dst.head()
    assert dst.list_files("shards/", head) == ["shards/imp/w0-000000.tar"]  # only the good one landed
    r = verify_receipt(dst, "receipts/imp/w0-000000.json", revision=head)
    assert [s.id for s in r.samples] == [s.id for s in shards[0].samples]


def test_manifest_split_must_follow_rule(kit):
    from gc25d_core.cache.manifest import Manifest, ShardEntry, compute_totals

    pt = kit.encode(kit.gc_sample(0, "r3"))
    e = kit.entry_for(*pt, "r3")
    wrong = SampleEntry(**{**e.model_dump(), "split": "train"})
    sh = ShardEntry(
        path="shards/w/x.tar",
        worker="w",
        revision="a" * 40,
        size=10240,
        sha256="b" * 64,
        receipt="receipts/w/x.json",
        samples=(wrong,),
    )
    with pytest.raises(Exception, match="disagrees with the split rule"):
        Manifest(
            version=1,
            schema_name=SCHEMA_GC25D,
            split_rule=SplitRule(method="explicit", val_groups=("r3",)),
            shards=(sh,),
            totals=compute_totals((sh,), ()),
        )


def test_hash_split_rule_is_stable_and_about_two_percent():
    rule = SplitRule()
    val = sum(rule.split_of(f"match{i}") == "val" for i in range(20000))
    assert 300 < val < 500
    assert rule.split_of("match7") == SplitRule().split_of("match7")


def test_receipt_path_mismatch_rejected(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    r = pack_shard(store, worker="w0", name="x", samples=[kit.gc_sample(1, "r0")], schema=SCHEMA_GC25D)
    data = store.read_bytes(r.receipt_path, store.head())
    head = store.commit({"receipts/w0/y.json": data}, parent=store.head())
    with pytest.raises(ManifestError, match="describes"):
        verify_receipt(store, "receipts/w0/y.json", revision=head)
    assert sha256_hex(data)
