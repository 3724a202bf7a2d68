"""Reading snapshots: list the immutable versions, read one pinned to a commit and a digest."""

from __future__ import annotations

from dataclasses import dataclass

from gc25d_core.cache.errors import ManifestError, StoreError
from gc25d_core.cache.manifest import (
    MANIFESTS_DIR,
    POINTER_PATH,
    Manifest,
    ManifestRef,
    parse_manifest,
    parse_version_path,
    sha256_hex,
    version_path,
)
from gc25d_core.cache.stores import Store


@dataclass(frozen=True)
class Snapshot:
    ref: ManifestRef
    manifest: Manifest

    @property
    def snapshot_id(self) -> str:
        return self.ref.snapshot_id


def _head(store: Store) -> str:
    head = store.head()
    if head is None:
        raise StoreError(f"{store.describe()} is empty (no commits)")
    return head


def list_versions(store: Store, revision: str | None = None) -> list[int]:
    """Published snapshot versions at ``revision`` (default: head), ascending. [] when none."""
    rev = revision or store.head()
    if rev is None:
        return []
    try:
        files = store.list_files(f"{MANIFESTS_DIR}/", rev)
    except NotImplementedError:  # HTTP stores cannot list: versions are contiguous 1..pointer
        if not store.exists(POINTER_PATH, rev):
            return []
        return list(range(1, parse_manifest(store.read_bytes(POINTER_PATH, rev)).version + 1))
    return sorted(v for f in files if (v := parse_version_path(f)) is not None)


def read_snapshot(
    store: Store,
    version: int | None = None,
    *,
    revision: str | None = None,
    expect_sha256: str | None = None,
) -> Snapshot:
    """Read ``manifests/v<version>.json`` (``version=None``: the one ``manifest.json`` points to)
    at ``revision`` (default: the current head), pinned as a ManifestRef.

    ``expect_sha256`` (e.g. from a checkpoint) must match the bytes, or ManifestError."""
    rev = revision or _head(store)
    if version is None:
        if not store.exists(POINTER_PATH, rev):
            raise StoreError(f"{store.describe()}: no {POINTER_PATH} at {rev} (nothing published)")
        pointer = store.read_bytes(POINTER_PATH, rev)
        version = parse_manifest(pointer, f"{POINTER_PATH}@{rev}").version
    data = store.read_bytes(version_path(version), rev)
    sha = sha256_hex(data)
    if expect_sha256 is not None and sha != expect_sha256:
        raise ManifestError(
            f"{version_path(version)} at {rev} has SHA256 {sha}, expected {expect_sha256} "
            "(the snapshot a checkpoint was bound to must not change)"
        )
    m = parse_manifest(data, f"{version_path(version)}@{rev}")
    if m.version != version:
        raise ManifestError(f"{version_path(version)} says version {m.version}")
    return Snapshot(ManifestRef(version=version, commit=rev, sha256=sha), m)


def read_pinned(store: Store, ref: ManifestRef) -> Snapshot:
    """Re-read exactly the snapshot ``ref`` names (version, commit and digest all checked)."""
    return read_snapshot(store, ref.version, revision=ref.commit, expect_sha256=ref.sha256)
