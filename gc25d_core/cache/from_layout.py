"""Pack the processed layout (SPEC §5) into training-cache shards and publish a snapshot.

Shards hold ``samples_per_shard`` clips in clip_id order. A shard's name is derived from the clip
ids it holds, so packing again after a crash finds the shards already written (their receipts exist)
and skips them; a grown index only adds new shards. The split is the SPEC's run-level rule
(``SplitRule(method="explicit", val_groups=val_runs)`` grouped by run). Stage 3's extension source is
``cond_ext_canvas`` for rows with a look change at s+81, else the raw ``cond_ext``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gc25d_core.cache.manifest import SCHEMA_GC25D, SplitRule, shard_paths
from gc25d_core.cache.publish import pack_shard, publish_snapshot
from gc25d_core.cache.samples import gc25d_sample
from gc25d_core.cache.stores import Store, open_store
from gc25d_core.config import Gc25dConfig
from gc25d_core.index import ClipRow, read_index
from gc25d_core.layout import Layout, Shapes, read_cond, read_cond_ext, read_latents, read_meta


def open_cache_store(cfg: Gc25dConfig) -> Store:
    spec = cfg.cache.store
    if "://" not in spec:
        Path(spec).mkdir(parents=True, exist_ok=True)
    return open_store(spec)


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


def pack_and_publish(cfg: Gc25dConfig, reporter: Any = None) -> dict[str, Any]:
    """Pack every not-yet-packed chunk of clips, then publish the next snapshot (if anything is new)."""
    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    store = open_cache_store(cfg)
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)
    n = cfg.cache.samples_per_shard
    chunks = [rows[i : i + n] for i in range(0, len(rows), n)]
    head = store.head()
    packed = skipped = 0
    for chunk in chunks:
        name = shard_name(chunk)
        _, receipt_path = shard_paths(cfg.cache.worker, name)
        if head is not None and store.exists(receipt_path, head):
            skipped += 1
            continue

        def samples(chunk: list[ClipRow] = chunk) -> Iterator[Any]:
            for row in chunk:
                yield clip_sample(layout, shapes, row, cfg.cache.include_cond)

        pack_shard(
            store,
            worker=cfg.cache.worker,
            name=name,
            samples=samples(),
            schema=SCHEMA_GC25D,
        )
        packed += 1
        if reporter is not None:
            reporter.log(f"packed shard {name} ({len(chunk)} clips)")
    result = publish_snapshot(
        store,
        split_rule=SplitRule(method="explicit", val_groups=tuple(cfg.index.val_runs)),
        reporter=reporter,
    )
    return {
        "store": store.describe(),
        "num_shards_packed": packed,
        "num_shards_skipped": skipped,
        "num_clips": len(rows),
        "snapshot": result.snapshot_id,
        "version": result.version,
        "commit": result.ref.commit if result.ref else None,
        "added_samples": result.added_samples,
        "noop": result.noop,
        "rejected": [str(r) for r in result.rejected][:20],
    }
