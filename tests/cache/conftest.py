"""Fixtures for the training-cache tests: tiny gc25d samples, stores, crafted TARs, a fake Hub.

Helpers are exposed through the ``kit`` fixture (a namespace), so the tests do not depend on
how pytest imports this directory.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from gc25d_core.cache import (
    SCHEMA_GC25D,
    ConsumerConfig,
    LocalStore,
    ManifestRef,
    ShardFailure,
    SplitRule,
    StreamingCache,
    pack_shard,
    publish_snapshot,
)
from gc25d_core.cache import consumer as consumer_mod
from gc25d_core.cache.manifest import (
    POINTER_PATH,
    Manifest,
    SampleEntry,
    ShardEntry,
    compute_totals,
    manifest_bytes,
    sha256_hex,
    version_path,
)
from gc25d_core.cache.stores import Addition

VAL_RUNS = ("r3",)


def gc_sample(
    i: int, run: str, *, hw: tuple[int, int] = (1, 1), cond: bool = False
) -> tuple[str, dict, dict]:
    g = torch.Generator().manual_seed(i)
    h, w = hw
    tensors = {
        "latent": torch.randn(48, 21, h, w, generator=g).to(torch.bfloat16),
        "actions_block": torch.randint(0, 255, (21, 5), dtype=torch.uint8, generator=g),
    }
    if cond:
        tensors["cond_ids"] = torch.randint(0, 7, (81, 2, 2), dtype=torch.uint8, generator=g)
    sid = f"scene__{run}__{i:06d}"
    meta = {
        "clip_id": sid,
        "subset": "tiny",
        "scene": "scene",
        "run": run,
        "start": 96 * i,
        "prompts": [f"p{i}"] * 21,
    }
    return sid, tensors, meta


def pack_many(
    store: LocalStore, *, worker: str = "w0", n_shards: int, per_shard: int, start: int = 0, runs: int = 6
) -> list[str]:
    receipts = []
    for k in range(n_shards):
        base = start + k * per_shard
        samples = [gc_sample(base + j, f"r{(base + j) % runs}") for j in range(per_shard)]
        res = pack_shard(
            store,
            worker=worker,
            name=f"{worker}-{start // max(per_shard, 1) + k:06d}",
            samples=samples,
            schema=SCHEMA_GC25D,
        )
        receipts.append(res.receipt_path)
    return receipts


def build_store(
    root: Path,
    *,
    n_shards: int = 6,
    per_shard: int = 5,
    exclude: Sequence[str] = (),
    workers: Sequence[str] = ("w0",),
) -> tuple[LocalStore, ManifestRef]:
    store = LocalStore(root)
    for wi, w in enumerate(workers):
        pack_many(store, worker=w, n_shards=n_shards, per_shard=per_shard, start=wi * 10_000)
    res = publish_snapshot(
        store, split_rule=SplitRule(method="explicit", val_groups=VAL_RUNS), exclude_add=exclude
    )
    assert res.ref is not None and not res.rejected, res.rejected
    return store, res.ref


def copy_store(src: LocalStore, dst: Path) -> LocalStore:
    shutil.copytree(src.root, dst)
    return LocalStore(dst)


def tar_layout(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return tf.getmembers()


def craft_tar(members: Iterable[tuple[str, bytes, bytes]]) -> bytes:
    """Members = (name, data, type); type REGTYPE / SYMTYPE ... (data ignored for links)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data, typ in members:
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.type = 0, typ
            if typ == tarfile.SYMTYPE:
                ti.linkname = "elsewhere.pt"
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def encode(sample: tuple[str, dict, dict]) -> tuple[str, bytes, bytes]:
    from gc25d_core.cache.tario import encode_json, encode_pt

    sid, t, m = sample
    return sid, encode_pt(t), encode_json(m)


def entry_for(sid: str, pt: bytes, js: bytes, run: str) -> SampleEntry:
    rule = SplitRule(method="explicit", val_groups=VAL_RUNS)
    return SampleEntry(
        id=sid,
        pt_size=len(pt),
        pt_sha256=sha256_hex(pt),
        json_size=len(js),
        json_sha256=sha256_hex(js),
        group=run,
        split=rule.split_of(run),
    )


def publish_raw(
    store: LocalStore, shards: Sequence[tuple[str, bytes, Sequence[SampleEntry]]], *, version: int = 1
) -> ManifestRef:
    """Commit raw TAR bytes and a hand-built manifest listing them (bypasses receipts; lets a test
    list exactly the members a malicious TAR *should* have, with its real size and SHA256)."""
    files: dict[str, bytes | Addition] = {}
    for path, data, _ in shards:
        files[path] = data
    head = store.commit(files, parent=store.head(), message="raw shards")
    entries = tuple(
        ShardEntry(
            path=path,
            worker=path.split("/")[1],
            revision=head,
            size=len(data),
            sha256=sha256_hex(data),
            receipt=path.replace("shards/", "receipts/").replace(".tar", ".json"),
            samples=tuple(samples),
        )
        for path, data, samples in shards
    )
    m = Manifest(
        version=version,
        schema_name=SCHEMA_GC25D,
        split_rule=SplitRule(method="explicit", val_groups=VAL_RUNS),
        shards=entries,
        totals=compute_totals(entries, ()),
        dims={"H": 1, "W": 1},
    )
    data = manifest_bytes(m)
    commit = store.commit(
        {version_path(version): data, POINTER_PATH: data}, parent=head, message="raw manifest"
    )
    return ManifestRef(version=version, commit=commit, sha256=sha256_hex(data))


class DeserialiseSpy:
    """Records the SHA256 of every PT the consumer deserialises."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.seen: list[str] = []
        real = consumer_mod.deserialize_pt

        def spy(data: bytes) -> Any:
            self.seen.append(hashlib.sha256(data).hexdigest())
            return real(data)

        monkeypatch.setattr(consumer_mod, "deserialize_pt", spy)


def consume(ds: StreamingCache, loader: Any = None) -> list[str]:
    ids: list[str] = []
    for b in ds.iter_batches(loader):
        ids += [k.sample_id for k in b.keys]
        ds.mark_consumed(b)
    return ids


def expect_failure(ds: StreamingCache) -> tuple[ShardFailure, list[str]]:
    ids: list[str] = []
    try:
        for b in ds.iter_batches():
            ids += [k.sample_id for k in b.keys]
            ds.mark_consumed(b)
    except ShardFailure as e:
        return e, ids
    raise AssertionError(f"no ShardFailure; consumed {ids}")


@pytest.fixture(scope="session")
def kit() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        gc_sample=gc_sample,
        pack_many=pack_many,
        build_store=build_store,
        copy_store=copy_store,
        tar_layout=tar_layout,
        craft_tar=craft_tar,
        encode=encode,
        entry_for=entry_for,
        publish_raw=publish_raw,
        DeserialiseSpy=DeserialiseSpy,
        consume=consume,
        expect_failure=expect_failure,
        ConsumerConfig=ConsumerConfig,
        VAL_RUNS=VAL_RUNS,
    )


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, ManifestRef]:
    """6 shards x 5 tiny samples, one val run, two excluded ids. Read-only for tests."""
    root = tmp_path_factory.mktemp("small_store")
    return build_store(root, n_shards=6, per_shard=5, exclude=("scene__r1__000001", "scene__r2__000020"))
