"""Pack the processed layout (SPEC §5) into training-cache shards and publish a snapshot.

Publication is incremental, because the cache keeps growing while consumers train on fixed
snapshots: a run packs exactly the clips the store does not hold yet (not listed in the head
snapshot, and not in a receipt packed but not yet published, e.g. before a crash), sorted by
clip_id and chunked into new shards of ``samples_per_shard`` clips, the last one possibly smaller
(every processed clip is published by the run that sees it; none waits for a shard to fill). A
shard's name is derived from the clip ids it holds, so packing again after a crash finds what was
packed and never repeats a published id. A receipt that shares an id with the snapshot can never
be published (ids never repeat, e.g. one written by an older chunking over all clips): it is not
submitted, its other clips are packed anew, and it is reported as superseded. Any receipt the
publisher rejects fails the run (``RejectedReceiptsError``).

The split is the SPEC's run-level rule (``SplitRule(method="explicit", val_groups=val_runs)``; the
schema's group of a gc25d sample is its run). Stage 3's extension source is ``cond_ext_canvas``
for rows with a look change at s+81, else the raw ``cond_ext``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gc25d_core.cache.errors import PublishError
from gc25d_core.cache.manifest import POINTER_PATH, SCHEMA_GC25D, SplitRule, parse_receipt
from gc25d_core.cache.publish import (
    PublishResult,
    discover_receipts,
    pack_shard,
    publish_snapshot,
    sweep_store_tmp,
)
from gc25d_core.cache.samples import gc25d_sample
from gc25d_core.cache.snapshots import read_snapshot
from gc25d_core.cache.stores import Store, open_cache_store
from gc25d_core.config import Gc25dConfig
from gc25d_core.index import ClipRow, read_index
from gc25d_core.layout import Layout, Shapes, read_cond, read_cond_ext, read_latents, read_meta


def shard_name(rows: list[ClipRow]) -> str:
    digest = hashlib.sha256("\n".join(r.clip_id for r in rows).encode()).hexdigest()[:16]
    return f"clips-{digest}"


def clip_sample(layout: Layout, shapes: Shapes, row: ClipRow, include_cond: bool):
    record = read_latents(layout.latents(row.clip_id), shapes)
    cond = read_cond(layout, row.clip_id, shapes) if include_cond else None
    ext, source = None, None
    if row.has_ext:
        canvas = layout.cond_ext_canvas(row.clip_id)
        if row.ext_look_change and canvas.is_file():
            ext, source = read_cond_ext(canvas, shapes), "ext_canvas"
        else:
            ext, source = read_cond_ext(layout.cond_ext(row.clip_id), shapes), "cond_ext"
    masking = None
    if cond is not None and layout.meta(row.clip_id).is_file():  # SFT masks the cond with it
        masking = read_meta(layout, row.clip_id, shapes, row.has_ext)
    return gc25d_sample(record, cond_ids=cond, cond_ext=ext, ext_source=source, masking_meta=masking)


class RejectedReceiptsError(PublishError):
    """The publisher refused receipts this run submitted: their clips are not in any snapshot."""

    def __init__(self, message: str, *, rejected: dict[str, str] | None = None):
        super().__init__(message)
        self.rejected = dict(rejected or {})


@dataclass(frozen=True)
class StoreClips:
    """What a store holds of the clips at one head."""

    published: frozenset[str]  # sample ids listed in the head snapshot
    pending: dict[str, tuple[str, ...]]  # unlisted receipt -> its ids: packed, not yet published
    superseded: tuple[str, ...] = ()  # unlisted receipts sharing an id with the snapshot

    @property
    def claimed(self) -> set[str]:
        return set(self.published).union(*self.pending.values())


def read_store_clips(store: Store, head: str | None) -> StoreClips:
    if head is None:
        return StoreClips(frozenset(), {})
    listed = read_snapshot(store, None, revision=head).manifest if store.exists(POINTER_PATH, head) else None
    published = frozenset(s.id for sh in (listed.shards if listed else ()) for s in sh.samples)
    pending: dict[str, tuple[str, ...]] = {}
    superseded: list[str] = []
    for path in discover_receipts(store, head, listed):
        ids = tuple(s.id for s in parse_receipt(store.read_bytes(path, head), f"{path}@{head}").samples)
        if published.isdisjoint(ids):
            pending[path] = ids
        else:
            superseded.append(path)
    return StoreClips(published, pending, tuple(superseded))


def plan_shards(rows: list[ClipRow], claimed: set[str], samples_per_shard: int) -> list[list[ClipRow]]:
    """The new shards for the clips not ``claimed``: sorted by clip_id, chunked, a smaller tail."""
    new = sorted((r for r in rows if r.clip_id not in claimed), key=lambda r: r.clip_id)
    return [new[i : i + samples_per_shard] for i in range(0, len(new), samples_per_shard)]


@dataclass
class PackSummary:
    clips: StoreClips
    packed: list[str] = field(default_factory=list)  # receipt paths written by this run
    num_clips: int = 0


def pack_new_clips(cfg: Gc25dConfig, store: Store, reporter: Any = None) -> PackSummary:
    """Pack every clip of the index the store does not hold yet into new shards (no publication)."""
    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    rows = read_index(layout)
    clips = read_store_clips(store, store.head())
    for path in clips.superseded:
        _log(reporter, f"{path} shares ids with the published snapshot: superseded, its clips are repacked")
    summary = PackSummary(clips=clips, num_clips=len(rows))
    for chunk in plan_shards(rows, clips.claimed, cfg.cache.samples_per_shard):

        def samples(chunk: list[ClipRow] = chunk) -> Iterator[Any]:
            for row in chunk:
                yield clip_sample(layout, shapes, row, cfg.cache.include_cond)

        res = pack_shard(
            store, worker=cfg.cache.worker, name=shard_name(chunk), samples=samples(), schema=SCHEMA_GC25D
        )
        summary.packed.append(res.receipt_path)
        _log(reporter, f"packed shard {res.shard_path} ({len(chunk)} clips)")
    return summary


def _log(reporter: Any, message: str, level: str = "info") -> None:
    if reporter is not None:
        reporter.log(message, level)


def _raise_if_rejected(result: PublishResult) -> None:
    if not result.rejected:
        return
    lines = "\n".join(f"  {path}: {why}" for path, why in sorted(result.rejected.items()))
    landed = f"{result.snapshot_id} holds the others" if result.ref is not None else "nothing is published"
    raise RejectedReceiptsError(
        f"the publisher rejected {len(result.rejected)} receipt(s); their clips are in no snapshot "
        f"({landed}):\n{lines}",
        rejected=result.rejected,
    )


def pack_and_publish(cfg: Gc25dConfig, reporter: Any = None) -> dict[str, Any]:
    """Pack the clips the store does not hold yet, then publish the next snapshot with them and
    every receipt still waiting. Raises RejectedReceiptsError if the publisher refuses any."""
    store = open_cache_store(cfg)
    swept = sweep_store_tmp(store)
    if swept:
        _log(reporter, f"removed {len(swept)} temp file(s) of killed writers")
    packed = pack_new_clips(cfg, store, reporter)
    result = publish_snapshot(
        store,
        receipts=[*packed.clips.pending, *packed.packed],
        split_rule=SplitRule(method="explicit", val_groups=tuple(cfg.index.val_runs)),
        reporter=reporter,
    )
    _raise_if_rejected(result)
    return {
        "store": store.describe(),
        "num_shards_packed": len(packed.packed),
        "num_receipts_pending": len(packed.clips.pending),
        "num_clips": packed.num_clips,
        "num_clips_published_before": len(packed.clips.published),
        "superseded_receipts": list(packed.clips.superseded)[:20],
        "num_tmp_swept": len(swept),
        "snapshot": result.snapshot_id,
        "version": result.version,
        "commit": result.ref.commit if result.ref else None,
        "added_samples": result.added_samples,
        "noop": result.noop,
    }
