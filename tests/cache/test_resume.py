"""Exactly-once across kills, resumes, resumes of resumes and world-size changes.

A simulated run: each phase has ``world`` ranks (each its own StreamingCache, as in DDP). Every
rank trains up to a random global checkpoint step, the merged state is saved, then the rank runs
a few more "lost" steps (trained but not checkpointed, like real work after the last checkpoint)
and is killed mid-iteration (prefetched DataLoader batches in flight). The next phase restores the
merged checkpoint on a new random world size. Trained = what each checkpoint contains. At the end
the union of trained ids must equal the epoch's eligible set, with no id trained twice.
"""

from __future__ import annotations

import copy
import json
import random
import re

import pytest
from torch.utils.data import DataLoader

from gc25d_core.cache import (
    ConsumerConfig,
    RefreshMidEpochError,
    StateError,
    StreamingCache,
    merge_state_dicts,
    read_snapshot,
)


def _eligible(store, ref, split="train"):
    m = read_snapshot(store, ref.version, revision=ref.commit).manifest
    ex = set(m.exclude_sample_ids)
    return {s.id for sh in m.shards for s in sh.samples if s.split == split and s.id not in ex}


def _loader(ds, nw):
    return DataLoader(ds, batch_size=None, num_workers=nw) if nw else None


def _phase(store, ref, cfg, world, state, nw, rng, *, final):
    """Run one phase on ``world`` ranks; return (ids trained into the checkpoint, merged state)."""
    trained: list[str] = []
    states = []
    for r in range(world):
        ds = StreamingCache(store, cfg, manifest=ref, rank=r, world_size=world)
        if state is not None:
            ds.load_state_dict(state)
        it = ds.iter_batches(_loader(ds, nw))
        if final:
            for b in it:
                trained += [k.sample_id for k in b.keys]
                ds.mark_consumed(b)
            assert ds.rank_remaining() == 0
            states.append(ds.state_dict())
            continue
        ckpt_step, lost = rng.randint(0, 4), rng.randint(0, 2)
        snap = None
        pending: list[str] = []
        for step, b in enumerate(it):
            if step == ckpt_step:
                snap = ds.state_dict()
                trained += pending
            if step >= ckpt_step + lost:
                break  # killed, with prefetched batches in flight
            ds.mark_consumed(b)
            pending += [k.sample_id for k in b.keys]
        if snap is None:  # ran out of work before the checkpoint step
            snap = ds.state_dict()
            trained += pending
        del it
        states.append(snap)
    return trained, merge_state_dicts(states)


def _trial(store, ref, seed: int, nw: int, worlds: list[int], *, batch_size=None, interleave=None):
    rng = random.Random(seed)
    cfg = ConsumerConfig(
        seed=seed,
        batch_size=batch_size or rng.randint(1, 3),
        interleave=interleave or rng.randint(1, 2),
    )
    trained: list[str] = []
    state = None
    for i, world in enumerate(worlds):
        got, state = _phase(store, ref, cfg, world, state, nw, rng, final=i == len(worlds) - 1)
        trained += got
    assert len(trained) == len(set(trained)), (
        f"seed {seed}: duplicates {sorted(t for t in trained if trained.count(t) > 1)}"
    )
    assert set(trained) == _eligible(store, ref), (
        f"seed {seed}: missing {_eligible(store, ref) - set(trained)}"
    )
    return state


@pytest.fixture(scope="module")
def rstore(tmp_path_factory, kit):
    # 9 shards x 5 samples over 6 runs (r3 = val) and two exclusions: 34 eligible train samples
    root = tmp_path_factory.mktemp("resume")
    return kit.build_store(root, n_shards=9, per_shard=5, exclude=("scene__r0__000006", "scene__r4__000010"))


@pytest.mark.parametrize("seed", range(50))
def test_random_kill_resume_trials(rstore, seed):
    store, ref = rstore
    rng = random.Random(1000 + seed)
    nw = 2 if seed % 2 else 0
    worlds = [rng.randint(1, 3) for _ in range(rng.randint(2, 4))]
    _trial(store, ref, seed, nw, worlds)


@pytest.mark.parametrize("nw", [0, 2])
def test_three_to_two_ranks(rstore, nw, kit):
    store, ref = rstore
    cfg = ConsumerConfig(seed=7, batch_size=2)
    trained: list[str] = []
    states = []
    for r in range(3):  # 3 ranks: 2 steps each, then checkpoint (shards left half-read)
        ds = StreamingCache(store, cfg, manifest=ref, rank=r, world_size=3)
        it = ds.iter_batches(_loader(ds, nw))
        for _ in range(2):
            b = next(it)
            ds.mark_consumed(b)
            trained += [k.sample_id for k in b.keys]
        del it
        states.append(ds.state_dict())
    state = merge_state_dicts(states)
    masks = [int(v, 16) for v in state["consumed"].values()]
    assert any(m and m + 1 & m for m in masks)  # at least one shard is partly consumed
    plans = []
    for r in range(2):  # resume on 2 ranks: disjoint shards, only the remaining samples
        ds = StreamingCache(store, cfg, manifest=ref, rank=r, world_size=2)
        ds.load_state_dict(state)
        plans.append(set(ds.rank_shards()))
        trained += kit.consume(ds, _loader(ds, nw))
    assert not plans[0] & plans[1]
    assert len(trained) == len(set(trained)) and set(trained) == _eligible(store, ref)


def test_resume_of_a_resume_keeps_advancing(rstore):
    store, ref = rstore
    cfg = ConsumerConfig(seed=3, batch_size=2)
    consumed_counts = []
    state = None
    trained: list[str] = []
    for _ in range(4):  # checkpoint, resume, checkpoint, resume ... within one epoch
        ds = StreamingCache(store, cfg, manifest=ref, rank=0, world_size=1)
        if state is not None:
            ds.load_state_dict(state)
        for step, b in enumerate(ds.iter_batches()):
            ds.mark_consumed(b)
            trained += [k.sample_id for k in b.keys]
            if step == 2:
                break
        state = ds.state_dict()
        consumed_counts.append(sum(bin(int(v, 16)).count("1") for v in state["consumed"].values()))
    assert consumed_counts == [6, 12, 18, 24]
    assert len(trained) == len(set(trained)) == 24


def test_world_size_does_not_change_the_canonical_order(rstore):
    store, ref = rstore
    orders = {
        w: StreamingCache(store, ConsumerConfig(seed=5), manifest=ref, rank=0, world_size=w).canonical_order()
        for w in (1, 2, 3)
    }
    assert orders[1] == orders[2] == orders[3]
    ranks = [
        StreamingCache(store, ConsumerConfig(seed=5), manifest=ref, rank=r, world_size=3).rank_shards()
        for r in range(3)
    ]
    flat = [s for r in ranks for s in r]
    assert len(flat) == len(set(flat)) == len(orders[1])  # disjoint, complete


def test_order_is_deterministic_per_seed_and_epoch(rstore):
    store, ref = rstore

    def run(seed, epochs):
        ds = StreamingCache(store, ConsumerConfig(seed=seed), manifest=ref, rank=0, world_size=1)
        out = []
        for _ in range(epochs):
            ids = []
            for b in ds.iter_batches():
                ids += [k.sample_id for k in b.keys]
                ds.mark_consumed(b)
            out.append(ids)
            ds.advance_epoch()
        return out

    a, b, c = run(1, 2), run(1, 2), run(2, 1)
    assert a == b
    assert a[0] != a[1] and sorted(a[0]) == sorted(a[1])
    assert a[0] != c[0]


def test_checkpoint_at_epoch_boundary_resumes_full_next_epoch(rstore, kit):
    store, ref = rstore
    ds = StreamingCache(store, ConsumerConfig(seed=4), manifest=ref, rank=0, world_size=1)
    first = kit.consume(ds)
    ds.advance_epoch()
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == {}
    ds2 = StreamingCache(store, ConsumerConfig(seed=4), manifest=ref, rank=0, world_size=2)
    ds2.load_state_dict(state)
    ds3 = StreamingCache(store, ConsumerConfig(seed=4), manifest=ref, rank=1, world_size=2)
    ds3.load_state_dict(state)
    second = kit.consume(ds2) + kit.consume(ds3)
    assert sorted(first) == sorted(second) and len(second) == len(set(second))


def test_checkpoint_after_last_sample_before_advance(rstore):
    store, ref = rstore
    ds = StreamingCache(store, ConsumerConfig(seed=4), manifest=ref, rank=0, world_size=1)
    for b in ds.iter_batches():
        ds.mark_consumed(b)
    ds2 = StreamingCache(store, ConsumerConfig(seed=4), manifest=ref, rank=0, world_size=3)
    ds2.load_state_dict(ds.state_dict())
    assert list(ds2.iter_batches()) == []
    ds2.advance_epoch()
    assert ds2.epoch == 1 and ds2.rank_remaining() > 0


def test_prefetched_but_unmarked_batches_come_back(rstore):
    store, ref = rstore
    ds = StreamingCache(store, ConsumerConfig(seed=8, batch_size=2), manifest=ref, rank=0, world_size=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4)
    it = ds.iter_batches(loader)
    b0 = next(it)
    ds.mark_consumed(b0)
    b1 = next(it)  # received (and more prefetched) but never trained
    del it
    again = [
        k.sample_id for b in ds.iter_batches(DataLoader(ds, batch_size=None, num_workers=2)) for k in b.keys
    ]
    assert {k.sample_id for k in b1.keys} <= set(again)
    assert not {k.sample_id for k in b0.keys} & set(again)


def test_guards(rstore):
    store, ref = rstore
    ds = StreamingCache(store, ConsumerConfig(seed=1), manifest=ref, rank=0, world_size=1)
    with pytest.raises(ValueError, match="batch_size=None"):
        next(ds.iter_batches(DataLoader(ds, batch_size=2)))
    with pytest.raises(ValueError, match="persistent_workers"):
        next(ds.iter_batches(DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True)))
    b = next(ds.iter_batches())
    ds.mark_consumed(b)
    with pytest.raises(StateError, match="consumed twice"):
        ds.mark_consumed(b)
    with pytest.raises(RefreshMidEpochError):
        ds.refresh()
    with pytest.raises(StateError, match="not consumed yet"):
        ds.advance_epoch()
    other = StreamingCache(store, ConsumerConfig(seed=2), manifest=ref, rank=0, world_size=1)
    with pytest.raises(StateError, match="state was taken with"):
        other.load_state_dict(ds.state_dict())
    s2 = StreamingCache(store, ConsumerConfig(seed=1), manifest=ref, rank=0, world_size=1)
    s2.advance_epoch(require_complete=False)
    with pytest.raises(StateError, match="differ in epoch"):
        merge_state_dicts([ds.state_dict(), s2.state_dict()])


def test_val_split_and_exclusions(rstore):
    store, ref = rstore
    ds = StreamingCache(store, ConsumerConfig(split="val"), manifest=ref, rank=0, world_size=1)
    val = [k.sample_id for b in ds.iter_batches() for k in b.keys]
    assert val and all("__r3__" in v for v in val)
    assert set(val) == _eligible(store, ref, "val")
    extra = sorted(_eligible(store, ref))[:3]
    ds = StreamingCache(
        store, ConsumerConfig(extra_exclude_sample_ids=tuple(extra)), manifest=ref, rank=0, world_size=1
    )
    got = {k.sample_id for b in ds.iter_batches() for k in b.keys}
    assert got == _eligible(store, ref) - set(extra)


# --- a malformed checkpointed state names the field --------------------------------------------


_DELETE = object()


def _taken_state(store, ref) -> dict:
    """A real state after one trained batch (a partly consumed shard), as a JSON round trip gives it."""
    ds = StreamingCache(store, ConsumerConfig(seed=1, batch_size=2), manifest=ref, rank=0, world_size=1)
    ds.mark_consumed(next(ds.iter_batches()))
    return json.loads(json.dumps(ds.state_dict()))


def _edit(state: dict, path: tuple, value=_DELETE) -> dict:
    bad = copy.deepcopy(state)
    node = bad
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return bad


def _shard(state: dict) -> str:
    return next(iter(state["consumed"]))


_FAILURE = {
    "epoch": 0,
    "shard": "shards/w/000000.tar",
    "shard_sha256": "a" * 64,
    "kind": "verify",
    "sample": None,
    "offset": 512,
    "message": "bad bytes",
    "yielded_sample_ids": [],
    "action": "quarantine",
}

MALFORMED = [
    ("no_epoch", lambda s: _edit(s, ("epoch",)), r"field epoch: Field required"),
    ("epoch_text", lambda s: _edit(s, ("epoch",), "one"), r"field epoch: Input should be a valid integer"),
    ("epoch_negative", lambda s: _edit(s, ("epoch",), -1), r"field epoch: Input should be greater than"),
    (
        "format",
        lambda s: _edit(s, ("format",), "v0"),
        r"field format: Input should be 'gc25d_cache_state_v1'",
    ),
    ("no_manifest", lambda s: _edit(s, ("manifest",)), r"field manifest: Field required"),
    ("manifest_sha", lambda s: _edit(s, ("manifest", "sha256")), r"field manifest\.sha256: Field required"),
    (
        "manifest_commit",
        lambda s: _edit(s, ("manifest", "commit"), "main"),
        r"field manifest: .*40-hex commit",
    ),
    ("config_seed", lambda s: _edit(s, ("config", "seed")), r"field config\.seed: Field required"),
    (
        "consumed_list",
        lambda s: _edit(s, ("consumed",), ["x"]),
        r"field consumed: Input should be a valid dict",
    ),
    (
        "consumed_hex",
        lambda s: _edit(s, ("consumed", _shard(s)), "zz"),
        r"field consumed\['shards/[^']+'\]: String should match pattern",
    ),
    (
        "consumed_int",
        lambda s: _edit(s, ("consumed", _shard(s)), 3),
        r"field consumed\['shards/[^']+'\]: Input should be a valid string",
    ),
    (
        "failure_kind",
        lambda s: _edit(s, ("failures",), [{k: v for k, v in _FAILURE.items() if k != "kind"}]),
        r"field failures\[0\]\.kind: Field required",
    ),
    (
        "quarantined_key",
        lambda s: _edit(s, ("quarantined",), {"not-a-sha": "shards/w/000000.tar"}),
        r"field quarantined\['not-a-sha'\]",
    ),
    ("none", lambda s: None, r"field <root>: Input should be a valid dictionary"),
]


@pytest.mark.parametrize(("name", "make", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_state_names_the_source_and_field(rstore, name, make, says):
    store, ref = rstore
    bad = make(_taken_state(store, ref))
    ds = StreamingCache(store, ConsumerConfig(seed=1, batch_size=2), manifest=ref, rank=0, world_size=1)
    with pytest.raises(
        StateError, match=r"^consumer state: not a valid gc25d_cache_state_v1 state: .*" + says
    ):
        ds.load_state_dict(bad)
    with pytest.raises(StateError, match=r"^rank state 1: .*" + says):
        merge_state_dicts([_taken_state(store, ref), bad])
    source = "/ckpt/state/step-000100/data.json"  # the trainer names the file it read
    with pytest.raises(StateError, match=r"^" + re.escape(source) + ": .*" + says):
        ds.load_state_dict(bad, source=source)


def test_state_that_does_not_fit_the_snapshot_names_the_shard(rstore):
    store, ref = rstore
    state = _taken_state(store, ref)
    ds = StreamingCache(store, ConsumerConfig(seed=1, batch_size=2), manifest=ref, rank=0, world_size=1)
    too_many = _edit(state, ("consumed", _shard(state)), format(1 << 40, "x"))
    with pytest.raises(
        StateError, match=r"^c\.json: field consumed\['shards/[^']+'\]=10000000000 does not fit"
    ):
        ds.load_state_dict(too_many, source="c.json")
    unknown = _edit(state, ("consumed", "shards/none/000009.tar"), "1")
    with pytest.raises(StateError, match=r"field consumed\['shards/none/000009\.tar'\]=1 does not fit"):
        ds.load_state_dict(unknown)


def test_valid_state_with_a_failure_record_round_trips(rstore):
    """A well-formed state (here with a recorded failure and a quarantine) still loads and merges."""
    store, ref = rstore
    state = _taken_state(store, ref)
    state["failures"] = [_FAILURE]
    state["quarantined"] = {"a" * 64: "shards/w/000000.tar"}
    ds = StreamingCache(store, ConsumerConfig(seed=1, batch_size=2), manifest=ref, rank=0, world_size=1)
    ds.load_state_dict(state)
    again = json.loads(json.dumps(ds.state_dict()))
    assert again == state
    assert merge_state_dicts([again, state]) == state
