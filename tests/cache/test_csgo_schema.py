"""csgo_training_cache_features_v1: the card's exact tensor table, enforced on generated shards of
the card's shapes (small text length L)."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.cache import (
    SCHEMA_CSGO,
    ConsumerConfig,
    LocalStore,
    SampleSchemaError,
    ShardFailure,
    StreamingCache,
    get_schema,
    pack_shard,
    publish_snapshot,
    validate_sample,
)

# the dataset card's table, verbatim
CARD_TABLE = {
    "latent": ([1, 16, 21, 60, 104], "float32"),
    "i2v_y": ([1, 20, 21, 60, 104], "float32"),
    "dense_features": ([1, 21, 32, 30, 52], "float32"),
    "state": ([1, 21, 3, 60, 104], "float32"),
    "interaction": ([1, 21, 134], "float32"),
    "camera_poses": ([1, 21, 4, 4], "float32"),
    "camera_intrinsics": ([1, 21, 4], "float32"),
    "text_emb": ([1, "L", 4096], "bfloat16"),
}


def csgo_sample(i: int, L: int) -> tuple[str, dict, dict]:
    t = {}
    for name, (shape, dtype) in CARD_TABLE.items():
        shp = [L if d == "L" else d for d in shape]
        t[name] = torch.full(shp, float(i), dtype=getattr(torch, dtype))
    return f"m{i // 2}.round{i}", t, {"match": f"m{i // 2}", "round": i}


def test_registered_schema_is_the_card_table():
    sch = get_schema(SCHEMA_CSGO)
    got = {t.name: (list(t.shape), t.dtype) for t in sch.tensors}
    assert got == CARD_TABLE
    assert not any(t.optional for t in sch.tensors)
    assert "dense" not in got  # there is no raw seven-channel dense tensor


def test_reader_validates_generated_shards(tmp_path):
    store = LocalStore(tmp_path / "csgo")
    pack_shard(
        store,
        worker="conv0",
        name="conv0-000000",
        samples=[csgo_sample(0, 3), csgo_sample(1, 5)],
        schema=SCHEMA_CSGO,
    )
    publish_snapshot(store)
    ds = StreamingCache(store, ConsumerConfig(split="train", batch_size=1), rank=0, world_size=1)
    seen = {}
    for b in ds.iter_batches():
        for s in b.samples:
            seen[s.key.sample_id] = s.tensors
        ds.mark_consumed(b)
    assert set(seen) == {"m0.round0", "m0.round1"}  # ids with dots survive the member split
    for sid, L in (("m0.round0", 3), ("m0.round1", 5)):
        t = seen[sid]
        for name, (shape, dtype) in CARD_TABLE.items():
            assert list(t[name].shape) == [L if d == "L" else d for d in shape]
            assert t[name].dtype == getattr(torch, dtype)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda t: t.__setitem__("text_emb", t["text_emb"].float()),
            "text_emb: dtype torch.float32 != bfloat16",
        ),
        (
            lambda t: t.__setitem__("text_emb", torch.zeros(1, 3, 4095, dtype=torch.bfloat16)),
            "text_emb: shape",
        ),
        (lambda t: t.__setitem__("dense", torch.zeros(1, 21, 7, 60, 104)), "unexpected tensors ['dense']"),
        (lambda t: t.pop("camera_poses"), "missing tensor 'camera_poses'"),
    ],
)
def test_reader_rejects_table_violations(tmp_path, mutate, message):
    sid, t, m = csgo_sample(2, 3)
    mutate(t)
    with pytest.raises(SampleSchemaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_sample(get_schema(SCHEMA_CSGO), t, m)
    store = LocalStore(tmp_path / "bad")
    pack_shard(store, worker="conv0", name="bad", samples=[(sid, t, m)], schema=SCHEMA_CSGO, validate=False)
    publish_snapshot(store, deep_verify=False)  # a publisher that skipped deep checks
    ds = StreamingCache(store, ConsumerConfig(), rank=0, world_size=1)
    with pytest.raises(ShardFailure, match=f"shard shards/conv0/bad.tar sample {sid} offset 0"):
        for b in ds.iter_batches():
            ds.mark_consumed(b)
