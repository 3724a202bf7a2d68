"""HTTP streaming against a real threaded range server on 127.0.0.1 with fault injection."""

from __future__ import annotations

import hashlib
import random
import ssl
import subprocess

import pytest

from gc25d_core.cache import (
    ConsumerConfig,
    HttpConfig,
    HttpStore,
    HttpStreamError,
    ShardFailure,
    StreamingCache,
    list_versions,
    open_store,
    read_snapshot,
)
from gc25d_core.cache.httpserve import Fault, RangeServer
from gc25d_core.cache.manifest import is_commit
from gc25d_core.cache.stores import RangeStream, http_get_bytes

REV = "0123456789abcdef0123456789abcdef01234567"
PATH = "shards/w0/blob.tar"
CFG = HttpConfig(backoff_s=0.0, max_retries=3, max_reconnects=20, chunk_bytes=64 * 1024, timeout_s=5)


@pytest.fixture
def blob():
    data = random.Random(0).randbytes(300_000)
    files = {(REV, PATH): data}
    with RangeServer(lambda rev, path: files.get((rev, path))) as srv:
        yield srv, data


def _read_all(stream) -> bytes:
    out = bytearray()
    while b := stream.read(1 << 20):
        out += b
    return bytes(out)


def _stream(srv, size, cfg=CFG):
    return RangeStream(f"{srv.url}/resolve/{REV}/{PATH}", size, cfg=cfg)


def test_plain_range_read(blob):
    srv, data = blob
    assert _read_all(_stream(srv, len(data))) == data
    assert srv.log[0][3:5] == (0, len(data) - 1)


def test_dropped_connections_resume_at_exact_offsets(blob):
    srv, data = blob
    srv.set_fault(lambda r: Fault("drop", after=50_000) if r.n < 4 else None)
    s = _stream(srv, len(data))
    assert _read_all(s) == data
    starts = [row[3] for row in srv.log]
    assert starts == [0, 50_000, 100_000, 150_000, 200_000]
    assert s.reconnects == 4


def test_persistent_drops_fail_loud(blob):
    srv, data = blob
    srv.set_fault(lambda r: Fault("drop", after=0))
    with pytest.raises(HttpStreamError, match="giving up") as ei:
        _read_all(_stream(srv, len(data)))
    assert ei.value.offset == 0
    srv.set_fault(lambda r: Fault("drop", after=1000))  # progress each time: the total budget ends it
    with pytest.raises(HttpStreamError, match="reconnects") as ei:
        _read_all(_stream(srv, len(data)))
    assert ei.value.offset == 21_000


def test_200_to_a_range_request_fails_loud(blob):
    srv, data = blob
    srv.set_fault(lambda r: Fault("drop", after=10_000) if r.n == 0 else Fault("status", status=200))
    with pytest.raises(HttpStreamError, match="answered 200") as ei:
        _read_all(_stream(srv, len(data)))
    assert ei.value.offset == 10_000


def test_wrong_content_range_fails_loud(blob):
    srv, data = blob
    bad = f"bytes 0-{len(data) - 1}/{len(data)}"  # claims the start of the file on a resume
    srv.set_fault(
        lambda r: Fault("drop", after=10_000) if r.n == 0 else Fault("content_range", content_range=bad)
    )
    with pytest.raises(HttpStreamError, match="Content-Range") as ei:
        _read_all(_stream(srv, len(data)))
    assert ei.value.offset == 10_000


def test_wrong_total_size_fails_loud(blob):
    srv, data = blob
    with pytest.raises(HttpStreamError, match="Content-Range"):
        _read_all(_stream(srv, len(data) - 10))  # the listing says fewer bytes than the server has


def test_transient_status_is_retried_and_404_is_not(blob):
    srv, data = blob
    srv.set_fault(lambda r: Fault("status", status=503) if r.n < 2 else None)
    assert _read_all(_stream(srv, len(data))) == data
    srv.set_fault(None)
    s = RangeStream(f"{srv.url}/resolve/{REV}/missing.tar", 100, cfg=CFG)
    with pytest.raises(HttpStreamError, match="HTTP 404"):
        s.read(10)


def test_redirects_followed_and_reconnects_go_back_through_pinned_url(blob):
    srv, data = blob
    hops = []

    def fault(r):
        hops.append(r.url.split("/resolve/")[0] or "/")
        if r.url.startswith("/resolve/"):
            return Fault("redirect", location="/cdn" + r.url)  # like the Hub's CDN redirect
        return Fault("drop", after=100_000) if len(hops) < 5 else None

    srv.set_fault(fault)
    assert _read_all(_stream(srv, len(data))) == data
    assert hops[:4] == ["/", "/cdn", "/", "/cdn"]  # never reconnects to the CDN URL directly


def test_get_bytes_retries(blob):
    srv, data = blob
    srv.set_fault(lambda r: Fault("drop", after=5) if r.n == 0 else None)
    assert http_get_bytes(f"{srv.url}/resolve/{REV}/{PATH}", cfg=CFG) == data


def test_http_store_only_reads_pinned_revisions():
    st = HttpStore("http://127.0.0.1:1/resolve/{revision}/{path}")
    with pytest.raises(ValueError, match="40-hex"):
        st.url("manifest.json", "main")
    with pytest.raises(ValueError, match="40-hex"):
        st.url("manifest.json", "0123456")


# ------------------------------------------------------------------------------------------------
# the consumer over HTTP


@pytest.fixture
def served(small_store):
    store, ref = small_store
    with RangeServer.for_local_store(store) as srv:
        yield store, ref, srv, open_store(srv.url, config=CFG)


def _ids(ds):
    out = []
    for b in ds.iter_batches():
        out += [k.sample_id for k in b.keys]
        ds.mark_consumed(b)
    return out


def test_consumer_over_http_with_drops_matches_local(served):
    store, ref, srv, http = served
    local = _ids(StreamingCache(store, ConsumerConfig(seed=3), manifest=ref, rank=0, world_size=1))
    srv.set_fault(
        lambda r: Fault("drop", after=3000) if r.path.startswith("shards/") and r.n % 3 == 0 else None
    )
    remote = _ids(StreamingCache(http, ConsumerConfig(seed=3), manifest=ref, rank=0, world_size=1))
    assert remote == local
    assert all(is_commit(row[1]) for row in srv.log)  # every URL carried a full 40-hex revision
    assert any(row[5] == "drop" for row in srv.log)


def test_multi_mib_samples_over_http_resume_mid_payload_and_mid_header(tmp_path, kit):
    """4 MB PTs (one readinto per hash feed straight into the payload buffer, then the padding
    and tarfile's read-ahead in one read): drops inside a payload, inside a header and right
    after a payload resume at the exact offset and give the local store's tensors."""
    import torch

    from gc25d_core.cache import SCHEMA_GC25D, LocalStore, pack_shard, publish_snapshot

    store = LocalStore(tmp_path / "big")
    samples = [kit.gc_sample(i, f"r{i}", hw=(40, 52)) for i in range(3)]
    pack_shard(store, worker="w0", name="w0-000000", samples=samples, schema=SCHEMA_GC25D)
    ref = publish_snapshot(store).ref
    assert ref is not None
    sh = read_snapshot(store).manifest.shards[0]
    m = kit.tar_layout((store.root / sh.path).read_bytes())
    assert m[2].size > 4 << 20  # a PT larger than one hash feed
    cuts = [m[0].offset_data + 1_000_003, m[2].offset + 100, m[2].offset_data + m[2].size, sh.size - 700]

    def tensors(st):
        ds = StreamingCache(
            st, ConsumerConfig(batch_size=1), manifest=ref, rank=0, world_size=1, collate_fn=None
        )
        out = {}
        for b in ds.iter_batches():
            for s in b.samples:
                out[s.key.sample_id] = s.tensors
            ds.mark_consumed(b)
        return out

    local = tensors(store)
    with RangeServer.for_local_store(store) as srv:
        starts = [0, *cuts]

        def fault(r):
            if r.path != sh.path or r.start not in starts[:-1]:
                return None
            i = starts.index(r.start)
            return Fault("drop", after=starts[i + 1] - r.start)

        srv.set_fault(fault)
        remote = tensors(open_store(srv.url, config=CFG))
        assert [row[3] for row in srv.log if row[2] == sh.path] == starts
    assert sorted(remote) == sorted(local) and len(local) == 3
    for sid, t in local.items():
        assert t.keys() == remote[sid].keys()
        assert all(torch.equal(t[k], remote[sid][k]) for k in t)


def test_snapshots_over_http(served):
    store, ref, srv, http = served
    assert http.head() == store.head()
    assert list_versions(http) == [1]  # no listing over HTTP: from the pointer
    snap = read_snapshot(http, 1, revision=ref.commit)
    assert snap.ref == ref


@pytest.mark.parametrize("kind", ["status200", "content_range"])
def test_consumer_over_http_fails_loud_on_bad_reconnect(served, kind):
    store, ref, srv, http = served
    first = StreamingCache(http, ConsumerConfig(seed=3), manifest=ref, rank=0, world_size=1)
    shard = first.snapshot.manifest.shards[
        [s.path for s in first.snapshot.manifest.shards].index(first.rank_shards()[0])
    ]

    def fault(r):
        if not r.path.startswith("shards/"):
            return None
        if r.start == 0:
            return Fault("drop", after=3000)
        if kind == "status200":
            return Fault("status", status=200)
        return Fault("content_range", content_range=f"bytes 0-{shard.size - 1}/{shard.size}")

    srv.set_fault(fault)
    with pytest.raises(ShardFailure) as ei:
        _ids(first)
    ev = ei.value.event
    assert (ev.shard, ev.kind, ev.offset) == (shard.path, "io", 3000)
    assert ev.sample == shard.samples[0].id
    assert f"shard {shard.path} sample {shard.samples[0].id} offset 3000" in str(ei.value)


def test_stdlib_hash_check_of_served_bytes(served):
    store, ref, srv, http = served
    sh = read_snapshot(store).manifest.shards[0]
    data = _read_all(http.open_range(sh.path, sh.revision, sh.size))
    assert hashlib.sha256(data).hexdigest() == sh.sha256


# ------------------------------------------------------------------------------------------------
# redirects across schemes: https and plain http on one host:port (RangeServer's tls mode)

TOKEN = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and localhost (openssl, as a real CA would issue)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def dual(tls_cert, monkeypatch):
    """One server answering https and http on the same port; clients trust its certificate."""
    cert, key = tls_cert
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read by OpenSSL for every new client context
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    data = random.Random(1).randbytes(100_000)
    files = {(REV, PATH): data}
    with RangeServer(lambda rev, path: files.get((rev, path)), tls=ctx) as srv:
        yield srv, data


def _redirect_first_to(base: str):
    """A fault that sends the first URL (/resolve/...) to ``base`` + /cdn/resolve/..."""
    return lambda r: (
        Fault("redirect", location=f"{base}/cdn{r.url}") if r.url.startswith("/resolve/") else None
    )


def _hops(srv) -> list[tuple[str, str, str | None]]:
    return [(s.scheme, s.url.split("/resolve/")[0] or "/", s.authorization) for s in srv.seen]


def test_https_to_http_redirect_is_refused_and_the_token_stays_off_http(dual):
    srv, data = dual
    srv.set_fault(_redirect_first_to(srv.url))  # same host:port, plain http
    store = HttpStore(f"{srv.https_url}/resolve/{{revision}}/{{path}}", headers=TOKEN, config=CFG)
    with pytest.raises(HttpStreamError, match="https downgrade with an Authorization header") as ei:
        store.read_bytes(PATH, REV)
    assert f"{srv.url}/cdn/resolve/{REV}/{PATH}" in str(ei.value)
    with pytest.raises(HttpStreamError, match="https downgrade"):
        _read_all(store.open_range(PATH, REV, len(data)))
    assert _hops(srv) == [("https", "/", TOKEN["Authorization"])] * 2  # the http side never asked


def test_http_to_https_upgrade_is_followed_without_the_token(dual):
    srv, data = dual
    srv.set_fault(_redirect_first_to(srv.https_url))
    store = HttpStore(f"{srv.url}/resolve/{{revision}}/{{path}}", headers=TOKEN, config=CFG)
    assert store.read_bytes(PATH, REV) == data
    assert _hops(srv) == [("http", "/", TOKEN["Authorization"]), ("https", "/cdn", None)]  # another origin


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_same_origin_redirects_keep_the_token_and_other_hosts_do_not_get_it(dual, scheme):
    srv, data = dual
    base = srv.https_url if scheme == "https" else srv.url
    store = HttpStore(f"{base}/resolve/{{revision}}/{{path}}", headers=TOKEN, config=CFG)
    srv.set_fault(_redirect_first_to(base))
    assert store.read_bytes(PATH, REV) == data
    assert _read_all(store.open_range(PATH, REV, len(data))) == data
    assert _hops(srv) == [(scheme, "/", TOKEN["Authorization"]), (scheme, "/cdn", TOKEN["Authorization"])] * 2
    srv.seen.clear()
    srv.set_fault(_redirect_first_to(base.replace("127.0.0.1", "localhost")))
    assert store.read_bytes(PATH, REV) == data
    assert _hops(srv) == [(scheme, "/", TOKEN["Authorization"]), (scheme, "/cdn", None)]


@pytest.mark.parametrize("scheme", ["gopher", "ftp", "file"])
def test_unknown_scheme_urls_are_refused_unfetched(dual, scheme):
    srv, data = dual
    url = f"{scheme}://{srv.url.removeprefix('http://')}/resolve/{REV}/{PATH}"
    with pytest.raises(HttpStreamError, match=f"refusing '{scheme}://.*': scheme '{scheme}'"):
        http_get_bytes(url, headers=TOKEN, cfg=CFG)
    with pytest.raises(HttpStreamError, match=f"scheme '{scheme}'"):
        _read_all(RangeStream(url, len(data), headers=TOKEN, cfg=CFG))
    with pytest.raises(HttpStreamError, match=f"scheme '{scheme}'"):
        HttpStore(url.replace(f"{REV}/{PATH}", "{revision}/{path}"))
    assert srv.seen == []


def test_redirect_to_an_unknown_scheme_is_refused(dual):
    srv, data = dual
    target = srv.url.replace("http://", "gopher://")
    srv.set_fault(_redirect_first_to(target))
    store = HttpStore(f"{srv.url}/resolve/{{revision}}/{{path}}", headers=TOKEN, config=CFG)
    with pytest.raises(
        HttpStreamError, match="refusing the redirect from 'http://.*' to 'gopher://.*': scheme"
    ):
        store.read_bytes(PATH, REV)
    with pytest.raises(HttpStreamError, match="scheme 'gopher'"):
        _read_all(store.open_range(PATH, REV, len(data)))
    assert _hops(srv) == [("http", "/", TOKEN["Authorization"])] * 2
