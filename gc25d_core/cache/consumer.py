"""Streaming consumer: a verified, exactly-once, resumable IterableDataset over one snapshot.

Contract (dataset card "Streaming consumer contract"; issue 5 item 4):

- One snapshot per epoch, pinned as (version, commit, SHA256 of the manifest bytes). Splits and
  exclusions (manifest + config) decide the eligible samples.
- Canonical order: shards sorted by sha256(seed | epoch | shard sha256 | path) - it depends on
  nothing but (snapshot, seed, epoch). Rank assignment is laid over it: the shards that still
  have unconsumed samples *at the last epoch start or state load* (the "basis") are dealt greedily
  (next shard to the least-loaded rank, ties to the lowest rank), so after a restart on any world
  size every rank computes the same disjoint assignment of exactly the remaining work. Inside a
  rank the same deal splits shards over DataLoader workers; ``interleave`` shards are read
  round-robin per worker.
- Each shard is streamed with tarfile 'r|' over a counting + hashing reader (tario). Every PT/JSON
  is size + SHA256 checked before ``torch.load(weights_only=True)``; member structure is
  checked; at EOF the stream is drained and the whole TAR's size + SHA256 compared. The last
  sample of a shard is held back until that final check passed, so a shard whose TAR check fails
  never completes.
- State = snapshot ref + config fingerprint + epoch + per-shard consumed-sample bitmasks (+ shard
  failures, quarantine). Consumption is what the *trainer* marks: batches carry their sample keys
  (shard, index, id) and the trainer calls ``mark_consumed(batch)`` in the main process after the
  step, so batches prefetched by DataLoader workers but never trained stay unconsumed. A restart
  rereads a partly consumed shard from its start (hash midstates cannot be checkpointed) and
  skips consumed samples; it never yields one again.
- The snapshot changes only at an epoch boundary (``advance_epoch(refresh=...)`` or ``refresh()``
  before the first batch of an epoch); asked mid-epoch it raises RefreshMidEpochError.
- Shard failures travel to the main process as events inside batches (an events-only batch if
  needed) and are recorded in the state with the ids already yielded from that shard; then
  ``on_shard_failure='fail'`` raises ShardFailure, ``'quarantine'`` logs an error and skips the
  shard from then on (I/O failures after the retry budget always raise).

Use (DDP: every rank the same; batch_size lives in ConsumerConfig, the DataLoader gets None)::

    ds = StreamingCache(store, ConsumerConfig(batch_size=4, seed=1), manifest=ref)
    if ckpt: ds.load_state_dict(ckpt["data"])           # the merged (global) state
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    while True:
        for batch in ds.iter_batches(loader):
            step(batch.data)                            # collated tensors / meta
            ds.mark_consumed(batch)
            if want_ckpt: ckpt["data"] = ds.gather_state_dict()   # collective under DDP
        ds.advance_epoch(refresh=True)                  # new snapshot only here
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, ValidationError
from torch.utils.data import IterableDataset, get_worker_info

from gc25d_core import distributed
from gc25d_core.cache.errors import (
    RefreshMidEpochError,
    SampleSchemaError,
    ShardError,
    ShardFailure,
    StaleBatchError,
    StateError,
    StoreError,
)
from gc25d_core.cache.manifest import ManifestRef, ShardEntry, Strict, validate_sample
from gc25d_core.cache.snapshots import Snapshot, read_pinned, read_snapshot
from gc25d_core.cache.stores import Store
from gc25d_core.cache.tario import DEFAULT_CHUNK, deserialize_json, deserialize_pt, iter_verified_members
from gc25d_core.config import Sha256Hex

log = logging.getLogger("gc25d_core.cache")

StateFormat = Literal["gc25d_cache_state_v1"]
STATE_FORMAT: StateFormat = "gc25d_cache_state_v1"


class ConsumerConfig(Strict):
    split: Literal["train", "val"] = "train"
    seed: int = 0
    batch_size: int = Field(default=1, ge=1)
    interleave: int = Field(default=1, ge=1)  # shards read round-robin per DataLoader worker
    extra_exclude_sample_ids: tuple[str, ...] = ()
    on_shard_failure: Literal["fail", "quarantine"] = "fail"
    validate_schema: bool = True
    hash_in_thread: bool = True
    read_chunk_bytes: int = Field(default=DEFAULT_CHUNK, ge=64 * 1024)


@dataclass(frozen=True)
class SampleKey:
    shard: str
    index: int  # position in the shard's listing (= TAR order)
    sample_id: str


@dataclass
class Sample:
    key: SampleKey
    tensors: dict[str, Any]
    meta: dict[str, Any]


@dataclass(frozen=True)
class ShardEvent:
    epoch: int
    shard: str
    shard_sha256: str
    ok: bool
    kind: str  # "ok" | "verify" | "io"
    sample: str | None = None
    offset: int | None = None
    message: str = ""


def _pin(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.pin_memory()
    if isinstance(x, dict):
        return {k: _pin(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_pin(v) for v in x]
    if callable(getattr(x, "pin_memory", None)):  # a collate_fn's own type (SFT's Prepared)
        return x.pin_memory()
    return x


@dataclass
class CacheBatch:
    """What the dataset yields: verified samples (maybe none) + shard events + collated ``data``."""

    epoch: int
    manifest_sha256: str
    rank: int
    worker: int
    samples: list[Sample]
    events: list[ShardEvent] = field(default_factory=list)
    data: Any = None
    received: bool = False

    @property
    def keys(self) -> list[SampleKey]:
        return [s.key for s in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def pin_memory(self) -> CacheBatch:  # called by DataLoader(pin_memory=True)
        for s in self.samples:
            s.tensors = _pin(s.tensors)
        self.data = _pin(self.data)
        return self


def collate_samples(samples: Sequence[Sample]) -> dict[str, Any]:
    """Default collate: stack each tensor present in every sample with one shape/dtype, else list."""
    import torch

    names = sorted({n for s in samples for n in s.tensors})
    tensors: dict[str, Any] = {}
    for n in names:
        vals = [s.tensors.get(n) for s in samples]
        if all(v is not None for v in vals) and len({(tuple(v.shape), v.dtype) for v in vals}) == 1:  # type: ignore[union-attr]
            tensors[n] = torch.stack(vals)  # type: ignore[arg-type]
        else:
            tensors[n] = vals
    return {
        "tensors": tensors,
        "meta": [s.meta for s in samples],
        "sample_ids": [s.key.sample_id for s in samples],
    }


def _deal(items: Sequence[tuple[int, int]], n: int) -> list[list[int]]:
    """Greedy deal of (item, weight) in the given order over n bins; ties go to the lowest bin."""
    loads = [0] * n
    out: list[list[int]] = [[] for _ in range(n)]
    for item, w in items:
        b = min(range(n), key=lambda r: (loads[r], r))
        out[b].append(item)
        loads[b] += w
    return out


# -- the checkpointed state ---------------------------------------------------------------------

_HexMask = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]+$")]
"""Consumed samples of one shard: bit j = sample j of its listing, as lowercase hex."""


class StateFingerprint(Strict):
    """The consumer settings a state depends on (``_fingerprint``)."""

    split: Literal["train", "val"]
    seed: int
    extra_exclude_sha256: Sha256Hex


class ShardFailureRecord(Strict):
    """One failed shard read, as ``_on_event`` records it."""

    epoch: int = Field(ge=0)
    shard: str
    shard_sha256: Sha256Hex
    kind: Literal["verify", "io"]
    sample: str | None
    offset: int | None
    message: str
    yielded_sample_ids: tuple[str, ...]
    action: Literal["fail", "quarantine"]


class ConsumerState(Strict):
    """The state dict ``state_dict`` writes and ``load_state_dict`` reads (``STATE_FORMAT``)."""

    format: StateFormat
    manifest: ManifestRef
    config: StateFingerprint
    epoch: int = Field(ge=0)
    consumed: dict[str, _HexMask] = Field(default_factory=dict)
    failures: tuple[ShardFailureRecord, ...] = ()
    quarantined: dict[Sha256Hex, str] = Field(default_factory=dict)

    def masks(self) -> dict[str, int]:
        return {path: int(hx, 16) for path, hx in self.consumed.items()}


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('consumed', 'shards/a.tar') → consumed['shards/a.tar']: keys may hold dots and slashes."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "<root>"


def parse_state(state: object, source: str = "consumer state") -> ConsumerState:
    """Validate a checkpointed consumer state; errors (StateError) name ``source`` and each field."""
    try:
        return ConsumerState.model_validate(state)
    except ValidationError as e:
        problems = "; ".join(f"field {_field_path(err['loc'])}: {err['msg']}" for err in e.errors())
        raise StateError(f"{source}: not a valid {STATE_FORMAT} state: {problems}") from None


def _agree(obj: Any) -> Any:
    """Under an initialised process group, every rank gets rank 0's ``obj``."""
    if distributed.dist_active():
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return obj


def _fingerprint(cfg: ConsumerConfig) -> dict[str, Any]:
    ex = "\n".join(sorted(set(cfg.extra_exclude_sample_ids))).encode()
    return {"split": cfg.split, "seed": cfg.seed, "extra_exclude_sha256": hashlib.sha256(ex).hexdigest()}


class StreamingCache(IterableDataset):
    """See the module docstring. ``manifest``: a ManifestRef (exact), a Snapshot, a version
    number (read at the current head), or None (the snapshot ``manifest.json`` points to; under
    DDP rank 0's choice is broadcast)."""

    def __init__(
        self,
        store: Store,
        config: ConsumerConfig | None = None,
        *,
        manifest: ManifestRef | Snapshot | int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        collate_fn: Callable[[Sequence[Sample]], Any] | None = collate_samples,
    ):
        super().__init__()
        self.store = store
        self.config = config or ConsumerConfig()
        self.rank = distributed.global_rank() if rank is None else rank
        self.world_size = distributed.world_size() if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world of {self.world_size}")
        self.collate_fn = collate_fn
        self.epoch = 0
        self._consumed: dict[str, int] = {}
        self._basis: dict[str, int] = {}
        self._received: dict[str, int] = {}
        self._failures: list[dict[str, Any]] = []
        self._quarantined: dict[str, str] = {}  # shard sha256 -> path
        self._basis_quarantined: frozenset[str] = frozenset()
        self._started = False
        self._plan_cache: list[int] | None = None
        self._set_snapshot(self._resolve(manifest))

    # -- snapshot -------------------------------------------------------------------------------

    def _resolve(self, manifest: ManifestRef | Snapshot | int | None) -> Snapshot:
        if isinstance(manifest, Snapshot):
            return manifest
        if isinstance(manifest, ManifestRef):
            return read_pinned(self.store, manifest)
        # a version number, or None = what manifest.json names: rank 0 reads, every rank pins that
        ref = _agree(
            read_snapshot(self.store, manifest).ref
            if self.rank == 0 or not distributed.dist_active()
            else None
        )
        return read_pinned(self.store, ref)

    def _set_snapshot(self, snap: Snapshot) -> None:
        self._snap = snap
        m = snap.manifest
        self._shards: list[ShardEntry] = list(m.shards)
        self._by_path = {sh.path: i for i, sh in enumerate(self._shards)}
        excluded = set(m.exclude_sample_ids) | set(self.config.extra_exclude_sample_ids)
        self._eligible: list[int] = []
        for sh in self._shards:
            mask = 0
            for j, s in enumerate(sh.samples):
                if s.split == self.config.split and s.id not in excluded:
                    mask |= 1 << j
            self._eligible.append(mask)
        self._plan_cache = None

    @property
    def snapshot(self) -> Snapshot:
        return self._snap

    @property
    def manifest_ref(self) -> ManifestRef:
        return self._snap.ref

    # -- planning -------------------------------------------------------------------------------

    def _order_key(self, i: int) -> bytes:
        sh = self._shards[i]
        return hashlib.sha256(f"{self.config.seed}|{self.epoch}|{sh.sha256}|{sh.path}".encode()).digest()

    def canonical_order(self) -> list[str]:
        """All shard paths with eligible samples, in this epoch's canonical order."""
        idx = [i for i, m in enumerate(self._eligible) if m]
        return [self._shards[i].path for i in sorted(idx, key=self._order_key)]

    def _rank_plan(self) -> list[int]:
        if self._plan_cache is None:
            work = []
            for i, sh in enumerate(self._shards):
                if sh.sha256 in self._basis_quarantined:
                    continue
                rem = self._eligible[i] & ~self._basis.get(sh.path, 0)
                if rem:
                    work.append((i, rem.bit_count()))
            work.sort(key=lambda t: self._order_key(t[0]))
            self._plan_cache = _deal(work, self.world_size)[self.rank]
        return self._plan_cache

    def rank_shards(self) -> list[str]:
        """Shard paths this rank reads in the current epoch (fixed since the last epoch start /
        state load)."""
        return [self._shards[i].path for i in self._rank_plan()]

    def rank_remaining(self) -> int:
        """Eligible samples of this rank's shards not yet consumed (quarantined shards excluded)."""
        n = 0
        for i in self._rank_plan():
            sh = self._shards[i]
            if sh.sha256 not in self._quarantined:
                n += (self._eligible[i] & ~self._consumed.get(sh.path, 0)).bit_count()
        return n

    def num_eligible(self) -> int:
        return sum(m.bit_count() for m in self._eligible)

    # -- worker side ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[CacheBatch]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        consumed = dict(self._consumed)  # this iterator's view (the fork / pickle time state)
        jobs = []
        for i in self._rank_plan():
            sh = self._shards[i]
            if sh.sha256 in self._quarantined:
                continue
            want = self._eligible[i] & ~consumed.get(sh.path, 0)
            if want:
                jobs.append((i, want))
        weights = [(k, w.bit_count()) for k, (_, w) in enumerate(jobs)]
        mine = [jobs[k] for k in _deal(weights, nw)[wid]]
        return self._generate(mine, wid)

    def _generate(self, jobs: list[tuple[int, int]], wid: int) -> Iterator[CacheBatch]:
        bs, k = self.config.batch_size, self.config.interleave
        todo = iter(jobs)
        active: deque[Iterator[Sample | ShardEvent]] = deque()

        def refill() -> None:
            while len(active) < k:
                nxt = next(todo, None)
                if nxt is None:
                    return
                active.append(self._read_shard(*nxt))

        refill()
        samples: list[Sample] = []
        events: list[ShardEvent] = []
        while active:
            g = active.popleft()
            item = next(g, None)
            if item is None:
                refill()
                continue
            active.append(g)
            if isinstance(item, ShardEvent):
                events.append(item)
                continue
            samples.append(item)
            if len(samples) == bs:
                yield self._batch(samples, events, wid)
                samples, events = [], []
        if samples or events:
            yield self._batch(samples, events, wid)

    def _batch(self, samples: list[Sample], events: list[ShardEvent], wid: int) -> CacheBatch:
        data = self.collate_fn(samples) if (samples and self.collate_fn is not None) else None
        return CacheBatch(self.epoch, self._snap.ref.sha256, self.rank, wid, samples, events, data)

    def _read_shard(self, i: int, want: int) -> Iterator[Sample | ShardEvent]:
        sh = self._shards[i]
        pending: Sample | None = None
        try:
            raw = self.store.open_range(sh.path, sh.revision, sh.size)
            members = iter_verified_members(
                raw,
                shard=sh.path,
                size=sh.size,
                sha256=sh.sha256,
                expected=sh.samples,
                keep=lambda j: bool(want >> j & 1),
                threaded_hash=self.config.hash_in_thread,
                chunk=self.config.read_chunk_bytes,
            )
            for vm in members:
                if vm.pt is None:
                    continue
                sample = self._decode(sh, vm.index, vm.sample_id, vm.offset, vm.pt, vm.json_bytes or b"")
                if pending is not None:
                    yield pending
                pending = sample  # the last one waits for the whole-TAR check
        except ShardError as e:
            yield self._event(sh, False, e.kind, e.sample, e.offset, str(e))
            return
        except (StoreError, OSError) as e:
            yield self._event(
                sh, False, "io", None, 0, f"shard {sh.path} sample - offset 0: cannot open: {e}"
            )
            return
        if pending is not None:
            yield pending
        yield self._event(sh, True, "ok", None, sh.size, "")

    def _event(
        self, sh: ShardEntry, ok: bool, kind: str, sample: str | None, offset: int | None, msg: str
    ) -> ShardEvent:
        return ShardEvent(self.epoch, sh.path, sh.sha256, ok, kind, sample, offset, msg)

    def _decode(self, sh: ShardEntry, index: int, sid: str, offset: int, pt: memoryview, js: bytes) -> Sample:
        def err(reason: str) -> ShardError:
            return ShardError(reason, shard=sh.path, sample=sid, offset=offset)

        try:
            tensors = deserialize_pt(pt)  # bytes verified against the manifest's SHA256
        except Exception as e:
            raise err(f"PT does not load with weights_only=True: {e}") from None
        try:
            meta = deserialize_json(js)
        except ValueError as e:
            raise err(f"JSON does not parse: {e}") from None
        if self.config.validate_schema:
            try:
                validate_sample(self._snap.manifest.sample_schema, tensors, meta, self._snap.manifest.dims)
            except SampleSchemaError as e:
                raise err(f"schema {self._snap.manifest.schema_name}: {e}") from None
        return Sample(SampleKey(sh.path, index, sid), tensors, meta)

    # -- main-process side ----------------------------------------------------------------------

    def iter_batches(self, loader: Iterable[Any] | None = None) -> Iterator[CacheBatch]:
        """Iterate ``loader`` (a DataLoader over this dataset with ``batch_size=None``), or this
        dataset in-process; record events; yield only batches that carry samples."""
        if loader is not None:
            if getattr(loader, "batch_size", None) is not None:
                raise ValueError(
                    "use DataLoader(dataset, batch_size=None): batching is ConsumerConfig.batch_size"
                )
            if getattr(loader, "persistent_workers", False):
                raise ValueError("persistent_workers=True would keep stale epoch/consumed state in workers")
            if getattr(loader, "dataset", self) is not self:
                raise ValueError("the loader iterates a different dataset object")
        for item in loader if loader is not None else self:
            if self.receive(item):
                yield item

    def _check_batch(self, batch: CacheBatch) -> None:
        if not isinstance(batch, CacheBatch):
            raise TypeError(f"expected CacheBatch, got {type(batch).__name__}")
        if batch.epoch != self.epoch or batch.manifest_sha256 != self._snap.ref.sha256:
            raise StaleBatchError(
                f"batch from epoch {batch.epoch} / manifest {batch.manifest_sha256[:12]} reached epoch "
                f"{self.epoch} / manifest {self._snap.ref.sha256[:12]} (an old iterator?)"
            )

    def receive(self, batch: CacheBatch) -> bool:
        """Record a batch's arrival in the main process (events, yielded ids). Idempotent.
        Raises ShardFailure for a failed shard unless quarantining. True if it has samples."""
        self._check_batch(batch)
        if batch.received:
            return bool(batch.samples)
        batch.received = True
        self._started = True
        for s in batch.samples:
            self._received[s.key.shard] = self._received.get(s.key.shard, 0) | (1 << s.key.index)
        for ev in batch.events:
            self._on_event(ev)
        return bool(batch.samples)

    def _ids(self, path: str, mask: int) -> list[str]:
        sh = self._shards[self._by_path[path]]
        return [s.id for j, s in enumerate(sh.samples) if mask >> j & 1]

    def _on_event(self, ev: ShardEvent) -> None:
        if ev.ok:
            return
        rec: dict[str, Any] = {
            "epoch": ev.epoch,
            "shard": ev.shard,
            "shard_sha256": ev.shard_sha256,
            "kind": ev.kind,
            "sample": ev.sample,
            "offset": ev.offset,
            "message": ev.message,
            "yielded_sample_ids": self._ids(ev.shard, self._received.get(ev.shard, 0)),
            "action": "fail" if (ev.kind == "io" or self.config.on_shard_failure == "fail") else "quarantine",
        }
        self._failures.append(rec)
        if rec["action"] == "fail":
            raise ShardFailure(
                f"{ev.message} [epoch {ev.epoch}; {len(rec['yielded_sample_ids'])} samples of this shard "
                "were already yielded, recorded in the consumer state]",
                event=ev,
            )
        self._quarantined[ev.shard_sha256] = ev.shard
        msg = f"quarantined {ev.shard}: {ev.message} ({len(rec['yielded_sample_ids'])} samples were yielded)"
        log.error(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)

    def mark_consumed(self, batch: CacheBatch | Iterable[SampleKey]) -> None:
        """The trainer consumed these samples (call after the optimizer step)."""
        if isinstance(batch, CacheBatch):
            self.receive(batch)
            keys: Iterable[SampleKey] = batch.keys
        else:
            keys = batch
        for k in keys:
            i = self._by_path.get(k.shard)
            if (
                i is None
                or not 0 <= k.index < len(self._shards[i].samples)
                or self._shards[i].samples[k.index].id != k.sample_id
            ):
                raise StateError(f"unknown sample key {k} for snapshot {self._snap.ref.snapshot_id}")
            bit = 1 << k.index
            if not self._eligible[i] & bit:
                raise StateError(f"{k.sample_id} is not eligible (split/exclusions) in this epoch")
            have = self._consumed.get(k.shard, 0)
            if have & bit:
                raise StateError(f"sample {k.sample_id} of {k.shard} consumed twice in epoch {self.epoch}")
            self._consumed[k.shard] = have | bit
            self._started = True

    @property
    def failures(self) -> list[dict[str, Any]]:
        return list(self._failures)

    @property
    def quarantined(self) -> dict[str, str]:
        return dict(self._quarantined)

    def release_quarantine(self, shard_sha256: str) -> None:
        self._quarantined.pop(shard_sha256, None)

    def consumed_ids(self) -> set[str]:
        return {sid for p, m in self._consumed.items() for sid in self._ids(p, m)}

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's view: the loaded basis + what this rank consumed. Merge ranks with
        ``merge_state_dicts`` (or call ``gather_state_dict`` on every rank)."""
        return {
            "format": STATE_FORMAT,
            "manifest": self._snap.ref.model_dump(),
            "config": _fingerprint(self.config),
            "epoch": self.epoch,
            "consumed": {p: format(m, "x") for p, m in sorted(self._consumed.items()) if m},
            "failures": [dict(f) for f in self._failures],
            "quarantined": dict(sorted(self._quarantined.items())),
        }

    def gather_state_dict(self) -> dict[str, Any]:
        """Collective under torch.distributed: every rank gets the merged global state."""
        if distributed.dist_active():
            import torch.distributed as dist

            states: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(states, self.state_dict())
            return merge_state_dicts(states)
        return self.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, source: str = "consumer state") -> None:
        """Restore a (merged) state. Switches to the state's snapshot (checked by commit and
        SHA256) even if the store head has moved on. The rank deal is recomputed from it for
        this process's world size. ``source`` (e.g. the checkpoint file) is named in errors."""
        st = parse_state(state, source)
        fp = _fingerprint(self.config)
        if st.config.model_dump() != fp:
            raise StateError(
                f"{source}: field config: state was taken with {st.config.model_dump()}, this consumer has {fp}"
            )
        ref = st.manifest
        if ref != self._snap.ref:
            if ref.sha256 == self._snap.ref.sha256 and ref.version == self._snap.ref.version:
                snap = Snapshot(ref, self._snap.manifest)
            else:
                snap = read_pinned(self.store, ref)
            self._set_snapshot(snap)
        consumed: dict[str, int] = {}
        for p, mask in st.masks().items():
            i = self._by_path.get(p)
            if i is None or mask >> len(self._shards[i].samples):
                raise StateError(
                    f"{source}: field consumed[{p!r}]={st.consumed[p]} does not fit snapshot {ref.snapshot_id}"
                )
            consumed[p] = mask
        self.epoch = st.epoch
        self._failures = [f.model_dump(mode="json") for f in st.failures]
        self._quarantined = dict(st.quarantined)
        self._begin_epoch(consumed)

    def _begin_epoch(self, consumed: dict[str, int]) -> None:
        """Per-epoch state from the samples already consumed in it (none for a new epoch)."""
        self._consumed = consumed
        self._basis = dict(consumed)
        self._received = dict(consumed)
        self._basis_quarantined = frozenset(self._quarantined)
        self._started = bool(consumed)
        self._plan_cache = None

    # -- epochs ---------------------------------------------------------------------------------

    def advance_epoch(
        self,
        refresh: bool | ManifestRef | Snapshot | int = False,
        *,
        require_complete: bool = True,
    ) -> None:
        """Close this epoch and start the next (optionally on a newer snapshot). With
        ``require_complete`` this rank's share must be fully consumed."""
        left = self.rank_remaining()
        if require_complete and left:
            raise StateError(f"rank {self.rank}: {left} samples of epoch {self.epoch} not consumed yet")
        self.epoch += 1
        self._begin_epoch({})
        if refresh is not False:
            self.refresh(None if refresh is True else refresh)

    def refresh(self, target: ManifestRef | Snapshot | int | None = None) -> ManifestRef:
        """Switch snapshot; only at an epoch boundary (nothing received or consumed this epoch)."""
        if self._started or any(self._consumed.values()):
            raise RefreshMidEpochError(
                f"epoch {self.epoch} already started on {self._snap.ref.snapshot_id}; "
                "the snapshot may change only at an epoch boundary"
            )
        self._set_snapshot(self._resolve(target))
        return self._snap.ref


def merge_state_dicts(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Union of per-rank states of one step (same snapshot, config and epoch)."""
    if not states:
        raise StateError("no states to merge")
    parsed = [parse_state(s, f"rank state {i}") for i, s in enumerate(states)]
    first = parsed[0]
    for st in parsed[1:]:
        for key in ("format", "manifest", "config", "epoch"):
            if getattr(st, key) != getattr(first, key):
                raise StateError(
                    f"cannot merge states that differ in {key}: {getattr(st, key)} != {getattr(first, key)}"
                )
    consumed: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    quarantined: dict[str, str] = {}
    for st in parsed:
        for p, mask in st.masks().items():
            consumed[p] = consumed.get(p, 0) | mask
        for f in st.failures:
            rec = f.model_dump(mode="json")
            if rec not in failures:  # each rank reports the failures it has seen
                failures.append(rec)
        quarantined.update(st.quarantined)
    return {
        "format": first.format,
        "manifest": first.manifest.model_dump(),
        "config": first.config.model_dump(),
        "epoch": first.epoch,
        "consumed": {p: format(m, "x") for p, m in sorted(consumed.items()) if m},
        "failures": failures,
        "quarantined": dict(sorted(quarantined.items())),
    }
