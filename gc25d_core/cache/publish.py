"""Publication: conversion workers pack shards + receipts; one publisher lists verified shards in a
new immutable snapshot with a parent check; imports copy old shards byte for byte.

Worker side (any number of workers, disjoint ``shards/<worker>/`` paths)::

    res = pack_shard(store, worker="w0", name="w0-000017", samples=[(sid, tensors, meta), ...],
                     schema=SCHEMA_GC25D)

Publisher side (one logical publisher; concurrent ones are safe, they serialise on the CAS)::

    result = publish_snapshot(store)            # discovers unlisted receipts, verifies, publishes

The publisher re-reads every new shard at a pinned revision and checks it against its receipt
(size, SHA256, member listing, per-member hashes, and each sample's split group against the group
its own verified JSON gives under the schema; ``deep`` also deserialises each verified PT and checks
the schema) before listing it. It commits ``manifests/v<N>.json`` and ``manifest.json`` in
one commit whose parent is the head it read. A lost race (StaleParentError / HTTP 412) rebases:
re-read the head and the new parent snapshot, rebuild as N+1. Any other error re-reads the head
first: if our exact ``v<N>.json`` is there, the commit landed ("error but it landed") and is not
repeated; versions are create-only, so nothing is ever overwritten.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gc25d_core.atomic import STALE_AFTER_S, make_tmp_file, sweep_stale_tmp
from gc25d_core.cache.errors import (
    AlreadyExistsError,
    CacheError,
    ManifestError,
    PublishError,
    SampleSchemaError,
    ShardError,
    StaleParentError,
)
from gc25d_core.cache.manifest import (
    POINTER_PATH,
    RECEIPTS_DIR,
    SHARD_NAME_RE,
    Manifest,
    ManifestRef,
    Provenance,
    Receipt,
    ReceiptSample,
    SampleEntry,
    SampleSchema,
    ShardEntry,
    SourceRef,
    SplitRule,
    check_sample_id,
    compute_totals,
    get_schema,
    manifest_bytes,
    parse_receipt,
    receipt_bytes,
    sha256_hex,
    shard_paths,
    validate_sample,
    version_path,
)
from gc25d_core.cache.snapshots import Snapshot, read_snapshot
from gc25d_core.cache.stores import Addition, LocalStore, Store
from gc25d_core.cache.tario import (
    MemberSpec,
    VerifiedMember,
    deserialize_json,
    deserialize_pt,
    encode_json,
    encode_pt,
    verify_stream,
    write_shard,
)

SampleInput = tuple[str, "bytes | Mapping[str, Any]", "Mapping[str, Any] | bytes"]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _log(reporter: Any, msg: str, level: str = "info") -> None:
    if reporter is not None:
        reporter.log(msg, level)


@contextlib.contextmanager
def _tmp_file(store: Store, tmp_dir: Path | str | None) -> Iterator[Path]:
    """A temp file on the store's filesystem when local (so the commit is a link, not a copy).

    Its name carries this writer's host and pid: a writer killed before the ``finally`` leaves it
    behind (hard-linked to the committed shard, so it would pin a whole shard's bytes after a later
    cleanup of the store), and ``sweep_store_tmp`` removes it once the writer is dead."""
    if tmp_dir is None and isinstance(store, LocalStore):
        tmp_dir = store.root / LocalStore.META / "tmp"
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
    tmp = make_tmp_file(tmp_dir, "shard")
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def sweep_store_tmp(store: Store, *, max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temp files killed writers left in a local store (its tmp folder, and the shard,
    receipt and manifest folders its commits write into). Live writers' files stay."""
    if not isinstance(store, LocalStore):
        return []
    return sweep_stale_tmp(store.root, recursive=True, max_age_s=max_age_s)


# ----------------------------------------------------------------------------------------------
# worker side


@dataclass(frozen=True)
class PackResult:
    receipt: Receipt
    commit: str  # a store commit at which shard and receipt are visible
    shard_path: str
    receipt_path: str
    created: bool  # False: an identical shard was already there


def receipt_samples(members: Iterable[Any], groups: Sequence[str]) -> tuple[ReceiptSample, ...]:
    """A receipt's per-sample records from the verified/written TAR members (same order) and groups."""
    return tuple(
        ReceiptSample(
            id=m.id,
            pt_size=m.pt_size,
            pt_sha256=m.pt_sha256,
            json_size=m.json_size,
            json_sha256=m.json_sha256,
            group=g,
        )
        for m, g in zip(members, groups, strict=True)
    )


def _existing_receipt(store: Store, receipt_path: str) -> tuple[Receipt, str] | None:
    head = store.head()
    if head is None or not store.exists(receipt_path, head):
        return None
    return parse_receipt(store.read_bytes(receipt_path, head), receipt_path), head


def pack_shard(
    store: Store,
    *,
    worker: str,
    name: str,
    samples: Iterable[SampleInput],
    schema: str,
    dims: Mapping[str, int] | None = None,
    validate: bool = True,
    source: SourceRef | None = None,
    tmp_dir: Path | str | None = None,
) -> PackResult:
    """Write ``samples`` = ``(sample_id, pt_bytes | {name: tensor}, json_dict)`` as
    ``shards/<worker>/<name>.tar`` plus ``receipts/<worker>/<name>.json`` in one commit.

    ``samples`` may be a generator (one sample in memory at a time). ``validate`` checks each
    sample against ``schema`` (and pinned ``dims``) before it is written. Each sample's split group
    is the one ``schema`` reads from its JSON (the publisher checks it again against the bytes).
    Re-packing identical
    bytes is a no-op (``created=False``); different bytes under an existing name raise
    AlreadyExistsError (shards are create-only).
    """
    sch = get_schema(schema)
    shard_path, receipt_path = shard_paths(worker, name)
    bound: dict[str, int] = dict(dims or {})
    groups: list[str] = []

    def encoded() -> Iterator[tuple[str, bytes, bytes]]:
        for sid, payload, meta in samples:
            check_sample_id(sid)
            pt = encode_pt(payload)
            js = encode_json(meta)
            meta_obj = json.loads(js)
            if validate:
                tensors = payload if isinstance(payload, Mapping) else deserialize_pt(pt)
                try:
                    bound.update(validate_sample(sch, dict(tensors), meta_obj, bound))
                except SampleSchemaError as e:
                    raise SampleSchemaError(f"pack {shard_path} sample {sid}: {e}") from None
            groups.append(sample_group(sch, sid, js))
            yield sid, pt, js

    with _tmp_file(store, tmp_dir) as tmp:
        with open(tmp, "wb") as f:
            info = write_shard(f, encoded())
            f.flush()
            os.fsync(f.fileno())
        receipt = Receipt(
            schema_name=schema,
            worker=worker,
            shard_path=shard_path,
            size=info.size,
            sha256=info.sha256,
            samples=receipt_samples(info.members, groups),
            dims={k: v for k, v in bound.items() if k in sch.pinned_symbols},
            created_at=_now(),
            source=source,
        )
        return _commit_shard(store, receipt, tmp)


def _commit_shard(store: Store, receipt: Receipt, tar_file: Path) -> PackResult:
    shard_path, receipt_path = receipt.shard_path, receipt.receipt_path
    have = _existing_receipt(store, receipt_path)
    if have is not None:
        old, head = have
        if old.sha256 == receipt.sha256 and old.size == receipt.size:
            return PackResult(old, head, shard_path, receipt_path, created=False)
        raise AlreadyExistsError(
            f"{receipt_path} exists for different bytes ({old.sha256} != {receipt.sha256})"
        )
    commit = store.commit(
        {
            shard_path: Addition(file=tar_file, sha256=receipt.sha256),
            receipt_path: receipt_bytes(receipt),
        },
        parent=None,
        check_parent=False,
        message=f"add {shard_path}",
    )
    return PackResult(receipt, commit, shard_path, receipt_path, created=True)


# ----------------------------------------------------------------------------------------------
# verification


def read_receipt(store: Store, receipt_path: str, revision: str) -> Receipt:
    r = parse_receipt(store.read_bytes(receipt_path, revision), f"{receipt_path}@{revision}")
    if r.receipt_path != receipt_path:
        raise ManifestError(f"{receipt_path} describes {r.shard_path} (expected at {r.receipt_path})")
    return r


def sample_group(schema: SampleSchema, sample_id: str, json_bytes: bytes) -> str:
    """The split group a sample's own JSON gives under ``schema``: the one authority for its split
    (receipts and manifests only record it, and verification checks them against it)."""
    try:
        meta = deserialize_json(json_bytes)
    except ValueError:  # not JSON: the schema's fallback (the sample id)
        meta = {}
    return schema.group_of(sample_id, meta if isinstance(meta, dict) else {})


def _group_checker(
    schema_name: str, shard: str, samples: Sequence[ReceiptSample]
) -> Callable[[VerifiedMember], None]:
    """Check the group a receipt / manifest lists for each sample against the sample's JSON."""
    sch = get_schema(schema_name)
    source = f"json field {sch.group_field!r}" if sch.group_field else "its sample id"

    def check(vm: VerifiedMember) -> None:
        assert vm.json_bytes is not None
        listed, own = samples[vm.index].group, sample_group(sch, vm.sample_id, vm.json_bytes)
        if listed != own:
            raise ShardError(
                f"split group {listed!r} is listed, but the sample's {source} gives {own!r}",
                shard=shard,
                sample=vm.sample_id,
                offset=vm.offset,
            )

    return check


def _deep_checker(schema_name: str, dims: Mapping[str, int], shard: str) -> Callable[[VerifiedMember], None]:
    sch = get_schema(schema_name)

    def check(vm: VerifiedMember) -> None:
        assert vm.pt is not None and vm.json_bytes is not None
        try:
            validate_sample(sch, deserialize_pt(vm.pt), deserialize_json(vm.json_bytes), dims)
        except (SampleSchemaError, ValueError) as e:
            raise ShardError(
                f"schema {schema_name}: {e}", shard=shard, sample=vm.sample_id, offset=vm.offset
            ) from None
        except Exception as e:  # torch.load rejected verified bytes (weights_only)
            raise ShardError(
                f"PT does not load with weights_only=True: {e}",
                shard=shard,
                sample=vm.sample_id,
                offset=vm.offset,
            ) from None

    return check


def verify_receipt(
    store: Store,
    receipt_path: str,
    *,
    revision: str,
    deep: bool = True,
    dims: Mapping[str, int] | None = None,
) -> Receipt:
    """Re-read the shard a receipt describes, at ``revision``, and check every byte against it.

    Raises ManifestError (bad receipt) or ShardError (naming shard, sample, offset)."""
    r = read_receipt(store, receipt_path, revision)
    _verify_shard(
        store,
        r.shard_path,
        revision,
        r.size,
        r.sha256,
        r.samples,
        r.schema_name,
        {**r.dims, **(dims or {})},
        deep,
    )
    return r


def _verify_shard(
    store: Store,
    path: str,
    revision: str,
    size: int,
    sha256: str,
    samples: Sequence[ReceiptSample],
    schema_name: str,
    dims: Mapping[str, int],
    deep: bool,
) -> None:
    """Stream one shard at ``revision`` and check its bytes and members, and each listed group
    against the sample's JSON (cheap, so always); ``deep`` also deserialises every (verified)
    sample and checks it against the schema."""
    check_group = _group_checker(schema_name, path, samples)
    check_schema = _deep_checker(schema_name, dims, path) if deep else None

    def on_member(vm: VerifiedMember) -> None:
        if check_schema is not None:  # first: a JSON that is not an object has no group field
            check_schema(vm)
        check_group(vm)

    verify_stream(
        store.open_range(path, revision, size),
        shard=path,
        size=size,
        sha256=sha256,
        expected=samples,
        on_member=on_member,
        keep=lambda i: True,  # the JSON is needed for the group; payloads are in memory anyway
    )


def shard_entry(receipt: Receipt, revision: str, rule: SplitRule) -> ShardEntry:
    return ShardEntry(
        path=receipt.shard_path,
        worker=receipt.worker,
        revision=revision,
        size=receipt.size,
        sha256=receipt.sha256,
        receipt=receipt.receipt_path,
        samples=tuple(SampleEntry(**s.model_dump(), split=rule.split_of(s.group)) for s in receipt.samples),
        source=receipt.source,
    )


@dataclass
class VerifyReport:
    version: int
    commit: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def verify_snapshot(
    store: Store,
    version: int | None = None,
    *,
    revision: str | None = None,
    deep: bool = False,
    shards: Sequence[str] | None = None,
    reporter: Any = None,
) -> VerifyReport:
    """Stream every listed shard (or the ``shards`` subset) and verify it; collect failures."""
    snap = read_snapshot(store, version, revision=revision)
    m = snap.manifest
    todo = [s for s in m.shards if shards is None or s.path in shards]
    rep = VerifyReport(snap.ref.version, snap.ref.commit)
    bar = reporter.progress(total=len(todo), unit="shards") if reporter is not None else None
    for sh in todo:
        try:
            _verify_shard(
                store, sh.path, sh.revision, sh.size, sh.sha256, sh.samples, m.schema_name, m.dims, deep
            )
            rep.shards += 1
            rep.samples += len(sh.samples)
            rep.bytes += sh.size
        except ShardError as e:
            rep.failures.append({"shard": e.shard, "sample": e.sample, "offset": e.offset, "error": str(e)})
            _log(reporter, str(e), "error")
        if bar is not None:
            bar.update(1)
    return rep


# ----------------------------------------------------------------------------------------------
# publisher


@dataclass
class PublishResult:
    ref: ManifestRef | None  # the snapshot now current (None: nothing was ever published)
    added_shards: list[str]
    added_samples: int
    rejected: dict[str, str]  # receipt path -> reason
    attempts: int
    noop: bool
    landed_after_error: bool = False

    @property
    def version(self) -> int:
        return self.ref.version if self.ref else 0

    @property
    def snapshot_id(self) -> str | None:
        return self.ref.snapshot_id if self.ref else None


def discover_receipts(store: Store, revision: str, listed: Manifest | None) -> list[str]:
    """Receipts present at ``revision`` whose shards are not listed yet (sorted)."""
    done = {s.receipt for s in listed.shards} if listed else set()
    return [
        p for p in store.list_files(f"{RECEIPTS_DIR}/", revision) if p.endswith(".json") and p not in done
    ]


def publish_snapshot(
    store: Store,
    *,
    receipts: Sequence[str] | None = None,
    schema_name: str | None = None,
    split_rule: SplitRule | None = None,
    dims: Mapping[str, int] | None = None,
    exclude_add: Iterable[str] = (),
    exclude_remove: Iterable[str] = (),
    provenance: Provenance | None = None,
    sources: Sequence[SourceRef] | None = None,
    deep_verify: bool = True,
    max_attempts: int = 12,
    backoff_s: float = 0.05,
    reporter: Any = None,
    before_commit: Callable[[int], None] | None = None,
) -> PublishResult:
    """Publish the next snapshot: parent snapshot + newly verified shards (+ exclusion changes).

    ``receipts``: explicit receipt paths (default: every unlisted receipt at the head).
    First publication: ``schema_name`` (else the receipts'), ``split_rule`` (default: hash, 2 %)
    and ``dims`` define the dataset; later ones must agree. Receipts that fail verification (bytes,
    or a group that disagrees with the sample's own JSON) or collide with listed sample ids are not
    listed and are reported in ``rejected``. A local store's stale temp files are swept first.
    ``before_commit(attempt)`` is a test hook called just before each commit call.
    """
    sweep_store_tmp(store)
    ex_add, ex_rm = sorted(set(exclude_add)), set(exclude_remove)
    verified: dict[str, tuple[Receipt, str] | str] = {}  # receipt path -> (receipt, revision) | reason
    last_err = ""
    for attempt in range(1, max_attempts + 1):
        if attempt > 1 and backoff_s > 0:
            time.sleep(min(2.0, backoff_s * 2 ** (attempt - 2)))
        head = store.head()
        parent: Snapshot | None = None
        if head is not None and store.exists(POINTER_PATH, head):
            parent = read_snapshot(store, None, revision=head)
        pm = parent.manifest if parent else None
        if pm is not None:
            if schema_name is not None and schema_name != pm.schema_name:
                raise PublishError(f"snapshot schema is {pm.schema_name}, asked to publish {schema_name}")
            if split_rule is not None and split_rule != pm.split_rule:
                raise PublishError("the split rule of a dataset cannot change (stable by group)")
        todo = (
            list(receipts) if receipts is not None else (discover_receipts(store, head, pm) if head else [])
        )
        listed_receipts = {s.receipt for s in pm.shards} if pm else set()
        todo = [p for p in todo if p not in listed_receipts]

        schema = pm.schema_name if pm else schema_name
        rule = pm.split_rule if pm else (split_rule or SplitRule())
        m_dims: dict[str, int] = dict(pm.dims) if pm else dict(dims or {})
        id_owner: dict[str, str] = {s.id: sh.path for sh in (pm.shards if pm else ()) for s in sh.samples}
        rejected: dict[str, str] = {}
        new_entries: list[ShardEntry] = []
        for rp in sorted(todo):
            if rp not in verified:
                assert head is not None
                try:
                    verified[rp] = (
                        verify_receipt(store, rp, revision=head, deep=deep_verify, dims=m_dims),
                        head,
                    )
                    _log(reporter, f"verified {rp}")
                except (CacheError, OSError) as e:
                    verified[rp] = f"{type(e).__name__}: {e}"
            got = verified[rp]
            if isinstance(got, str):
                rejected[rp] = got
                continue
            r, rev = got
            if schema is None:  # first publication: the first verified receipt names the schema
                schema = r.schema_name
            if r.schema_name != schema:
                rejected[rp] = f"receipt schema {r.schema_name} != snapshot schema {schema}"
                continue
            clash = {k: (m_dims[k], v) for k, v in r.dims.items() if k in m_dims and m_dims[k] != v}
            if clash:
                rejected[rp] = f"dims {clash} disagree with the snapshot"
                continue
            dup = next((s.id for s in r.samples if s.id in id_owner), None)
            if dup is not None:
                rejected[rp] = (
                    f"shard {r.shard_path} sample {dup}: duplicate sample id (already in {id_owner[dup]})"
                )
                continue
            m_dims.update(r.dims)
            for s in r.samples:
                id_owner[s.id] = r.shard_path
            new_entries.append(shard_entry(r, rev, rule))
        for rp, why in rejected.items():
            _log(reporter, f"rejected {rp}: {why}", "error")

        old_ex = set(pm.exclude_sample_ids) if pm else set()
        excl = tuple(sorted((old_ex | set(ex_add)) - ex_rm))
        prov = provenance if provenance is not None else (pm.provenance if pm else Provenance())
        srcs = tuple(sources) if sources is not None else (pm.sources if pm else ())
        changed = (
            bool(new_entries)
            or excl != tuple(sorted(old_ex))
            or (pm is not None and (prov != pm.provenance or srcs != pm.sources))
        )
        if not changed or schema is None:
            return PublishResult(parent.ref if parent else None, [], 0, rejected, attempt, noop=True)

        version = (pm.version + 1) if pm else 1
        shards_all = (pm.shards if pm else ()) + tuple(new_entries)
        manifest = Manifest(
            version=version,
            parent_version=pm.version if pm else None,
            parent_commit=head,
            created_at=_now(),
            schema_name=schema,
            dims=m_dims,
            split_rule=rule,
            exclude_sample_ids=excl,
            provenance=prov,
            sources=srcs,
            shards=shards_all,
            totals=compute_totals(shards_all, excl),
        )
        data = manifest_bytes(manifest)
        vpath = version_path(version)
        if head is not None and store.exists(vpath, head):
            raise PublishError(
                f"{vpath} exists at {head} but {POINTER_PATH} says v{version - 1}: inconsistent store"
            )
        added = [e.path for e in new_entries]
        n_added = sum(len(e.samples) for e in new_entries)
        if before_commit is not None:
            before_commit(attempt)
        try:
            commit = store.commit(
                {vpath: data, POINTER_PATH: data},
                parent=head,
                check_parent=True,
                message=f"publish {manifest.snapshot_id}: +{len(added)} shards, +{n_added} samples",
            )
        except (StaleParentError, AlreadyExistsError) as e:
            last_err = f"{type(e).__name__}: {e}"
            _log(reporter, f"lost the race for {manifest.snapshot_id} ({last_err}); rebasing")
            continue
        except Exception as e:  # uncertain: did it land? re-read the head before anything else
            last_err = f"{type(e).__name__}: {e}"
            _log(
                reporter, f"commit of {manifest.snapshot_id} failed ({last_err}); re-reading head", "warning"
            )
            new_head = store.head()
            if (
                new_head is not None
                and store.exists(vpath, new_head)
                and sha256_hex(store.read_bytes(vpath, new_head)) == sha256_hex(data)
            ):
                ref = ManifestRef(version=version, commit=new_head, sha256=sha256_hex(data))
                _log(reporter, f"{manifest.snapshot_id} had landed despite the error; not publishing twice")
                return PublishResult(
                    ref, added, n_added, rejected, attempt, noop=False, landed_after_error=True
                )
            continue
        ref = ManifestRef(version=version, commit=commit, sha256=sha256_hex(data))
        _log(
            reporter,
            f"published {manifest.snapshot_id} at {commit}: +{len(added)} shards, +{n_added} samples",
        )
        return PublishResult(ref, added, n_added, rejected, attempt, noop=False)
    raise PublishError(f"could not publish after {max_attempts} attempts; last error: {last_err}")


# ----------------------------------------------------------------------------------------------
# import from an older cache (byte-for-byte)


@dataclass(frozen=True)
class ImportEntry:
    """A shard of the source cache: path at a pinned revision, exact size and SHA256; ``samples``
    (the source's member listing) when known, else discovered and checked structurally."""

    path: str
    revision: str
    size: int
    sha256: str
    samples: tuple[MemberSpec, ...] | None = None


def entries_from_manifest(m: Manifest) -> list[ImportEntry]:
    return [ImportEntry(s.path, s.revision, s.size, s.sha256, s.samples) for s in m.shards]


def entries_from_listing(data: bytes | str) -> list[ImportEntry]:
    """A legacy listing: JSON list of ``{path, revision, size, sha256}``."""
    rows = json.loads(data)
    return [ImportEntry(str(r["path"]), str(r["revision"]), int(r["size"]), str(r["sha256"])) for r in rows]


def import_shards(
    src: Store,
    entries: Sequence[ImportEntry],
    dst: Store,
    *,
    worker: str,
    schema_name: str,
    source_repo: str,
    deep: bool = False,
    reporter: Any = None,
    tmp_dir: Path | str | None = None,
) -> list[PackResult]:
    """Copy shards byte for byte into ``dst`` as ``shards/<worker>/<name>.tar`` + receipts.

    Each source TAR is streamed once into a temp file while being verified (size, SHA256, member
    structure and per-member hashes where the source lists them; ``deep``: schema too); only then
    is it committed. The receipt records the source (repo, path, revision, SHA256). Never
    re-encodes. Already imported identical shards are skipped."""
    sch = get_schema(schema_name)
    sweep_store_tmp(dst)
    out: list[PackResult] = []
    bar = reporter.progress(total=len(entries), unit="shards") if reporter is not None else None
    for e in entries:
        base = e.path.rsplit("/", 1)[-1]
        if not base.endswith(".tar") or not SHARD_NAME_RE.match(base[:-4]):
            raise ManifestError(f"cannot import {e.path!r}: not a '<name>.tar' shard path")
        shard_path, receipt_path = shard_paths(worker, base[:-4])
        have = _existing_receipt(dst, receipt_path)
        if have is not None:
            old, head = have
            if old.sha256 != e.sha256:
                raise AlreadyExistsError(
                    f"{receipt_path} exists for different bytes ({old.sha256} != {e.sha256})"
                )
            out.append(PackResult(old, head, shard_path, receipt_path, created=False))
            if bar is not None:
                bar.update(1)
            continue
        groups: list[str] = []
        check = _deep_checker(schema_name, {}, e.path) if deep else None

        def on_member(vm: VerifiedMember, check: Any = check, groups: list[str] = groups) -> None:
            if check is not None:
                check(vm)
            assert vm.json_bytes is not None  # bytes already verified
            groups.append(sample_group(sch, vm.sample_id, vm.json_bytes))

        with _tmp_file(dst, tmp_dir) as tmp:
            with open(tmp, "wb") as sink:
                members = verify_stream(
                    src.open_range(e.path, e.revision, e.size),
                    shard=e.path,
                    size=e.size,
                    sha256=e.sha256,
                    expected=e.samples,
                    on_member=on_member,
                    keep=lambda i: True,
                    sink=sink,
                )
                sink.flush()
                os.fsync(sink.fileno())
            if tmp.stat().st_size != e.size:
                raise ShardError("copy size differs from source", shard=e.path, offset=tmp.stat().st_size)
            receipt = Receipt(
                schema_name=schema_name,
                worker=worker,
                shard_path=shard_path,
                size=e.size,
                sha256=e.sha256,
                samples=receipt_samples(members, groups),
                created_at=_now(),
                source=SourceRef(repo=source_repo, revision=e.revision, path=e.path, sha256=e.sha256),
            )
            out.append(_commit_shard(dst, receipt, tmp))
        _log(reporter, f"imported {e.path}@{e.revision[:12]} -> {shard_path}")
        if bar is not None:
            bar.update(1)
    return out
