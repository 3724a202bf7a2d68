"""A sample's split comes from the sample itself: a receipt or manifest whose group disagrees with
the sample's own JSON (its run) is refused at publication and fails verification."""

from __future__ import annotations

import json

from gc25d_core.cache import (
    SCHEMA_GC25D,
    LocalStore,
    SplitRule,
    pack_shard,
    publish_snapshot,
    verify_snapshot,
)
from gc25d_core.cache.manifest import parse_receipt, receipt_bytes
from gc25d_core.cache.stores import Addition

VAL_SAMPLE = "scene__r3__000002"  # run r3 is the val run of the kit's split rule


def _tampered_store(tmp_path, kit) -> tuple[LocalStore, str, str]:
    """A store holding a worker's real shard and its receipt, with the val sample's group changed to
    a train run (the receipt is otherwise consistent: it parses and every byte count/hash holds)."""
    honest = LocalStore(tmp_path / "honest")
    samples = [kit.gc_sample(1, "r0"), kit.gc_sample(2, "r3"), kit.gc_sample(3, "r1")]
    res = pack_shard(honest, worker="w0", name="x", samples=samples, schema=SCHEMA_GC25D)
    receipt = json.loads(honest.read_bytes(res.receipt_path, honest.head()))
    for s in receipt["samples"]:
        if s["id"] == VAL_SAMPLE:
            s["group"] = "r0"
    tampered = parse_receipt(json.dumps(receipt).encode())
    store = LocalStore(tmp_path / "tampered")
    store.commit(
        {
            res.shard_path: Addition(file=honest.root / res.shard_path, sha256=res.receipt.sha256),
            res.receipt_path: receipt_bytes(tampered),
        },
        parent=None,
    )
    return store, res.shard_path, res.receipt_path


def test_publisher_refuses_a_receipt_whose_group_disagrees_with_the_sample(tmp_path, kit):
    store, shard, receipt = _tampered_store(tmp_path, kit)
    rule = SplitRule(method="explicit", val_groups=kit.VAL_RUNS)
    res = publish_snapshot(store, split_rule=rule)
    assert res.ref is None and res.added_samples == 0
    why = res.rejected[receipt]
    assert f"shard {shard} sample {VAL_SAMPLE}" in why and "'r0'" in why and "'r3'" in why
    assert "'run'" in why  # names the field the group comes from
    for deep in (False, True):  # the group check does not depend on deserialising the tensors
        assert receipt in publish_snapshot(store, split_rule=rule, deep_verify=deep).rejected


def test_deep_verify_fails_a_snapshot_listing_a_wrong_group(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    members = [kit.encode(kit.gc_sample(i, run)) for i, run in ((1, "r0"), (2, "r3"))]
    honest = [kit.entry_for(*m, run) for m, run in zip(members, ("r0", "r3"), strict=True)]
    data = kit.craft_tar(
        (f"{sid}{ext}", body, b"0") for sid, pt, js in members for ext, body in ((".pt", pt), (".json", js))
    )
    good = kit.publish_raw(store, [("shards/w0/good.tar", data, honest)], version=1)
    assert verify_snapshot(store, 1, revision=good.commit, deep=True).ok
    # the same bytes listed with the val sample's group (and so its split) changed to train
    lying = [honest[0], kit.entry_for(*members[1], "r0")]
    assert lying[1].split == "train"
    bad = kit.publish_raw(store, [("shards/w0/bad.tar", data, lying)], version=2)
    report = verify_snapshot(store, 2, revision=bad.commit, deep=True)
    assert not report.ok
    (failure,) = report.failures
    assert failure["shard"] == "shards/w0/bad.tar" and failure["sample"] == VAL_SAMPLE
    assert "'r0'" in failure["error"] and "'r3'" in failure["error"]
