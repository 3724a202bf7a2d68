"""The TAR reader's fast path (direct payload reads, threaded whole-TAR hash) keeps every check.

Every byte of a shard is flipped in turn (every 13th byte) and the reader must fail, with the
threaded hasher and without; short reads, streams without ``readinto`` and tarfile's own
(copying) read path give the same verified output; an abandoned reader leaves no hash thread.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from typing import Any

import pytest
import torch

from gc25d_core.cache import ShardError, tario
from gc25d_core.cache.tario import (
    HashingReader,
    ShardInfo,
    deserialize_pt,
    iter_verified_members,
    write_shard,
)


def _shard(n: int = 3, *, pt_bytes: int = 700) -> tuple[bytes, ShardInfo, list[tuple[str, bytes, bytes]]]:
    """n samples; PT sizes that are not multiples of 512 (block padding after every member)."""
    samples = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        pt = tario.encode_pt(
            {"x": torch.randint(0, 255, (pt_bytes + 37 * i,), dtype=torch.uint8, generator=g)}
        )
        js = tario.encode_json({"i": i, "pad": "x" * (i * 13)})
        samples.append((f"s__r{i}__{i:06d}", pt, js))
    buf = io.BytesIO()
    info = write_shard(buf, samples)
    return buf.getvalue(), info, samples


class _Trickle(io.RawIOBase):
    """A stream that hands out at most ``step`` bytes per call (like a slow socket)."""

    def __init__(self, data: bytes, step: int, *, with_readinto: bool = True):
        super().__init__()
        self._f, self._step = io.BytesIO(data), step
        if not with_readinto:
            self.readinto = None  # type: ignore[assignment,method-assign]

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self._f.read(self._step if n is None or n < 0 else min(n, self._step))

    def readinto(self, b: Any) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _read_all(raw: Any, info: ShardInfo, *, threaded: bool = True, chunk: int = 1 << 20) -> list:
    return list(
        iter_verified_members(
            raw,
            shard="shards/w0/t.tar",
            size=info.size,
            sha256=info.sha256,
            expected=info.members,
            threaded_hash=threaded,
            chunk=chunk,
        )
    )


def _check_output(out: list, samples: list[tuple[str, bytes, bytes]]) -> None:
    assert [vm.sample_id for vm in out] == [s[0] for s in samples]
    for vm, (_, pt, js) in zip(out, samples, strict=True):
        assert isinstance(vm.pt, memoryview) and vm.pt.readonly
        assert bytes(vm.pt) == pt and vm.json_bytes == js
        assert torch.equal(deserialize_pt(vm.pt)["x"], deserialize_pt(pt)["x"])


@pytest.mark.parametrize("pt_bytes", [700, 40_000])  # PT inside tarfile's read-ahead / beyond it
@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize(
    "stream",
    ["file", "trickle-7", "trickle-513", "no-readinto", "tarfile-read"],
)
def test_same_verified_output_on_every_read_path(stream, threaded, pt_bytes, monkeypatch):
    data, info, samples = _shard(pt_bytes=pt_bytes)
    if stream == "file":
        raw: Any = io.BytesIO(data)
    elif stream.startswith("trickle"):
        raw = _Trickle(data, int(stream.split("-")[1]))
    elif stream == "no-readinto":
        raw = _Trickle(data, 300, with_readinto=False)
    else:  # tarfile's own copying read (used if its stream object ever changes layout)
        monkeypatch.setattr(tario, "_stream_state_ok", lambda stream, hr: False)
        raw = io.BytesIO(data)
    _check_output(_read_all(raw, info, threaded=threaded, chunk=64 * 1024), samples)


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("direct", [True, False])
def test_every_flipped_byte_is_detected(threaded, direct, monkeypatch):
    """Headers, payloads, block padding and the end-of-archive padding: one flipped byte anywhere
    fails the shard, and no PT that differs from the listing is ever handed out."""
    if not direct:
        monkeypatch.setattr(tario, "_stream_state_ok", lambda stream, hr: False)
    _assert_flips_fail(_shard(), 0, 13, 0x20, trickle=4096, threaded_hash=threaded)


def _assert_flips_fail(shard, start: int, step: int, mask: int, *, trickle: int, **read_kw) -> None:
    """Flip ``mask`` into every ``step``-th byte from ``start``: the shard fails each time, and every
    PT handed out before the failure is one of the listed ones."""
    data, info, samples = shard
    listed = {hashlib.sha256(pt).hexdigest() for _, pt, _ in samples}
    for pos in range(start, len(data), step):
        bad = bytearray(data)
        bad[pos] ^= mask
        handed_out: list[str] = []
        with pytest.raises(ShardError):
            for vm in iter_verified_members(
                _Trickle(bytes(bad), trickle),
                shard="shards/w0/t.tar",
                size=info.size,
                sha256=info.sha256,
                expected=info.members,
                **read_kw,
            ):
                assert vm.pt is not None
                handed_out.append(hashlib.sha256(vm.pt).hexdigest())
        assert set(handed_out) <= listed, pos


def test_flipped_bytes_in_payloads_larger_than_the_read_ahead(monkeypatch):
    """PTs of ~40 KB: read partly from tarfile's read-ahead, partly straight into the buffer (in
    pieces of one hash feed), then the padding plus the next read-ahead; every 97th byte."""
    monkeypatch.setattr(tario, "_HASH_FEED", 10_000)
    _assert_flips_fail(_shard(pt_bytes=40_000), 5, 97, 0x04, trickle=6000, chunk=4096)


def test_read_ahead_stops_at_the_listed_size():
    """tarfile's read-ahead never crosses the listed TAR size; at the size, one byte more shows
    a longer stream. ``read_at_least`` returns at least what was asked, in stream order."""
    data = bytes(range(256)) * 100
    hr = HashingReader(io.BytesIO(data + b"more"), limit=len(data), threaded=False)
    assert hr.read(20_000) == data[:20_000]
    assert hr.read(20_000) == data[20_000:]
    with pytest.raises(tario._TooLong):
        hr.read(20_000)
    hr = HashingReader(_Trickle(data, 300), limit=len(data), threaded=False)
    got = hr.read_at_least(700, 16 << 10)
    assert 700 <= len(got) <= 16 << 10 and got == data[: len(got)]
    assert hr.read_at_least(len(data), 0) == data[len(got) :]  # fewer only at EOF
    assert hr.count == len(data) and hr.hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("threaded", [True, False])
def test_truncations_and_extensions_fail(threaded):
    data, info, _ = _shard()
    for cut in (1, 100, 511, 512, 1024, len(data) // 2, len(data) - 1):
        with pytest.raises(ShardError):
            _read_all(io.BytesIO(data[:cut]), info, threaded=threaded)
    with pytest.raises(ShardError, match="longer than the listed"):
        _read_all(io.BytesIO(data + b"\0" * 512), info, threaded=threaded)


def test_discovery_rejects_a_member_larger_than_the_tar_before_reading_it():
    data, info, _ = _shard(1)
    hdr = tarfile.TarInfo.frombuf(data[:512], tarfile.ENCODING, "surrogateescape")
    hdr.size = 1 << 40  # a 1 TiB member in a tiny TAR: must not be allocated
    forged = hdr.tobuf(tarfile.GNU_FORMAT) + data[512:]
    with pytest.raises(ShardError, match="more than the listed TAR size"):
        list(
            iter_verified_members(
                io.BytesIO(forged), shard="shards/w0/t.tar", size=len(forged), sha256="0" * 64, expected=None
            )
        )


def test_hashing_reader_digest_matches_hashlib_with_a_tiny_budget(monkeypatch):
    """Pieces larger than the hash piece size and a queue budget smaller than one piece: the
    reader blocks instead of buffering, and the digest still covers every byte in order."""
    monkeypatch.setattr(tario, "_HASH_PIECE", 1000)
    monkeypatch.setattr(tario, "_HASH_FEED", 3000)  # a payload is fed while it is still being read
    data = bytes(range(256)) * 400
    hr = HashingReader(io.BytesIO(data), limit=len(data), chunk=4096)
    hr._hasher = tario._Sha256Thread(budget=1500)  # replace the default before any read
    parts = [hr.read(10)]
    buf = bytearray(50_000)
    n = hr.readinto_exact(memoryview(buf))
    parts.append(bytes(buf[:n]))
    hr.drain()
    assert hr.count == len(data) and b"".join(parts) == data[: 10 + n]
    assert hr.hexdigest() == hashlib.sha256(data).hexdigest()
    hr.close()


def test_abandoned_reader_stops_its_threads():
    data, info, _ = _shard(4)
    before = {t.ident for t in threading.enumerate()}
    for _ in range(5):
        it = iter_verified_members(
            io.BytesIO(data),
            shard="shards/w0/t.tar",
            size=info.size,
            sha256=info.sha256,
            expected=info.members,
        )
        next(it)
        it.close()  # GeneratorExit mid-shard
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left


def test_deserialize_pt_reads_buffers_without_copying_them_first():
    buf = io.BytesIO()
    torch.save({"a": torch.arange(1000, dtype=torch.int16)}, buf)
    raw = bytearray(buf.getvalue())
    for data in (bytes(raw), raw, memoryview(raw).toreadonly()):
        assert torch.equal(deserialize_pt(data)["a"], torch.arange(1000, dtype=torch.int16))


@pytest.mark.parametrize("n", [0, 100, (64 << 10) - 1, 64 << 10, 3 << 20])
def test_copy_into_small_and_gil_free_paths_copy_the_same_bytes(n):
    src = os.urandom(n)
    for source in (src, memoryview(src).toreadonly()):
        dst = bytearray(n + 8)
        tario.copy_into(memoryview(dst)[4 : 4 + n], source)
        assert bytes(dst[4 : 4 + n]) == src and dst[:4] == dst[4 + n :] == b"\0" * 4


def test_a_large_pt_loads_through_the_buffer_file():
    x = torch.randn(3, 1 << 18)  # 3 MiB: storage read through copy_into's numpy path
    pt = tario.encode_pt({"x": x})
    assert torch.equal(tario.deserialize_pt(memoryview(bytearray(pt)).toreadonly())["x"], x)
