"""Training-cache manifest: versioned pydantic schema, sample schemas, paths and canonical bytes.

Store layout (dataset card "Publication"; one layout for local, HTTP and Hub stores)::

    shards/<worker>/<name>.tar         TAR: <sample_id>.pt then <sample_id>.json, per sample, in order
    receipts/<worker>/<name>.json      Receipt: sizes + SHA256 of the TAR and of every member
    manifests/v000123.json             immutable snapshot N (never overwritten)
    manifest.json                      pointer = byte-identical copy of the newest snapshot

A manifest lists every published shard with its pinned revision (a full 40-hex commit; anything
shorter is rejected because short ids, branches and tags can move), exact byte size, SHA256 and
ordered members (per-PT and per-JSON size + SHA256), per-sample split and group, the exclusion
list, provenance (model revisions / weight hashes / preprocessing contract), and totals.

Sample schemas (``SCHEMAS``)
----------------------------
``csgo_training_cache_features_v1`` — the dataset card's table, exactly (float32 unless noted)::

    latent            [1,16,21,60,104]      i2v_y        [1,20,21,60,104]
    dense_features    [1,21,32,30,52]       state        [1,21,3,60,104]
    interaction       [1,21,134]            camera_poses [1,21,4,4]
    camera_intrinsics [1,21,4]              text_emb     [1,L,4096] bfloat16 (L free per sample)

The JSON side is free-form; its ``match`` field (if present) is the split group.

``gc25d_training_cache_v1`` — one processed gc25d clip (SPEC §5) per sample::

    latent        bfloat16 [48,21,H,W]   Wan2.2 VAE latent (H,W = 30,52 at 480x832)
    actions_block uint8    [21,5]        text.cell_blocks(blocks20)
    cond_ids      uint8    [81,h,w]      optional; parts-vocab raw ids per frame (h,w = 480,832)
    cond_ext_ids  uint8    [28,h,w]      optional; stage-3 extension ids (cond_ext or ext_canvas)
    ext_blocks    uint8    [7,5]         optional; extension action blocks
    world_to_clip float64  [81,16]       optional; meta of the clip frames, what SPEC §7's UNKNOWN
    world_to_view float64  [81,16]       optional;   masking needs (so SFT needs no processed
    ground_z      float32  [81]          optional;   layout beside the cache)

    json: clip_id str, subset str, scene str, run str, start int, prompts list[21] str,
          optional has_ext bool, ext_prompts list[7] str, ext_source str
          split group = run (the SPEC's split is run-level)

Symbols (H, W, h, w) are pinned per snapshot in ``Manifest.dims``; ``L`` is free per sample. Within
one sample a symbol binds to one value across tensors.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from gc25d_core.cache.errors import ManifestError, SampleSchemaError
from gc25d_core.config import LATENT_CHANNELS, Strict
from gc25d_core.names import check_name

MANIFEST_FORMAT = "gc25d_cache_manifest_v1"
RECEIPT_FORMAT = "gc25d_cache_receipt_v1"
POINTER_PATH = "manifest.json"
MANIFESTS_DIR = "manifests"
SHARDS_DIR = "shards"
RECEIPTS_DIR = "receipts"
PT_SUFFIX = ".pt"
JSON_SUFFIX = ".json"

SCHEMA_CSGO = "csgo_training_cache_features_v1"
SCHEMA_GC25D = "gc25d_training_cache_v1"

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# sample ids may contain dots (members are split on the known suffix from the right), never "/"
SAMPLE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}$")
SHARD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
VERSION_PATH_RE = re.compile(r"^manifests/v(\d{6,})\.json$")

SPLITS = ("train", "val")


def is_commit(rev: object) -> bool:
    return isinstance(rev, str) and COMMIT_RE.match(rev) is not None


def check_commit(rev: object, what: str) -> str:
    if not is_commit(rev):
        raise ValueError(
            f"{what}: revision {rev!r} is not a full 40-hex commit id "
            "(short ids, branches and tags can move; pin the full commit)"
        )
    return str(rev)


def _check_sha(v: str, what: str) -> None:
    if not SHA256_RE.match(v):
        raise ValueError(f"{what}: {v!r} is not a lowercase hex SHA256")


def check_sample_id(sid: str) -> str:
    if not SAMPLE_ID_RE.match(sid) or ".." in sid:
        raise ValueError(f"invalid sample id {sid!r} (allowed: [A-Za-z0-9._+=-], no '..', no '/')")
    return sid


def check_store_path(path: str) -> str:
    """A relative POSIX path inside a store: no absolute, no '..', no empty or hidden parts."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
    ):
        raise ValueError(f"unsafe store path {path!r}")
    return path


# ----------------------------------------------------------------------------------------------
# sample schemas


class TensorSpec(Strict):
    name: str
    dtype: str  # torch dtype name: float32, bfloat16, uint8, ...
    shape: tuple[int | str, ...]  # ints are exact; strings are symbols
    optional: bool = False


class JsonFieldSpec(Strict):
    name: str
    kind: Literal["str", "int", "float", "bool", "str_list"]
    length: int | None = None  # for str_list
    optional: bool = False


class SampleSchema(Strict):
    name: str
    tensors: tuple[TensorSpec, ...]
    json_fields: tuple[JsonFieldSpec, ...] = ()
    json_extra_allowed: bool = True
    free_dims: tuple[str, ...] = ()  # symbols that may differ per sample (e.g. text length L)
    group_field: str | None = None  # json field naming the split group; sample id when absent
    description: str = ""

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def pinned_symbols(self) -> set[str]:
        syms = {d for t in self.tensors for d in t.shape if isinstance(d, str)}
        return syms - set(self.free_dims)

    def group_of(self, sample_id: str, meta: Mapping[str, Any]) -> str:
        if self.group_field and isinstance(meta.get(self.group_field), (str, int)):
            return str(meta[self.group_field])
        return sample_id


CSGO_SCHEMA = SampleSchema(
    name=SCHEMA_CSGO,
    tensors=(
        TensorSpec(name="latent", dtype="float32", shape=(1, 16, 21, 60, 104)),
        TensorSpec(name="i2v_y", dtype="float32", shape=(1, 20, 21, 60, 104)),
        TensorSpec(name="dense_features", dtype="float32", shape=(1, 21, 32, 30, 52)),
        TensorSpec(name="state", dtype="float32", shape=(1, 21, 3, 60, 104)),
        TensorSpec(name="interaction", dtype="float32", shape=(1, 21, 134)),
        TensorSpec(name="camera_poses", dtype="float32", shape=(1, 21, 4, 4)),
        TensorSpec(name="camera_intrinsics", dtype="float32", shape=(1, 21, 4)),
        TensorSpec(name="text_emb", dtype="bfloat16", shape=(1, "L", 4096)),
    ),
    json_fields=(),
    json_extra_allowed=True,
    free_dims=("L",),
    group_field="match",
    description="CSGO feature-only samples (dataset card table); no raw 7-channel dense tensor",
)

GC25D_SCHEMA = SampleSchema(
    name=SCHEMA_GC25D,
    tensors=(
        TensorSpec(name="latent", dtype="bfloat16", shape=(LATENT_CHANNELS, 21, "H", "W")),
        TensorSpec(name="actions_block", dtype="uint8", shape=(21, 5)),
        TensorSpec(name="cond_ids", dtype="uint8", shape=(81, "h", "w"), optional=True),
        TensorSpec(name="cond_ext_ids", dtype="uint8", shape=(28, "h", "w"), optional=True),
        TensorSpec(name="ext_blocks", dtype="uint8", shape=(7, 5), optional=True),
        TensorSpec(name="world_to_clip", dtype="float64", shape=(81, 16), optional=True),
        TensorSpec(name="world_to_view", dtype="float64", shape=(81, 16), optional=True),
        TensorSpec(name="ground_z", dtype="float32", shape=(81,), optional=True),
    ),
    json_fields=(
        JsonFieldSpec(name="clip_id", kind="str"),
        JsonFieldSpec(name="subset", kind="str"),
        JsonFieldSpec(name="scene", kind="str"),
        JsonFieldSpec(name="run", kind="str"),
        JsonFieldSpec(name="start", kind="int"),
        JsonFieldSpec(name="prompts", kind="str_list", length=21),
        JsonFieldSpec(name="has_ext", kind="bool", optional=True),
        JsonFieldSpec(name="ext_prompts", kind="str_list", length=7, optional=True),
        JsonFieldSpec(name="ext_source", kind="str", optional=True),
    ),
    json_extra_allowed=True,
    free_dims=(),
    group_field="run",
    description="gc25d processed clip: latent + actions (+ cond ids, + stage-3 extension)",
)

SCHEMAS: dict[str, SampleSchema] = {s.name: s for s in (CSGO_SCHEMA, GC25D_SCHEMA)}


def get_schema(name: str) -> SampleSchema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ManifestError(f"unknown sample schema {name!r}; known: {sorted(SCHEMAS)}") from None


def _torch_dtype(name: str) -> Any:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SampleSchemaError(f"schema names unknown dtype {name!r}")
    return dt


def validate_sample(
    schema: SampleSchema,
    tensors: object,
    meta: object,
    dims: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Check a deserialised sample against ``schema``; return the symbol bindings it used.

    ``dims`` pins symbols (snapshot-wide). Raises SampleSchemaError naming the tensor / field.
    """
    import torch

    if not isinstance(tensors, dict):
        raise SampleSchemaError(f"PT payload is {type(tensors).__name__}, expected dict[str, Tensor]")
    known = {t.name for t in schema.tensors}
    extra = sorted(set(tensors) - known)
    if extra:
        raise SampleSchemaError(f"unexpected tensors {extra} (schema {schema.name})")
    bound: dict[str, int] = dict(dims or {})
    seen: dict[str, int] = {}
    for spec in schema.tensors:
        if spec.name not in tensors:
            if spec.optional:
                continue
            raise SampleSchemaError(f"missing tensor {spec.name!r}")
        t = tensors[spec.name]
        if not isinstance(t, torch.Tensor):
            raise SampleSchemaError(f"{spec.name}: {type(t).__name__} is not a Tensor")
        if t.dtype != _torch_dtype(spec.dtype):
            raise SampleSchemaError(f"{spec.name}: dtype {t.dtype} != {spec.dtype}")
        if t.dim() != len(spec.shape):
            raise SampleSchemaError(f"{spec.name}: shape {list(t.shape)} != {list(spec.shape)}")
        for axis, (want, got) in enumerate(zip(spec.shape, t.shape, strict=True)):
            if isinstance(want, int):
                if got != want:
                    raise SampleSchemaError(
                        f"{spec.name}: shape {list(t.shape)} != {list(spec.shape)} (axis {axis})"
                    )
            elif want in bound and bound[want] != got:
                raise SampleSchemaError(
                    f"{spec.name}: axis {axis} = {got} but {want} = {bound[want]} "
                    f"(shape {list(t.shape)} vs {list(spec.shape)})"
                )
            else:
                bound[want] = int(got)
                seen[want] = int(got)
    if not isinstance(meta, dict):
        raise SampleSchemaError(f"JSON payload is {type(meta).__name__}, expected an object")
    names = {f.name for f in schema.json_fields}
    if not schema.json_extra_allowed and set(meta) - names:
        raise SampleSchemaError(f"unexpected json fields {sorted(set(meta) - names)}")
    for f in schema.json_fields:
        if f.name not in meta:
            if f.optional:
                continue
            raise SampleSchemaError(f"missing json field {f.name!r}")
        _check_json_field(f, meta[f.name])
    return {k: v for k, v in seen.items() if k not in schema.free_dims}


def _check_json_field(f: JsonFieldSpec, v: object) -> None:
    ok = {
        "str": isinstance(v, str),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "float": isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": isinstance(v, bool),
        "str_list": isinstance(v, list) and all(isinstance(x, str) for x in v),
    }[f.kind]
    if not ok:
        raise SampleSchemaError(f"json field {f.name!r}: {type(v).__name__} is not {f.kind}")
    if f.kind == "str_list" and f.length is not None and len(v) != f.length:  # type: ignore[arg-type]
        raise SampleSchemaError(f"json field {f.name!r}: length {len(v)} != {f.length}")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# receipts and manifests


class SourceRef(Strict):
    """Where bytes came from: a source dataset (repo at a pinned commit), or an imported shard."""

    repo: str
    revision: str
    path: str | None = None
    sha256: str | None = None

    @model_validator(mode="after")
    def _check(self) -> SourceRef:
        check_commit(self.revision, f"source {self.repo}")
        if self.sha256 is not None:
            _check_sha(self.sha256, f"source {self.repo}:{self.path}")
        return self


class ReceiptSample(Strict):
    id: str
    pt_size: int = Field(ge=1)
    pt_sha256: str
    json_size: int = Field(ge=0)
    json_sha256: str
    group: str

    @model_validator(mode="after")
    def _check(self) -> ReceiptSample:
        check_sample_id(self.id)
        _check_sha(self.pt_sha256, f"sample {self.id} pt_sha256")
        _check_sha(self.json_sha256, f"sample {self.id} json_sha256")
        return self


class SampleEntry(ReceiptSample):
    split: str

    @model_validator(mode="after")
    def _check_split(self) -> SampleEntry:
        if self.split not in SPLITS:
            raise ValueError(f"sample {self.id}: split {self.split!r} not in {SPLITS}")
        return self


def shard_paths(worker: str, name: str) -> tuple[str, str]:
    """(shard path, receipt path) for a worker's shard ``name`` (no suffix)."""
    check_name(worker, "worker", max_len=64)
    if not SHARD_NAME_RE.match(name) or name.endswith(".tar"):
        raise ValueError(f"invalid shard name {name!r} (no suffix, [A-Za-z0-9._-])")
    return f"{SHARDS_DIR}/{worker}/{name}.tar", f"{RECEIPTS_DIR}/{worker}/{name}.json"


def _check_unique_ids(samples: tuple[ReceiptSample, ...], where: str) -> None:
    seen: set[str] = set()
    for s in samples:
        if s.id in seen:
            raise ValueError(f"{where}: duplicate sample id {s.id!r}")
        seen.add(s.id)


class Receipt(Strict):
    """Written by a conversion worker next to its shard; the publisher lists the shard only after
    re-reading the TAR at a pinned revision and matching it against this receipt."""

    format: Literal["gc25d_cache_receipt_v1"] = "gc25d_cache_receipt_v1"
    schema_name: str
    worker: str
    shard_path: str
    size: int = Field(ge=1024)
    sha256: str
    samples: tuple[ReceiptSample, ...] = Field(min_length=1)
    dims: dict[str, int] = Field(default_factory=dict)
    created_at: str = ""
    source: SourceRef | None = None

    @model_validator(mode="after")
    def _check(self) -> Receipt:
        get_schema(self.schema_name)
        check_store_path(self.shard_path)
        if not (
            self.shard_path.startswith(f"{SHARDS_DIR}/{self.worker}/") and self.shard_path.endswith(".tar")
        ):
            raise ValueError(f"receipt: shard {self.shard_path!r} is not under shards/{self.worker}/")
        _check_sha(self.sha256, f"receipt {self.shard_path}")
        _check_unique_ids(self.samples, f"receipt {self.shard_path}")
        return self

    @property
    def receipt_path(self) -> str:
        name = self.shard_path.rsplit("/", 1)[1][: -len(".tar")]
        return shard_paths(self.worker, name)[1]


class ShardEntry(Strict):
    path: str
    worker: str
    revision: str
    size: int = Field(ge=1024)
    sha256: str
    receipt: str
    samples: tuple[SampleEntry, ...] = Field(min_length=1)
    source: SourceRef | None = None

    @model_validator(mode="after")
    def _check(self) -> ShardEntry:
        check_store_path(self.path)
        check_commit(self.revision, f"shard {self.path}")
        _check_sha(self.sha256, f"shard {self.path}")
        _check_unique_ids(self.samples, f"shard {self.path}")
        return self


class SplitRule(Strict):
    """How a group (match / run) maps to a split; stable across snapshots.

    ``hash``: val iff sha256(salt|group) as a fraction of 2^64 < val_fraction (the card's
    "stable by match, expected 2 %"). ``explicit``: val iff group in val_groups (SPEC: val runs).
    """

    method: Literal["hash", "explicit"] = "hash"
    val_fraction: float = Field(default=0.02, ge=0.0, le=1.0)
    salt: str = "gc25d-split-v1"
    val_groups: tuple[str, ...] = ()

    def split_of(self, group: str) -> str:
        if self.method == "explicit":
            return "val" if group in self.val_groups else "train"
        h = hashlib.sha256(f"{self.salt}|{group}".encode()).digest()
        return "val" if int.from_bytes(h[:8], "big") / 2.0**64 < self.val_fraction else "train"


class ModelRef(Strict):
    name: str
    revision: str
    sha256: str | None = None


class Provenance(Strict):
    """Model revisions / weight hashes and the preprocessing contract the samples were made with."""

    models: tuple[ModelRef, ...] = ()
    preprocessing: dict[str, Any] = Field(default_factory=dict)
    code_version: str | None = None


class Totals(Strict):
    num_shards: int
    num_samples: int
    num_bytes: int
    num_excluded: int
    per_split: dict[str, int]  # eligible (non-excluded) samples per split


def compute_totals(shards: tuple[ShardEntry, ...], exclude: tuple[str, ...]) -> Totals:
    ex = set(exclude)
    per = dict.fromkeys(SPLITS, 0)
    n = n_ex = 0
    for sh in shards:
        for s in sh.samples:
            n += 1
            if s.id in ex:
                n_ex += 1
            else:
                per[s.split] += 1
    return Totals(
        num_shards=len(shards),
        num_samples=n,
        num_bytes=sum(sh.size for sh in shards),
        num_excluded=n_ex,
        per_split=per,
    )


class Manifest(Strict):
    format: Literal["gc25d_cache_manifest_v1"] = "gc25d_cache_manifest_v1"
    version: int = Field(ge=1)
    parent_version: int | None = None
    parent_commit: str | None = None  # store head the publisher built this snapshot on
    created_at: str = ""
    schema_name: str
    dims: dict[str, int] = Field(default_factory=dict)
    split_rule: SplitRule = SplitRule()
    exclude_sample_ids: tuple[str, ...] = ()
    provenance: Provenance = Provenance()
    sources: tuple[SourceRef, ...] = ()
    shards: tuple[ShardEntry, ...] = ()
    totals: Totals

    @model_validator(mode="after")
    def _check(self) -> Manifest:
        schema = get_schema(self.schema_name)
        if self.parent_version is not None and self.parent_version != self.version - 1:
            raise ValueError(f"parent_version {self.parent_version} != version - 1 ({self.version - 1})")
        if self.parent_commit is not None:
            check_commit(self.parent_commit, "manifest parent_commit")
        unknown = set(self.dims) - schema.pinned_symbols
        if unknown:
            raise ValueError(f"dims {sorted(unknown)} are not pinned symbols of {schema.name}")
        if list(self.exclude_sample_ids) != sorted(set(self.exclude_sample_ids)):
            raise ValueError("exclude_sample_ids must be sorted and unique")
        where: dict[str, str] = {}
        paths: set[str] = set()
        for sh in self.shards:
            if sh.path in paths:
                raise ValueError(f"shard {sh.path} listed twice")
            paths.add(sh.path)
            for s in sh.samples:
                if s.id in where:
                    raise ValueError(
                        f"shard {sh.path} sample {s.id} offset -: duplicate sample id "
                        f"(also in shard {where[s.id]})"
                    )
                where[s.id] = sh.path
                if s.split != self.split_rule.split_of(s.group):
                    raise ValueError(
                        f"shard {sh.path} sample {s.id}: split {s.split!r} disagrees with the "
                        f"split rule for group {s.group!r}"
                    )
        if self.totals != compute_totals(self.shards, self.exclude_sample_ids):
            raise ValueError("totals do not match the listed shards")
        return self

    @property
    def snapshot_id(self) -> str:
        return snapshot_id(self.version)

    @property
    def sample_schema(self) -> SampleSchema:
        return get_schema(self.schema_name)


class ManifestRef(Strict):
    """A pinned snapshot: its version, the store commit it was read at, and its bytes' SHA256."""

    version: int = Field(ge=1)
    commit: str
    sha256: str

    @model_validator(mode="after")
    def _check(self) -> ManifestRef:
        check_commit(self.commit, f"manifest v{self.version:06d}")
        _check_sha(self.sha256, "manifest sha256")
        return self

    @property
    def snapshot_id(self) -> str:
        return snapshot_id(self.version)

    @property
    def path(self) -> str:
        return version_path(self.version)


def snapshot_id(version: int) -> str:
    return f"v{version:06d}"


def parse_snapshot_id(key: str) -> int | None:
    """The version of a snapshot id exactly as ``snapshot_id`` writes it ("v000123" -> 123), else None."""
    m = re.fullmatch(r"v(\d{6,})", key)
    return int(m.group(1)) if m and snapshot_id(int(m.group(1))) == key else None


def version_path(version: int) -> str:
    if version < 1:
        raise ValueError(f"snapshot versions start at 1, got {version}")
    return f"{MANIFESTS_DIR}/{snapshot_id(version)}.json"


def parse_version_path(path: str) -> int | None:
    m = VERSION_PATH_RE.match(path)
    return int(m.group(1)) if m else None


def canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def manifest_bytes(m: Manifest) -> bytes:
    return canonical_json(m.model_dump(mode="json"))


def receipt_bytes(r: Receipt) -> bytes:
    return canonical_json(r.model_dump(mode="json"))


def _format_validation(err: ValidationError, what: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        lines.append(f"  {loc or '<root>'}: {e['msg']}")
    return f"{what} is invalid:\n" + "\n".join(lines)


def parse_manifest(data: bytes, what: str = "manifest") -> Manifest:
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as e:
        raise ManifestError(_format_validation(e, what)) from None


def parse_receipt(data: bytes, what: str = "receipt") -> Receipt:
    try:
        return Receipt.model_validate_json(data)
    except ValidationError as e:
        raise ManifestError(_format_validation(e, what)) from None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
