"""HubStore against a fake HfApi (same method signatures as huggingface_hub's), with every read
going through the real HTTP range streamer at /datasets/<repo>/resolve/<40-hex>/<path>."""

from __future__ import annotations

import hashlib
import threading
import types
from pathlib import Path

import pytest

from gc25d_core.cache import (
    SCHEMA_GC25D,
    AlreadyExistsError,
    ConsumerConfig,
    HttpConfig,
    HubStore,
    SplitRule,
    StaleParentError,
    StreamingCache,
    list_versions,
    pack_shard,
    publish_snapshot,
    read_snapshot,
)
from gc25d_core.cache.httpserve import RangeServer
from gc25d_core.cache.manifest import is_commit


def _hub_error(status: int):
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    resp = httpx2.Response(status, request=httpx2.Request("POST", "http://hub.invalid/api/commit"))
    return HfHubHTTPError(f"HTTP {status}", response=resp)


class FakeHfApi:
    """An in-memory dataset repo with git-like commits and create_commit(parent_commit=...).

    ``fail_next``: "land_then_500" (commit, then raise 500) or "500" (raise 500, nothing lands)."""

    def __init__(self, repo_id: str):
        self.repo_id = repo_id
        self.lock = threading.Lock()
        root = hashlib.sha1(b"initial").hexdigest()
        self.trees: dict[str, dict[str, bytes]] = {root: {".gitattributes": b"*.tar filter=lfs\n"}}
        self.head = root
        self.calls: list[dict] = []
        self.fail_next: str | None = None
        self.before_commit = None

    def repo_info(self, repo_id, *, repo_type=None, revision=None, **kw):
        assert repo_id == self.repo_id and repo_type == "dataset" and revision == "main"
        return types.SimpleNamespace(sha=self.head)

    def list_repo_files(self, repo_id, *, revision=None, repo_type=None, **kw):
        return sorted(self.trees[revision])

    def create_commit(
        self, repo_id, operations, *, commit_message, repo_type=None, revision=None, parent_commit=None, **kw
    ):
        if self.before_commit is not None:
            hook, self.before_commit = self.before_commit, None
            hook()
        with self.lock:
            self.calls.append({"parent": parent_commit, "paths": [op.path_in_repo for op in operations]})
            fail, self.fail_next = self.fail_next, None
            if fail == "500":
                raise _hub_error(500)
            if parent_commit is not None and parent_commit != self.head:
                raise _hub_error(412)
            tree = dict(self.trees[self.head])
            for op in operations:
                src = op.path_or_fileobj
                tree[op.path_in_repo] = src if isinstance(src, bytes) else Path(src).read_bytes()
            oid = hashlib.sha1(f"{self.head}|{len(self.trees)}|{commit_message}".encode()).hexdigest()
            self.trees[oid] = tree
            self.head = oid
            if fail == "land_then_500":
                raise _hub_error(500)
            return types.SimpleNamespace(oid=oid, commit_url="", pr_url=None)

    def resolve(self, rev: str, path: str):
        return self.trees.get(rev, {}).get(path)


@pytest.fixture
def hub():
    api = FakeHfApi("gc25d/training-cache")
    with RangeServer(api.resolve) as srv:
        store = HubStore(api.repo_id, api=api, endpoint=srv.url, config=HttpConfig(backoff_s=0, timeout_s=5))
        yield api, store, srv


def _pack(store, kit, worker, n=2, start=0):
    return [
        pack_shard(
            store,
            worker=worker,
            name=f"{worker}-{k}",
            samples=[kit.gc_sample(start + 10 * k + j, f"r{j}") for j in range(3)],
            schema=SCHEMA_GC25D,
        )
        for k in range(n)
    ]


def test_publish_and_consume_through_resolve_urls(hub, kit):
    api, store, srv = hub
    _pack(store, kit, "w0")
    res = publish_snapshot(store, split_rule=SplitRule(method="explicit", val_groups=("r1",)))
    assert res.version == 1 and res.ref.commit == api.head
    assert list_versions(store) == [1]
    assert api.calls[-1]["paths"] == ["manifests/v000001.json", "manifest.json"]
    assert api.calls[-1]["parent"] is not None  # the publisher always sends parent_commit
    ds = StreamingCache(store, ConsumerConfig(), rank=0, world_size=1)
    ids = kit.consume(ds)
    assert len(ids) == 4
    for row in srv.log:  # every read was at /resolve/<full commit>/
        assert is_commit(row[1])


def test_412_is_a_lost_race_and_the_loser_rebases(hub, kit):
    api, store, srv = hub
    a = _pack(store, kit, "wa", n=1)
    b = _pack(store, kit, "wb", n=1, start=500)
    other = HubStore(api.repo_id, api=api, endpoint=srv.url, config=HttpConfig(backoff_s=0))
    out = {}
    api.before_commit = lambda: out.setdefault("b", publish_snapshot(other, receipts=[b[0].receipt_path]))
    out["a"] = publish_snapshot(store, receipts=[a[0].receipt_path], backoff_s=0)
    assert out["b"].version == 1 and out["a"].version == 2 and out["a"].attempts == 2
    parents = [c["parent"] for c in api.calls if "manifest.json" in c["paths"]]
    assert len(parents) == 3 and parents[0] == parents[1]  # B and A's first try shared a parent
    assert [s.path for s in read_snapshot(store).manifest.shards] == [b[0].shard_path, a[0].shard_path]


def test_500_but_landed_is_not_published_twice(hub, kit):
    api, store, srv = hub
    _pack(store, kit, "w0", n=1)
    api.fail_next = "land_then_500"
    res = publish_snapshot(store, backoff_s=0)
    assert res.landed_after_error and res.version == 1
    assert sum("manifest.json" in c["paths"] for c in api.calls) == 1
    assert list_versions(store) == [1]


def test_500_not_landed_is_retried_once_landed(hub, kit):
    api, store, srv = hub
    _pack(store, kit, "w0", n=1)
    api.fail_next = "500"
    res = publish_snapshot(store, backoff_s=0)
    assert not res.landed_after_error and res.version == 1 and res.attempts == 2
    assert list_versions(store) == [1]


def test_hub_store_never_overwrites(hub, kit):
    api, store, srv = hub
    _pack(store, kit, "w0", n=1)
    publish_snapshot(store)
    head = store.head()
    with pytest.raises(AlreadyExistsError):
        store.commit({"manifests/v000001.json": b"{}"}, parent=head)
    with pytest.raises(StaleParentError):
        store.commit({"manifests/v000002.json": b"{}"}, parent="f" * 40)
    assert store.head() == head
