"""Shard TAR format: deterministic writer and a verify-then-deserialise streaming reader.

Writer: ``<sample_id>.pt`` then ``<sample_id>.json`` per sample, regular files, mtime 0, uid/gid 0,
PAX format (plain ustar headers for short names), so the same samples give the same bytes.

Reader (``iter_verified_members``), per research/streaming_anchors.md:
- stdlib ``tarfile`` in ``'r|'`` mode over ``HashingReader``, which counts every byte that passes
  and feeds the whole-TAR SHA256 (in a helper thread: hashlib releases the GIL, so the TAR hash
  and the per-member hash run on two cores);
- tarfile parses every header; a member's payload is read straight from the same reader into
  one buffer of its own (no join/slice copies), which both hash threads read in place and
  ``torch.load`` reads from; nobody may change it (it is handed out read-only);
- every member is checked against the expected listing *before* its data is read: regular file,
  safe name, exact name ``<id>.pt`` / ``<id>.json`` in order, exact size;
- each member's bytes are hashed and compared before anyone may deserialise them;
- after the last listed member, no further member may follow; the stream is drained to EOF
  (tarfile leaves the record padding unread) and the total size and SHA256 must match.
tarfile stops *silently* on a truncated archive or a damaged header; the expected listing turns
that into an error. Every error is a ShardError naming shard, sample and byte offset.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Protocol, cast

from gc25d_core.cache.errors import HttpStreamError, ShardError
from gc25d_core.cache.manifest import JSON_SUFFIX, PT_SUFFIX, canonical_json, check_sample_id

DEFAULT_CHUNK = 1 << 20
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class MemberSpec(Protocol):
    id: str
    pt_size: int
    pt_sha256: str
    json_size: int
    json_sha256: str


@dataclass(frozen=True)
class MemberInfo:
    """Sizes and hashes of one sample's two members (what a receipt records)."""

    id: str
    pt_size: int
    pt_sha256: str
    json_size: int
    json_sha256: str


@dataclass(frozen=True)
class ShardInfo:
    size: int
    sha256: str
    members: tuple[MemberInfo, ...]


# ----------------------------------------------------------------------------------------------
# encoding


def encode_pt(payload: bytes | Mapping[str, Any]) -> bytes:
    """PT bytes: given bytes are used as is; a tensor dict is torch.save'd (zip format)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    import torch

    buf = io.BytesIO()
    torch.save(dict(payload), buf)
    return buf.getvalue()


def encode_json(meta: Mapping[str, Any] | bytes) -> bytes:
    if isinstance(meta, (bytes, bytearray)):
        return bytes(meta)
    return canonical_json(dict(meta))


class _BufferFile(io.RawIOBase):
    """Seekable read-only file over a buffer, without copying it (``io.BytesIO`` copies anything
    but ``bytes``). torch.load reads each record with ``readinto`` straight into its storage."""

    def __init__(self, data: bytes | bytearray | memoryview):
        super().__init__()
        self._mv = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._mv)}[whence]
        if base + pos < 0:
            raise ValueError("negative seek position")
        self._pos = base + pos
        return self._pos

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._mv) - self._pos))
        copy_into(out[:n], self._mv[self._pos : self._pos + n])
        self._pos += n
        return n


_GIL_FREE_COPY = 64 << 10  # copies at least this large go through numpy (see copy_into)


def copy_into(dst: memoryview, src: bytes | memoryview) -> None:
    """``dst[:] = src``. Large copies go through numpy, which drops the GIL while it copies. A
    memoryview copy holds the GIL, and the hash threads (hashlib drops it while hashing, but needs
    it back after every piece) wait for it: concurrent SHA256 fell from 1.8 to 0.5 GB/s while
    another thread copied 26 MB buffers by memoryview, and stayed at 1.8 with ``np.copyto``."""
    if len(dst) < _GIL_FREE_COPY:
        dst[:] = src
        return
    import numpy as np

    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


def deserialize_pt(data: bytes | bytearray | memoryview) -> Any:
    """The only place PT bytes become objects; callers pass bytes whose SHA256 already matched."""
    import torch

    f = io.BytesIO(data) if isinstance(data, bytes) else cast(IO[bytes], _BufferFile(data))
    return torch.load(f, weights_only=True, map_location="cpu")


def deserialize_json(data: bytes) -> Any:
    return json.loads(data)


class _HashingWriter:
    def __init__(self, f: IO[bytes]):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b: bytes) -> int:
        self.f.write(b)
        self.h.update(b)
        self.n += len(b)
        return len(b)


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
    ti.type = tarfile.REGTYPE
    return ti


def write_shard(f: IO[bytes], samples: Iterable[tuple[str, bytes, bytes]]) -> ShardInfo:
    """Write ``(sample_id, pt_bytes, json_bytes)`` in order to ``f``; return size, SHA256, members."""
    w = _HashingWriter(f)
    members: list[MemberInfo] = []
    seen: set[str] = set()
    with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
        for sid, pt, js in samples:
            check_sample_id(sid)
            if sid in seen:
                raise ValueError(f"duplicate sample id {sid!r} in one shard")
            seen.add(sid)
            if not pt:
                raise ValueError(f"sample {sid}: empty PT payload")
            tf.addfile(_tarinfo(sid + PT_SUFFIX, len(pt)), io.BytesIO(pt))
            tf.addfile(_tarinfo(sid + JSON_SUFFIX, len(js)), io.BytesIO(js))
            members.append(
                MemberInfo(
                    sid, len(pt), hashlib.sha256(pt).hexdigest(), len(js), hashlib.sha256(js).hexdigest()
                )
            )
    if not members:
        raise ValueError("a shard needs at least one sample")
    return ShardInfo(w.n, w.h.hexdigest(), tuple(members))


# ----------------------------------------------------------------------------------------------
# reading


_HASH_PIECE = 8 << 20  # largest single update handed to the hash thread (one GIL round trip each)
_HASH_FEED = 4 << 20  # a payload is handed to the hash thread in pieces of about this size
_HASH_BUDGET = 64 << 20  # bytes read but not yet hashed before the reader waits for the hash thread
_TAR_READ = 16 << 10  # tarfile's read size (was one block): one read brings a PT's padding, the
# JSON header, the JSON member, its padding and the next PT header; _read_member uses what tarfile
# read past a header, and HashingReader.read never reads past the listed TAR size


class _Sha256Thread:
    """SHA256 of a byte sequence fed in order from one thread, computed on a helper thread.

    ``feed`` takes bytes or (read-only) memoryviews without copying; the caller must not change
    them afterwards. At most ``budget`` bytes wait (the reader blocks beyond that), so memory stays
    bounded while a slow hash catches up. hashlib drops the GIL for updates over 2 KiB.
    """

    def __init__(self, budget: int = _HASH_BUDGET):
        self._h = hashlib.sha256()
        self._items: deque[bytes | memoryview] = deque()
        self._waiting = 0
        self._budget = budget
        self._closed = False
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._run, name="tar-sha256", daemon=True)
        self._t.start()

    def feed(self, b: bytes | memoryview) -> None:
        n = len(b)
        with self._cv:
            while self._waiting and self._waiting + n > self._budget:
                self._cv.wait()
            self._items.append(b)
            self._waiting += n
            self._cv.notify_all()

    def _run(self) -> None:
        cv = self._cv
        while True:
            with cv:
                while not self._items and not self._closed:
                    cv.wait()
                if not self._items:
                    return
                b = self._items.popleft()
            self._h.update(b)
            with cv:
                self._waiting -= len(b)
                cv.notify_all()

    def hexdigest(self) -> str:
        """Wait for everything fed so far; the digest of all of it (no more feeding after)."""
        self.stop()
        return self._h.hexdigest()

    def stop(self, *, discard: bool = False) -> None:
        with self._cv:
            if discard:
                self._items.clear()
                self._waiting = 0
            self._closed = True
            self._cv.notify_all()
        self._t.join()


class HashingReader:
    """File-like reader that counts bytes and SHA256s them (optionally on a helper thread).

    ``read(n)`` serves tarfile's header reads; ``readinto_exact`` fills a caller's buffer straight
    from ``raw`` (member payloads: no intermediate copies). Every byte passes exactly once, in
    stream order, through the count, the whole-TAR hash and ``sink``.
    ``limit``: more bytes than this is an error at once (a longer stream than the manifest says).
    ``sink``: every chunk is also written there (byte-for-byte import copy).
    """

    def __init__(
        self,
        raw: IO[bytes],
        *,
        limit: int | None = None,
        threaded: bool = True,
        sink: IO[bytes] | None = None,
        chunk: int = DEFAULT_CHUNK,
    ):
        self.raw, self.limit, self.sink, self.chunk = raw, limit, sink, chunk
        self.count = 0
        self._h = hashlib.sha256()
        self._hasher = _Sha256Thread() if threaded else None
        self._digest: str | None = None
        self._raw_readinto: Callable[[memoryview], int | None] | None = getattr(raw, "readinto", None)

    def _account(self, b: bytes | memoryview) -> None:
        self.count += len(b)
        if self.limit is not None and self.count > self.limit:
            raise _TooLong(self.count)
        if self._hasher is not None:
            if len(b) <= _HASH_PIECE:
                self._hasher.feed(b)
            else:
                mv = memoryview(b)
                for i in range(0, len(mv), _HASH_PIECE):
                    self._hasher.feed(mv[i : i + _HASH_PIECE])
        else:
            self._h.update(b)
        if self.sink is not None:
            self.sink.write(b)

    def read(self, n: int = -1) -> bytes:
        n = self.chunk if n is None or n < 0 else n
        if self.limit is not None:  # read-ahead stops at the listed end; past it, one byte is enough
            n = min(n, max(self.limit - self.count, 1))  # to show that the stream is longer
        b = self.raw.read(n)
        if b:
            self._account(b)
        return b

    def readinto_exact(self, out: memoryview) -> int:
        """Fill ``out`` from the stream (less only at EOF); returns the bytes read. ``out`` is
        hashed in place on the helper thread: it must not change afterwards."""
        want = len(out)
        if self.limit is not None:  # read at most one byte past the limit (then _TooLong)
            want = min(want, max(self.limit - self.count + 1, 0))
        got = fed = 0
        # read()-based streams: at most ``chunk`` per call, so their own temporaries stay small.
        # readinto writes straight into ``out``, and fewer, larger calls cost less per byte (on
        # loopback HTTP, 4 MiB calls instead of 1 MiB): one call per hash feed.
        step = self.chunk if self._raw_readinto is None else max(self.chunk, _HASH_FEED)
        while got < want:
            end = min(want, got + step)
            if self._raw_readinto is not None:
                k = self._raw_readinto(out[got:end]) or 0
            else:
                b = self.raw.read(end - got)
                k = len(b)
                copy_into(out[got : got + k], b)
            if k == 0:
                break
            got += k
            if got - fed >= _HASH_FEED:  # the hash thread starts before the member is complete
                self._account(out[fed:got].toreadonly())
                fed = got
        if got > fed:
            self._account(out[fed:got].toreadonly())
        return got

    def read_at_least(self, n: int, upto: int) -> bytes:
        """Read and account at least ``n`` bytes (fewer only at EOF), up to ``max(n, upto)``."""
        upto = max(n, upto)
        parts: list[bytes] = []
        got = 0
        while got < n:
            b = self.read(upto - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def drain(self) -> int:
        """Read to EOF (hashing everything); return the bytes that were left."""
        n = 0
        while True:
            b = self.read(self.chunk)
            if not b:
                return n
            n += len(b)

    def hexdigest(self) -> str:
        if self._digest is None:
            self._digest = self._hasher.hexdigest() if self._hasher is not None else self._h.hexdigest()
        return self._digest

    def close(self) -> None:
        if self._hasher is not None and self._digest is None:
            self._hasher.stop(discard=True)  # abandoned or failed: the digest is not wanted
        close = getattr(self.raw, "close", None)
        if close is not None:
            close()


class _TooLong(Exception):
    def __init__(self, count: int):
        super().__init__(count)
        self.count = count


@dataclass
class VerifiedMember:
    """One sample whose PT and JSON bytes matched the expected sizes and SHA256.

    ``pt`` (a read-only buffer) / ``json_bytes`` are None when the caller did not want the
    payload kept."""

    index: int
    sample_id: str
    offset: int  # header offset of the .pt member
    pt: memoryview | None
    json_bytes: bytes | None
    info: MemberInfo


def _kind_name(ti: tarfile.TarInfo) -> str:
    names = {
        tarfile.SYMTYPE: "symlink",
        tarfile.LNKTYPE: "hardlink",
        tarfile.DIRTYPE: "directory",
        tarfile.CHRTYPE: "char device",
        tarfile.BLKTYPE: "block device",
        tarfile.FIFOTYPE: "fifo",
    }
    return names.get(ti.type, f"type {ti.type!r}")


def _safe_name(name: str) -> bool:
    return (
        bool(name) and "/" not in name and "\\" not in name and not name.startswith(".") and ".." not in name
    )


class _Reader:
    """Shared state of one verification pass (so errors can say where they happened)."""

    def __init__(self, shard: str, hr: HashingReader):
        self.shard, self.hr = shard, hr
        self.sample: str | None = None
        self.offset: int | None = 0
        self.names: set[str] = set()
        self.tf: tarfile.TarFile | None = None

    def next(self) -> tarfile.TarInfo | None:
        """Next member; remembers where its header should start (tarfile may stop silently)."""
        assert self.tf is not None
        self.offset = self.tf.offset
        return self.tf.next()

    def fail(self, reason: str, *, offset: int | None = None, sample: str | None = "__cur__") -> ShardError:
        return ShardError(
            reason,
            shard=self.shard,
            sample=self.sample if sample == "__cur__" else sample,
            offset=self.offset if offset is None else offset,
        )

    def check_member(self, ti: tarfile.TarInfo | None, name: str, size: int | None) -> tarfile.TarInfo:
        """The next member must be regular file ``name`` (size ``size`` if known)."""
        if ti is None:
            raise self.fail(
                f"archive ended where member {name!r} should start (truncated, or a damaged "
                f"header stopped tarfile; {self.hr.count} bytes read)"
            )
        self.offset = ti.offset
        if ti.name in self.names:
            raise self.fail(f"duplicate member {ti.name!r} where {name!r} expected")
        self.names.add(ti.name)
        if not _safe_name(ti.name):
            raise self.fail(f"unsafe member name {ti.name!r} where {name!r} expected")
        if ti.type not in _REGULAR or ti.sparse is not None:
            raise self.fail(f"member {ti.name!r} is a {_kind_name(ti)}, not a regular file")
        if ti.name != name:
            raise self.fail(f"unexpected member {ti.name!r} where {name!r} expected")
        if size is not None and ti.size != size:
            raise self.fail(f"member {ti.name!r} has {ti.size} bytes, listing says {size}")
        return ti


def _stream_state_ok(stream: Any, hr: HashingReader) -> bool:
    """tarfile's 'r|' stream object has the layout the direct payload read relies on."""
    return (
        getattr(stream, "fileobj", None) is hr
        and type(getattr(stream, "buf", None)) is bytes
        and type(getattr(stream, "pos", None)) is int
        and type(getattr(stream, "bufsize", None)) is int
    )


def _new_buffer(size: int) -> memoryview:
    """A writable buffer for one payload (numpy: no zero fill before it is overwritten)."""
    import numpy as np

    return np.empty(size, dtype=np.uint8).data.cast("B")


def _read_member(tf: tarfile.TarFile, ti: tarfile.TarInfo, r: _Reader) -> memoryview:
    """A member's bytes, read-only, in a buffer of its own; tarfile's position is advanced past
    the member and its block padding, as ``tf.next()`` expects.

    Same bytes as ``tf.extractfile(ti).read()``: read straight from the counting + hashing
    reader into one buffer at the offset tarfile reports (tarfile's own 'r|' path joins and
    slices every payload twice). tarfile keeps parsing every header."""
    stream: Any = tf.fileobj
    if stream.tell() != ti.offset_data:  # cannot happen: members are read in order, in full
        stream.seek(ti.offset_data)
    size, hr = ti.size, r.hr
    if hr.limit is not None and size > hr.limit - stream.tell():
        raise r.fail(f"member {ti.name!r} claims {size} bytes, more than the listed TAR size holds")
    if not _stream_state_ok(stream, hr):  # another tarfile layout: its own (copying) read
        data = stream.read(size)
        if len(data) != size:
            raise r.fail(f"member {ti.name!r}: unexpected end of data ({len(data)} of {size} bytes)")
        return memoryview(data)
    pad = -size % tarfile.BLOCKSIZE
    out = _new_buffer(size)
    head: bytes = stream.buf  # bytes tarfile read ahead (already counted and hashed)
    k = min(len(head), size)
    out[:k] = head[:k]
    got = k + (hr.readinto_exact(out[k:]) if k < size else 0)
    if got != size:
        raise r.fail(f"member {ti.name!r}: unexpected end of data ({got} of {size} bytes)")
    tail = head[k:]
    p = min(len(tail), pad)
    if p < pad:  # tail was all padding: read the rest of it and, in the same read, what follows
        # up to tarfile's read size (its read-ahead: the next header, a small member, ...)
        tail = hr.read_at_least(pad - p, stream.bufsize)
        if len(tail) < pad - p:
            raise r.fail(f"member {ti.name!r}: unexpected end of data in its block padding")
        p = pad - p
    stream.buf = tail[p:]
    stream.pos += size + pad
    return out.toreadonly()


def _sha_hex(b: bytes | memoryview) -> str:
    return hashlib.sha256(b).hexdigest()


@dataclass
class _Pending:
    """A sample whose bytes are read; its PT hash may still be running on the helper thread."""

    index: int
    sid: str
    spec: MemberSpec | None
    pt_ti: tarfile.TarInfo
    pt: memoryview
    pt_sha: Future[str] | str
    js_ti: tarfile.TarInfo
    js: bytes


def _finish(p: _Pending, r: _Reader, keep: Callable[[int], bool]) -> VerifiedMember:
    """Compare hashes; only a sample that passes leaves this function."""
    pt_sha = p.pt_sha if isinstance(p.pt_sha, str) else p.pt_sha.result()
    if p.spec is not None and pt_sha != p.spec.pt_sha256:
        raise r.fail(
            f"PT SHA256 mismatch ({pt_sha} != {p.spec.pt_sha256})", sample=p.sid, offset=p.pt_ti.offset_data
        )
    js_sha = _sha_hex(p.js)
    if p.spec is not None and js_sha != p.spec.json_sha256:
        raise r.fail(
            f"JSON SHA256 mismatch ({js_sha} != {p.spec.json_sha256})",
            sample=p.sid,
            offset=p.js_ti.offset_data,
        )
    want = keep(p.index)
    info = MemberInfo(p.sid, len(p.pt), pt_sha, len(p.js), js_sha)
    return VerifiedMember(
        p.index, p.sid, p.pt_ti.offset, p.pt if want else None, p.js if want else None, info
    )


def iter_verified_members(
    raw: IO[bytes],
    *,
    shard: str,
    size: int,
    sha256: str,
    expected: Sequence[MemberSpec] | None,
    keep: Callable[[int], bool] = lambda i: True,
    threaded_hash: bool = True,
    chunk: int = DEFAULT_CHUNK,
    sink: IO[bytes] | None = None,
) -> Iterator[VerifiedMember]:
    """Stream a shard TAR and yield each sample after its bytes verified; raise ShardError on any
    mismatch. The generator returns normally only after the whole TAR verified (size + SHA256).

    ``expected=None`` discovers the listing (import of legacy shards): members must still come in
    ``<id>.pt``, ``<id>.json`` pairs with unique ids; only the whole-TAR size/SHA256 are checked.
    ``keep(i)`` decides whether sample i's payload bytes are returned (all are verified).
    ``threaded_hash``: the whole-TAR SHA256 runs on one helper thread and each PT's SHA256 on
    another while the next member is read (a sample is released only after its hash matched).
    When several problems exist, the earliest sample's is reported. ``raw`` is closed at the end.
    """
    hr = HashingReader(raw, limit=size, threaded=threaded_hash, sink=sink, chunk=chunk)
    r = _Reader(shard, hr)
    pool = ThreadPoolExecutor(1, thread_name_prefix="pt-sha256") if threaded_hash else None
    pending: _Pending | None = None
    try:
        try:
            tf = r.tf = tarfile.open(fileobj=hr, mode="r|", bufsize=_TAR_READ)  # type: ignore[call-overload]  # noqa: SIM115 (closed via hr)
        except tarfile.TarError as e:
            raise r.fail(f"not a readable TAR: {e}", offset=0, sample=None) from None
        index = 0
        seen: set[str] = set()
        while True:
            try:
                if expected is not None:
                    if index == len(expected):
                        break
                    spec: MemberSpec | None = expected[index]
                    assert spec is not None
                    r.sample = spec.id
                    ti = r.check_member(r.next(), spec.id + PT_SUFFIX, spec.pt_size)
                else:
                    spec = None
                    ti_any = r.next()
                    if ti_any is None:
                        break
                    r.offset = ti_any.offset
                    name = ti_any.name
                    if not name.endswith(PT_SUFFIX):
                        raise r.fail(f"member {name!r} where a '<id>.pt' member expected", sample=None)
                    sid = name[: -len(PT_SUFFIX)]  # split on the known suffix, from the right
                    r.sample = sid
                    try:
                        check_sample_id(sid)
                    except ValueError as e:
                        raise r.fail(str(e)) from None
                    if sid in seen:
                        raise r.fail(f"duplicate sample id {sid!r} in this TAR")
                    seen.add(sid)
                    ti = r.check_member(ti_any, sid + PT_SUFFIX, None)
                sid = r.sample
                assert sid is not None
                pt = _read_member(tf, ti, r)
                pt_sha: Future[str] | str = pool.submit(_sha_hex, pt) if pool is not None else _sha_hex(pt)
                tj = r.check_member(r.next(), sid + JSON_SUFFIX, None if spec is None else spec.json_size)
                js = bytes(_read_member(tf, tj, r))
                tf.members = []  # stream mode: do not keep every TarInfo
            except BaseException:
                if pending is not None:  # the earlier sample's own mismatch is reported first
                    _finish(pending, r, keep)
                raise
            if pending is not None:
                yield _finish(pending, r, keep)
            pending = _Pending(index, sid, spec, ti, pt, pt_sha, tj, js)
            index += 1
        if pending is not None:
            p, pending = pending, None
            yield _finish(p, r, keep)
        if expected is not None:
            r.sample = None
            extra = r.next()
            if extra is not None:
                r.sample = extra.name
                raise r.fail(
                    f"unlisted member {extra.name!r} ({_kind_name(extra) if extra.type not in _REGULAR else 'file'})",
                    offset=extra.offset,
                )
        elif index == 0:
            raise r.fail("TAR has no samples", sample=None, offset=hr.count)
        r.sample = None
        hr.drain()
        if hr.count != size:
            raise r.fail(f"TAR has {hr.count} bytes, listing says {size}", offset=hr.count)
        digest = hr.hexdigest()
        if digest != sha256:
            raise r.fail(f"whole-TAR SHA256 mismatch ({digest} != {sha256})", offset=hr.count)
    except _TooLong:
        raise r.fail(f"stream longer than the listed {size} bytes", offset=size) from None
    except HttpStreamError as e:
        off = e.offset if e.offset is not None else hr.count
        raise ShardError(str(e), shard=shard, sample=r.sample, offset=off, kind="io") from None
    except ShardError:
        raise
    except (tarfile.TarError, EOFError) as e:
        raise r.fail(f"TAR read error: {e} ({hr.count} bytes read)") from None
    except OSError as e:
        raise ShardError(
            f"read error: {e}", shard=shard, sample=r.sample, offset=hr.count, kind="io"
        ) from None
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        hr.close()


def verify_stream(
    raw: IO[bytes],
    *,
    shard: str,
    size: int,
    sha256: str,
    expected: Sequence[MemberSpec] | None,
    on_member: Callable[[VerifiedMember], None] | None = None,
    keep: Callable[[int], bool] = lambda i: False,
    sink: IO[bytes] | None = None,
) -> list[MemberInfo]:
    """Verify a whole shard; return the member listing. ``on_member`` sees each verified sample."""
    out: list[MemberInfo] = []
    for vm in iter_verified_members(
        raw, shard=shard, size=size, sha256=sha256, expected=expected, keep=keep, sink=sink
    ):
        if on_member is not None:
            on_member(vm)
        out.append(vm.info)
    return out
