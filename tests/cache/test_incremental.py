"""Incremental publication from a growing processed layout: every clip is published exactly once,
whatever the shard size and wherever new clips sort, a crash between packing and publishing is
picked up by the next run, and a receipt the publisher rejects fails the run."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gc25d_core.cache import SCHEMA_GC25D, LocalStore, pack_shard
from gc25d_core.cache.from_layout import RejectedReceiptsError, clip_sample, pack_and_publish, shard_name
from gc25d_core.cache.snapshots import list_versions, read_snapshot
from gc25d_core.config import Gc25dConfig, load_config
from gc25d_core.index import ClipRow, write_index
from gc25d_core.layout import Layout, Shapes

from ..train.world import synthetic_row, write_synthetic_latents

ROOT = Path(__file__).resolve().parents[2]
VAL_RUN, TRAIN_RUN = "R10_s1512", "R10_s2024"  # the tiny preset's val run, and a train run
# Clip starts (x 96) added per snapshot: new clips sort between published ones, before and after
# them; steps that do not fill a shard and steps that fill several.
GROWTH = ([2, 4, 6, 8, 10], [3, 11, 12], [1, 5, 7, 9, 13, 14, 15], [0], [16, 17, 18, 19, 20, 21])


def _cfg(tmp_path: Path, samples_per_shard: int) -> Gc25dConfig:
    return load_config(
        "tiny",
        {
            "paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path / "runs")},
            "cache": {
                "store": str(tmp_path / "cache"),
                "samples_per_shard": samples_per_shard,
                "include_cond": False,
            },
        },
    )


class GrowingLayout:
    """A processed layout whose index grows: latents for each new clip, then the whole index."""

    def __init__(self, cfg: Gc25dConfig):
        self.layout, self.shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
        self.rows: list[ClipRow] = []

    def add(self, starts: list[int]) -> list[str]:
        new = []
        for k in starts:
            for run in (VAL_RUN, TRAIN_RUN):
                row = synthetic_row(run, 96 * k, "val" if run == VAL_RUN else "train")
                write_synthetic_latents(
                    self.layout,
                    self.shapes,
                    row,
                    1000 * k + len(run),
                    ["p"] * 21,
                    np.zeros((21, 5), np.uint8),
                )
                new.append(row.clip_id)
                self.rows.append(row)
        write_index(self.layout, self.rows, {VAL_RUN: "val", TRAIN_RUN: "train"})
        return new

    @property
    def clip_ids(self) -> list[str]:
        return [r.clip_id for r in self.rows]


def _published(cfg: Gc25dConfig) -> list[tuple[str, str]]:
    """(sample id, split) of every listed sample of the current snapshot, with repeats."""
    m = read_snapshot(LocalStore(cfg.cache.store)).manifest
    return [(s.id, s.split) for sh in m.shards for s in sh.samples]


@pytest.mark.parametrize("samples_per_shard", [2, 3, 5])
def test_growing_index_publishes_every_clip_exactly_once(tmp_path, samples_per_shard):
    cfg = _cfg(tmp_path, samples_per_shard)
    grow = GrowingLayout(cfg)
    for step, starts in enumerate(GROWTH, start=1):
        new = grow.add(starts)
        summary = pack_and_publish(cfg)
        assert summary["snapshot"] == f"v{step:06d}" and not summary["noop"], summary
        assert summary["added_samples"] == len(new)
        assert summary["num_shards_packed"] == math.ceil(len(new) / samples_per_shard)
        published = _published(cfg)
        ids = [sid for sid, _ in published]
        assert len(ids) == len(set(ids)) and sorted(ids) == sorted(grow.clip_ids)
        assert dict(published) == {cid: ("val" if VAL_RUN in cid else "train") for cid in ids}
        m = read_snapshot(LocalStore(cfg.cache.store)).manifest
        assert m.totals.num_samples == len(grow.clip_ids)
        assert m.totals.per_split == {"train": len(ids) // 2, "val": len(ids) // 2}
        # each run's new shards hold only that run's new clips
        assert {s.id for sh in m.shards[-summary["num_shards_packed"] :] for s in sh.samples} == set(new)
    again = pack_and_publish(cfg)  # nothing new: no new snapshot, nothing packed
    assert again["noop"] and again["num_shards_packed"] == 0
    assert list_versions(LocalStore(cfg.cache.store)) == list(range(1, len(GROWTH) + 1))


_KILL_AFTER_SECOND_SHARD = textwrap.dedent(
    """
    import os, signal, sys
    from gc25d_core.cache.from_layout import pack_and_publish
    from gc25d_core.config import load_config

    data, store = sys.argv[1], sys.argv[2]
    cfg = load_config("tiny", {"paths": {"data_root": data},
                               "cache": {"store": store, "samples_per_shard": 2, "include_cond": False}})

    class KillAfterTwoShards:
        packed = 0
        def log(self, message, level="info"):
            if message.startswith("packed shard"):
                self.packed += 1
                if self.packed == 2:  # dies between packing and publishing
                    os.kill(os.getpid(), signal.SIGKILL)

    pack_and_publish(cfg, reporter=KillAfterTwoShards())
    """
)


def test_run_killed_between_pack_and_publish_is_picked_up(tmp_path):
    cfg = _cfg(tmp_path, 2)
    grow = GrowingLayout(cfg)
    grow.add([2, 4])
    assert pack_and_publish(cfg)["snapshot"] == "v000001"
    new = grow.add([1, 3, 5])  # 6 new clips, between and after the published ones: 3 shards
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_SECOND_SHARD, str(cfg.paths.data_root), cfg.cache.store],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert list_versions(LocalStore(cfg.cache.store)) == [1]  # packed, not published
    summary = pack_and_publish(cfg)
    assert summary["num_receipts_pending"] == 2 and summary["num_shards_packed"] == 1
    assert summary["snapshot"] == "v000002" and summary["added_samples"] == len(new)
    ids = [sid for sid, _ in _published(cfg)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(grow.clip_ids)


def test_a_rejected_receipt_fails_the_run(tmp_path, kit):
    cfg = _cfg(tmp_path, 2)
    grow = GrowingLayout(cfg)
    grow.add([2, 4])
    pack_and_publish(cfg)
    # another worker's shard, rotted after its receipt was written: the publisher must refuse it
    store = LocalStore(cfg.cache.store)
    rot = pack_shard(
        store, worker="w1", name="rot", samples=[kit.gc_sample(7, "r9", hw=(4, 8))], schema=SCHEMA_GC25D
    )
    path = store.root / rot.shard_path
    data = bytearray(path.read_bytes())
    data[700] ^= 1
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    grow.add([3])
    with pytest.raises(RejectedReceiptsError, match="PT SHA256 mismatch") as raised:
        pack_and_publish(cfg)
    assert rot.receipt_path in str(raised.value) and rot.receipt_path in raised.value.rejected
    # the good new clips still landed; the rejected one is in no snapshot, and every run says so
    ids = {sid for sid, _ in _published(cfg)}
    assert ids == set(grow.clip_ids)
    with pytest.raises(RejectedReceiptsError):
        pack_and_publish(cfg)


def test_a_receipt_repeating_published_ids_is_superseded_and_its_new_clips_repacked(tmp_path):
    """What the former chunking over all clips left behind: a shard repeating a published clip next
    to a new one. It can never be published; the new clip must still be, once."""
    cfg = _cfg(tmp_path, 2)
    grow = GrowingLayout(cfg)
    grow.add([2])
    pack_and_publish(cfg)
    new = grow.add([3])
    published = next(cid for cid in grow.clip_ids if cid not in new)
    rows = {r.clip_id: r for r in grow.rows}
    legacy = [rows[published], rows[new[0]]]
    store = LocalStore(cfg.cache.store)
    res = pack_shard(
        store,
        worker=cfg.cache.worker,
        name=shard_name(legacy),
        samples=[clip_sample(grow.layout, grow.shapes, r, include_cond=False) for r in legacy],
        schema=SCHEMA_GC25D,
    )
    summary = pack_and_publish(cfg)
    assert summary["superseded_receipts"] == [res.receipt_path] and summary["added_samples"] == len(new)
    ids = [sid for sid, _ in _published(cfg)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(grow.clip_ids)
