"""Stores behind one interface: local directory (default), HTTP read-only, Hugging Face Hub.

Every read names a pinned revision (a full 40-hex commit). Writes are commits: a set of new
files, optionally guarded by a parent check (compare-and-swap on the store head). Only
``manifest.json`` may change content; every other path is create-only, so a published snapshot
or shard is never overwritten.

LocalStore
    Files live at their store paths under ``root``; ``root/.gc25d/log.jsonl`` is the commit log
    (one JSON line per commit, linear history). A commit takes an exclusive flock, checks the
    parent, links each new file into place, then appends and fsyncs its log line: a crash before
    the append leaves only unlisted orphans (invisible, replaced by the next commit); after it,
    the commit is complete. Reads check the path was committed at or before the revision.

HttpStore
    Reads ``url_template.format(revision=<40 hex>, path=<quoted path>)``. ``open_range`` is our
    own streamer: ``Range: bytes=<offset>-<size-1>`` requests, bounded retries with exponential
    backoff; every reconnect must answer 206 with exactly ``bytes <offset>-<size-1>/<size>``, or
    the read fails loud. Redirects are followed per request and every reconnect goes back through
    the pinned URL (an expired CDN redirect is never reused). Bytes are never spliced from two
    different responses at a wrong offset. Only http and https are fetched (first URL and every
    redirect); https never redirects down to http; the Authorization header goes only to the
    first URL's origin (scheme, host and port).

HubStore
    Reads through HttpStore at ``<endpoint>/datasets/<repo>/resolve/<commit>/<path>``; head and
    listings via ``HfApi``; commits with ``HfApi.create_commit(parent_commit=...)``: HTTP 412 is a
    lost race (StaleParentError); any other failure is CommitUncertainError, and the publisher
    re-reads the head to learn whether it landed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import io
import json
import os
import random
import shutil
import time
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import Field

from gc25d_core.atomic import atomic_path, atomic_write_bytes
from gc25d_core.cache.errors import (
    AlreadyExistsError,
    CommitUncertainError,
    HttpStreamError,
    NotCommittedError,
    StaleParentError,
    StoreError,
)
from gc25d_core.cache.manifest import POINTER_PATH, Strict, check_commit, check_store_path, is_commit
from gc25d_core.hashing import sha256_file

if TYPE_CHECKING:
    from gc25d_core.config import Gc25dConfig

MUTABLE_PATHS = frozenset({POINTER_PATH})


@dataclass(frozen=True)
class Addition:
    """One file of a commit: in-memory ``data`` or a local ``file`` (with its SHA256 if known)."""

    data: bytes | None = None
    file: Path | None = None
    sha256: str | None = None

    def digest(self) -> str:
        if self.sha256 is not None:
            return self.sha256
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        assert self.file is not None
        return sha256_file(self.file)

    def to_bytes(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.file is not None
        return self.file.read_bytes()


def as_additions(files: Mapping[str, bytes | Addition]) -> dict[str, Addition]:
    return {p: (a if isinstance(a, Addition) else Addition(data=bytes(a))) for p, a in files.items()}


class Store(ABC):
    """Read (and, where supported, commit) files at pinned revisions."""

    @abstractmethod
    def head(self) -> str | None:
        """The current commit (40 hex), None for an empty store."""

    @abstractmethod
    def read_bytes(self, path: str, revision: str) -> bytes: ...

    @abstractmethod
    def open_range(self, path: str, revision: str, size: int) -> IO[bytes]:
        """A sequential reader of a ``size``-byte file from offset 0."""

    @abstractmethod
    def exists(self, path: str, revision: str) -> bool: ...

    @abstractmethod
    def list_files(self, prefix: str, revision: str) -> list[str]:
        """Paths under ``prefix`` at ``revision`` (NotImplementedError where a store cannot list)."""

    def commit(
        self,
        files: Mapping[str, bytes | Addition],
        *,
        parent: str | None,
        check_parent: bool = True,
        message: str = "",
    ) -> str:
        """Add files in one commit; with ``check_parent`` the head must equal ``parent`` (None =
        empty store). Returns the new head. Raises StaleParentError (lost race),
        AlreadyExistsError (would overwrite), CommitUncertainError (may or may not have landed)."""
        raise StoreError(f"{self.describe()} is read-only")

    @abstractmethod
    def describe(self) -> str: ...


# ----------------------------------------------------------------------------------------------
# local directory store


class LocalStore(Store):
    META = ".gc25d"

    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()
        self._log_pos = 0
        self._commits: list[str] = []
        self._index: dict[str, int] = {}
        self._created: dict[str, tuple[int, str]] = {}  # immutable path -> (commit index, sha256)
        self._mutable: dict[str, list[tuple[int, str]]] = {}
        self._by_sha: dict[str, str] = {}  # sha256 -> an immutable path with that content

    def describe(self) -> str:
        return f"local:{self.root}"

    @property
    def _meta(self) -> Path:
        return self.root / self.META

    @property
    def _log(self) -> Path:
        return self._meta / "log.jsonl"

    def _reload(self) -> None:
        try:
            with open(self._log, "rb") as f:
                f.seek(self._log_pos)
                tail = f.read()
        except FileNotFoundError:
            return
        pos = self._log_pos
        for line in tail.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn last line of a crashed commit: not committed
            pos += len(line)
            rec = json.loads(line)
            i = len(self._commits)
            self._commits.append(rec["commit"])
            self._index[rec["commit"]] = i
            for p, sha in rec["files"].items():
                if p in MUTABLE_PATHS:
                    self._mutable.setdefault(p, []).append((i, sha))
                elif p not in self._created:
                    self._created[p] = (i, sha)
                    self._by_sha.setdefault(sha, p)
        self._log_pos = pos

    def head(self) -> str | None:
        self._reload()
        return self._commits[-1] if self._commits else None

    def _rev_index(self, revision: str) -> int:
        check_commit(revision, f"{self.describe()} read")
        if revision not in self._index:
            self._reload()
        if revision not in self._index:
            raise NotCommittedError(f"{self.describe()}: unknown revision {revision}")
        return self._index[revision]

    def _committed_sha(self, path: str, revision: str) -> str:
        check_store_path(path)
        i = self._rev_index(revision)
        if path in MUTABLE_PATHS:
            for j, sha in reversed(self._mutable.get(path, [])):
                if j <= i:
                    return sha
        else:
            got = self._created.get(path)
            if got is not None and got[0] <= i:
                return got[1]
        raise NotCommittedError(f"{self.describe()}: {path} is not committed at {revision}")

    def exists(self, path: str, revision: str) -> bool:
        try:
            self._committed_sha(path, revision)
            return True
        except NotCommittedError:
            return False

    def read_bytes(self, path: str, revision: str) -> bytes:
        sha = self._committed_sha(path, revision)
        candidates = [path]
        if path in MUTABLE_PATHS and sha in self._by_sha:
            candidates.append(self._by_sha[sha])  # the immutable twin (manifests/vN.json)
        for p in candidates:
            with contextlib.suppress(FileNotFoundError):
                data = (self.root / p).read_bytes()
                if p not in MUTABLE_PATHS or hashlib.sha256(data).hexdigest() == sha:
                    return data
        raise NotCommittedError(f"{self.describe()}: content of {path} at {revision} is no longer available")

    def open_range(self, path: str, revision: str, size: int) -> IO[bytes]:
        self._committed_sha(path, revision)
        if path in MUTABLE_PATHS:
            return io.BytesIO(self.read_bytes(path, revision))
        return open(self.root / path, "rb", buffering=0)

    def local_path(self, path: str, revision: str) -> Path:
        """Filesystem path of an immutable committed file (for the loopback server)."""
        self._committed_sha(path, revision)
        if path in MUTABLE_PATHS:
            raise StoreError("mutable paths have no stable local file")
        return self.root / path

    def list_files(self, prefix: str, revision: str) -> list[str]:
        i = self._rev_index(revision)
        out = [p for p, (j, _) in self._created.items() if j <= i and p.startswith(prefix)]
        out += [
            p for p, hist in self._mutable.items() if p.startswith(prefix) and any(j <= i for j, _ in hist)
        ]
        return sorted(out)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._meta.mkdir(parents=True, exist_ok=True)
        with open(self._meta / "lock", "a+b") as lf:
            fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)

    def _place(self, dest: Path, add: Addition) -> None:
        """Atomic write of one file; dest is either absent or an unlisted orphan."""
        with atomic_path(dest) as tmp:
            if add.data is not None:
                tmp.write_bytes(add.data)
            else:
                assert add.file is not None
                tmp.unlink()
                try:
                    os.link(add.file, tmp)  # same filesystem: no copy
                except OSError:
                    shutil.copyfile(add.file, tmp)

    def commit(
        self,
        files: Mapping[str, bytes | Addition],
        *,
        parent: str | None,
        check_parent: bool = True,
        message: str = "",
    ) -> str:
        adds = as_additions(files)
        for p in adds:
            check_store_path(p)
            if p.startswith(self.META):
                raise StoreError(f"reserved path {p}")
        with self._locked():
            self._reload()
            head = self._commits[-1] if self._commits else None
            if check_parent and head != parent:
                raise StaleParentError(
                    f"{self.describe()}: head is {head}, expected parent {parent}",
                    expected=parent,
                    actual=head,
                )
            record: dict[str, str] = {}
            for p, add in adds.items():
                sha = add.digest()
                if p not in MUTABLE_PATHS and p in self._created:
                    if self._created[p][1] == sha:
                        continue  # idempotent re-add of identical content
                    raise AlreadyExistsError(
                        f"{self.describe()}: {p} exists with different content (create-only)"
                    )
                record[p] = sha
            if not record:
                return head if head is not None else self._empty_commit(message)
            for p in record:
                if p in MUTABLE_PATHS:
                    atomic_write_bytes(self.root / p, adds[p].to_bytes())
                else:
                    self._place(self.root / p, adds[p])
            return self._append(head, record, message)

    def _empty_commit(self, message: str) -> str:
        return self._append(None, {}, message)

    def _append(self, head: str | None, record: dict[str, str], message: str) -> str:
        body = {
            "parent": head,
            "files": record,
            "message": message,
            "seq": len(self._commits),
            "t": time.time(),
        }
        cid = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()
        line = (json.dumps({"commit": cid, **body}, sort_keys=True) + "\n").encode()
        fd = os.open(self._log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size != self._log_pos:  # drop a torn tail left by a crashed commit
                os.ftruncate(fd, self._log_pos)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._reload()
        return cid


# ----------------------------------------------------------------------------------------------
# HTTP


class HttpConfig(Strict):
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=6, ge=0)  # consecutive failed attempts without progress
    max_reconnects: int = Field(default=64, ge=0)  # reconnects per stream in total
    backoff_s: float = Field(default=0.25, ge=0)
    backoff_max_s: float = Field(default=15.0, ge=0)
    max_redirects: int = Field(default=5, ge=0)
    chunk_bytes: int = Field(default=1 << 20, ge=4096)


_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


def _backoff(cfg: HttpConfig, attempt: int) -> None:
    delay = min(cfg.backoff_max_s, cfg.backoff_s * (2**attempt))
    if delay > 0:
        time.sleep(delay * (0.5 + random.random() / 2))


class _Retryable(Exception):
    pass


_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str, what: str = "") -> tuple[str, str, int]:
    """(scheme, host, port) of a URL we may fetch: http or https only, a host, a valid port.
    ``what`` prefixes the URL in the error (a redirect names where it came from)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in _SCHEMES:
        raise HttpStreamError(f"refusing {what}{url!r}: scheme {u.scheme!r} is not http or https", url=url)
    try:
        port = u.port or _DEFAULT_PORTS[u.scheme]
    except ValueError:
        raise HttpStreamError(f"refusing {what}{url!r}: invalid port", url=url) from None
    if not u.hostname:
        raise HttpStreamError(f"refusing {what}{url!r}: no host", url=url)
    return u.scheme, u.hostname.lower(), port


def _check_redirect(src: str, dst: str, headers: Mapping[str, str]) -> None:
    """A redirect leaves https only over https: an http hop would carry the request (and the token,
    were it the same host) in clear and its answer unauthenticated."""
    if urllib.parse.urlsplit(src).scheme == "https" and urllib.parse.urlsplit(dst).scheme != "https":
        token = " with an Authorization header" if any(k.lower() == "authorization" for k in headers) else ""
        raise HttpStreamError(
            f"refusing the redirect from {src!r} to {dst!r}: an https downgrade{token}", url=src
        )


def _request(
    url: str,
    headers: Mapping[str, str],
    cfg: HttpConfig,
    method: str = "GET",
) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection, str, bool]:
    """One request, following redirects. Only http(s) URLs are fetched, https never redirects to
    http, and the Authorization header goes only to the first URL's origin (scheme, host, port).

    Returns (response, connection, final url, redirected)."""
    origin = _origin(url)
    redirected = False
    for _ in range(cfg.max_redirects + 1):
        scheme, host, port = hop = _origin(url)
        u = urllib.parse.urlsplit(url)
        conn_cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(host, port, timeout=cfg.timeout_s)
        target = u.path + (f"?{u.query}" if u.query else "")
        hdrs = {k: v for k, v in headers.items() if hop == origin or k.lower() != "authorization"}
        try:
            conn.request(method, target or "/", headers=hdrs)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        if resp.status in (301, 302, 303, 307, 308):
            loc = resp.getheader("Location")
            resp.close()
            conn.close()
            if not loc:
                raise HttpStreamError(f"redirect without Location from {url}", url=url)
            nxt = urllib.parse.urljoin(url, loc)
            _origin(nxt, f"the redirect from {url!r} to ")
            _check_redirect(url, nxt, headers)
            url = nxt
            redirected = True
            continue
        return resp, conn, url, redirected
    raise HttpStreamError(f"too many redirects from {url}", url=url)


def http_get_bytes(
    url: str, *, headers: Mapping[str, str] | None = None, cfg: HttpConfig | None = None
) -> bytes:
    """GET a small file whole (manifests, receipts); retries transient failures, checks length."""
    cfg = cfg or HttpConfig()
    last = ""
    for attempt in range(cfg.max_retries + 1):
        if attempt:
            _backoff(cfg, attempt - 1)
        try:
            resp, conn, final, _ = _request(url, headers or {}, cfg)
        except _Retryable as e:
            last = str(e)
            continue
        try:
            if resp.status in _RETRY_STATUS:
                last = f"HTTP {resp.status}"
                continue
            if resp.status == 404:
                raise FileNotFoundError(f"HTTP 404: {url}")
            if resp.status != 200:
                raise HttpStreamError(f"HTTP {resp.status} for {final}", url=url)
            length = resp.getheader("Content-Length")
            try:
                body = resp.read()
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if length is not None and len(body) != int(length):
                last = f"short body {len(body)} of {length}"
                continue
            return body
        finally:
            resp.close()
            conn.close()
    raise HttpStreamError(f"GET {url} failed after {cfg.max_retries + 1} attempts: {last}", url=url)


def _parse_content_range(value: str | None) -> tuple[int, int, int] | None:
    if not value or not value.startswith("bytes "):
        return None
    try:
        rng, total = value[6:].split("/", 1)
        a, b = rng.split("-", 1)
        return int(a), int(b), int(total)
    except ValueError:
        return None


class RangeStream(io.RawIOBase):
    """Sequential reader of ``size`` bytes at ``url`` with exact-offset reconnects.

    Each connection asks ``Range: bytes=<pos>-<size-1>``. Accepted answers: 206 whose
    Content-Range is exactly ``bytes <pos>-<size-1>/<size>``; or, only at offset 0, a 200 whose
    Content-Length is ``size``. Anything else (a 200 to a resumed range, a wrong Content-Range, a
    4xx) fails loud. Connection drops, timeouts, short bodies and 5xx/429 are retried from the
    current offset with exponential backoff: at most ``max_retries`` consecutive attempts without
    progress and ``max_reconnects`` reconnects in total, then HttpStreamError.
    """

    def __init__(
        self, url: str, size: int, *, headers: Mapping[str, str] | None = None, cfg: HttpConfig | None = None
    ):
        super().__init__()
        self.url, self.size = url, size
        self.headers = dict(headers or {})
        self.cfg = cfg or HttpConfig()
        self.pos = 0
        self.reconnects = 0
        self._resp: http.client.HTTPResponse | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._fails = 0

    def readable(self) -> bool:
        return True

    def _drop(self) -> None:
        if self._resp is not None:
            with contextlib.suppress(Exception):
                self._resp.close()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._resp = self._conn = None

    def _fatal(self, msg: str) -> HttpStreamError:
        self._drop()
        return HttpStreamError(f"{msg} (url {self.url}, offset {self.pos})", url=self.url, offset=self.pos)

    def _transient(self, why: str) -> None:
        self._drop()
        self._fails += 1
        self.reconnects += 1
        if self._fails > self.cfg.max_retries or self.reconnects > self.cfg.max_reconnects:
            raise HttpStreamError(
                f"giving up after {self._fails} consecutive failures / {self.reconnects} reconnects: "
                f"{why} (url {self.url}, offset {self.pos})",
                url=self.url,
                offset=self.pos,
            )
        _backoff(self.cfg, self._fails - 1)

    def _connect(self) -> None:
        while True:
            hdrs = dict(self.headers)
            hdrs["Range"] = f"bytes={self.pos}-{self.size - 1}"
            hdrs["Accept-Encoding"] = "identity"
            try:
                resp, conn, final, _ = _request(self.url, hdrs, self.cfg)
            except _Retryable as e:
                self._transient(str(e))
                continue
            self._resp, self._conn = resp, conn
            st = resp.status
            if st == 206:
                cr = _parse_content_range(resp.getheader("Content-Range"))
                if cr != (self.pos, self.size - 1, self.size):
                    raise self._fatal(
                        f"206 with Content-Range {resp.getheader('Content-Range')!r}, expected "
                        f"'bytes {self.pos}-{self.size - 1}/{self.size}'"
                    )
                return
            if st == 200:
                length = resp.getheader("Content-Length")
                if self.pos == 0 and length is not None and int(length) == self.size:
                    return
                raise self._fatal(
                    f"server answered 200 (whole file, Content-Length {length}) to a range request; "
                    "refusing to splice"
                )
            if st in _RETRY_STATUS:
                self._transient(f"HTTP {st}")
                continue
            if st == 416:
                raise self._fatal("HTTP 416: the file is shorter than the listed size")
            raise self._fatal(f"HTTP {st} from {final}")

    def _pull(self, take: Callable[[Any, int], Any]) -> Any:
        """``take(response, bytes_left)`` -> bytes or a count, with reconnects at the exact offset;
        None at the end of the range."""
        while True:
            if self.pos >= self.size:
                self._drop()
                return None
            if self._resp is None:
                self._connect()
            try:
                out = take(self._resp, self.size - self.pos)
            except (OSError, http.client.HTTPException) as e:
                self._transient(f"{type(e).__name__}: {e}")
                continue
            if not out:
                self._transient("connection closed early")
                continue
            self.pos += out if isinstance(out, int) else len(out)
            self._fails = 0
            return out

    def read(self, n: int = -1) -> bytes:
        limit = self.cfg.chunk_bytes if n is None or n < 0 else n
        if limit == 0:
            return b""
        data = self._pull(lambda resp, left: resp.read(min(limit, left)))
        return b"" if data is None else data

    def readinto(self, b: Any) -> int:
        """Straight into the caller's buffer (no intermediate bytes object)."""
        view = memoryview(b).cast("B")
        if not len(view):
            return 0
        got = self._pull(lambda resp, left: resp.readinto(view[: min(len(view), left)]))
        return 0 if got is None else got

    def close(self) -> None:
        self._drop()
        super().close()


class HttpStore(Store):
    """Read-only store over HTTP(S) at pinned-revision URLs.

    ``url_template``: e.g. ``http://host/resolve/{revision}/{path}``. ``head_url`` (optional)
    answers the current commit as text or JSON ``{"sha": ...}``. ``list_fn(prefix, revision)``
    (optional) lists files; without it, listing raises NotImplementedError.
    """

    def __init__(
        self,
        url_template: str,
        *,
        head_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        config: HttpConfig | None = None,
        list_fn: Callable[[str, str], list[str]] | None = None,
    ):
        if "{revision}" not in url_template or "{path}" not in url_template:
            raise ValueError("url_template needs {revision} and {path}")
        _origin(url_template)  # http(s) only: fail at construction, not at the first read
        self.url_template, self.head_url = url_template, head_url
        self.headers = dict(headers or {})
        self.config = config or HttpConfig()
        self.list_fn = list_fn

    def describe(self) -> str:
        return f"http:{self.url_template}"

    def url(self, path: str, revision: str) -> str:
        check_store_path(path)
        check_commit(revision, f"{path}")
        return self.url_template.format(revision=revision, path=urllib.parse.quote(path))

    def head(self) -> str | None:
        if self.head_url is None:
            raise StoreError(f"{self.describe()} has no head_url; pass the manifest commit explicitly")
        body = http_get_bytes(self.head_url, headers=self.headers, cfg=self.config).decode().strip()
        if body.startswith("{"):
            body = json.loads(body).get("sha") or ""
        if not body:
            return None
        return check_commit(body, "head")

    def read_bytes(self, path: str, revision: str) -> bytes:
        try:
            return http_get_bytes(self.url(path, revision), headers=self.headers, cfg=self.config)
        except FileNotFoundError:
            raise NotCommittedError(f"{path} not found at {revision}") from None

    def open_range(self, path: str, revision: str, size: int) -> IO[bytes]:
        return RangeStream(self.url(path, revision), size, headers=self.headers, cfg=self.config)  # type: ignore[return-value]

    def exists(self, path: str, revision: str) -> bool:
        try:
            resp, conn, _, _ = _request(
                self.url(path, revision), {**self.headers, "Range": "bytes=0-0"}, self.config
            )
        except _Retryable as e:
            raise HttpStreamError(f"HEAD-probe of {path} failed: {e}") from None
        try:
            if resp.status in (200, 206):
                return True
            if resp.status == 404:
                return False
            raise HttpStreamError(f"HTTP {resp.status} probing {path}")
        finally:
            resp.close()
            conn.close()

    def list_files(self, prefix: str, revision: str) -> list[str]:
        if self.list_fn is None:
            raise NotImplementedError(f"{self.describe()} cannot list files")
        return sorted(p for p in self.list_fn(prefix, revision) if p.startswith(prefix))


# ----------------------------------------------------------------------------------------------
# Hugging Face Hub


def _http_status(err: BaseException) -> int | None:
    resp = getattr(err, "response", None)
    status = getattr(resp, "status_code", None)
    return status if isinstance(status, int) else None


class HubStore(Store):
    """A Hub dataset repo. ``api``: an ``HfApi`` (or a test double with the same methods)."""

    def __init__(
        self,
        repo_id: str,
        *,
        api: Any | None = None,
        endpoint: str | None = None,
        token: str | None = None,
        repo_type: str = "dataset",
        branch: str = "main",
        config: HttpConfig | None = None,
    ):
        self.repo_id, self.repo_type, self.branch, self.token = repo_id, repo_type, branch, token
        self._api = api
        self.endpoint = (endpoint or getattr(api, "endpoint", None) or "https://huggingface.co").rstrip("/")
        prefix = "datasets/" if repo_type == "dataset" else ("spaces/" if repo_type == "space" else "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = HttpStore(
            f"{self.endpoint}/{prefix}{repo_id}/resolve/{{revision}}/{{path}}",
            headers=headers,
            config=config,
        )
        self._listing: dict[str, frozenset[str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_api"] = None  # DataLoader workers only read (through self.http)
        return d

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi(endpoint=self.endpoint, token=self.token)
        return self._api

    def describe(self) -> str:
        return f"hub:{self.repo_type}/{self.repo_id}"

    def head(self) -> str | None:
        sha = self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.branch).sha
        return check_commit(sha, f"{self.describe()} head") if sha else None

    def _files(self, revision: str) -> frozenset[str]:
        check_commit(revision, self.describe())
        if revision not in self._listing:  # a commit's tree never changes: cache forever
            self._listing[revision] = frozenset(
                self.api.list_repo_files(self.repo_id, repo_type=self.repo_type, revision=revision)
            )
        return self._listing[revision]

    def read_bytes(self, path: str, revision: str) -> bytes:
        return self.http.read_bytes(path, revision)

    def open_range(self, path: str, revision: str, size: int) -> IO[bytes]:
        return self.http.open_range(path, revision, size)

    def exists(self, path: str, revision: str) -> bool:
        return path in self._files(revision)

    def list_files(self, prefix: str, revision: str) -> list[str]:
        return sorted(p for p in self._files(revision) if p.startswith(prefix))

    def commit(
        self,
        files: Mapping[str, bytes | Addition],
        *,
        parent: str | None,
        check_parent: bool = True,
        message: str = "",
    ) -> str:
        from huggingface_hub import CommitOperationAdd

        adds = as_additions(files)
        head = self.head()
        if check_parent and head != parent:  # cheap early answer; the server-side check is the CAS
            raise StaleParentError(
                f"{self.describe()}: head is {head}, expected parent {parent}", expected=parent, actual=head
            )
        base = parent if (check_parent and parent) else head
        present = self._files(base) if base else frozenset()
        ops = []
        for p, add in adds.items():
            check_store_path(p)
            if p not in MUTABLE_PATHS and p in present:
                raise AlreadyExistsError(f"{self.describe()}: {p} already exists at {base} (create-only)")
            src: Any = add.data if add.data is not None else str(add.file)
            ops.append(CommitOperationAdd(path_in_repo=p, path_or_fileobj=src))
        try:
            info = self.api.create_commit(
                self.repo_id,
                ops,
                commit_message=message or "gc25d cache commit",
                repo_type=self.repo_type,
                revision=self.branch,
                parent_commit=parent if check_parent else None,
            )
        except Exception as e:
            if _http_status(e) == 412:
                raise StaleParentError(
                    f"{self.describe()}: parent {parent} is stale (HTTP 412)", expected=parent
                ) from e
            raise CommitUncertainError(f"{self.describe()}: commit failed, outcome unknown: {e!r}") from e
        oid = getattr(info, "oid", None)
        if not is_commit(oid):
            raise CommitUncertainError(f"{self.describe()}: commit returned no oid ({info!r})")
        return str(oid)


# ----------------------------------------------------------------------------------------------


def open_cache_store(cfg: Gc25dConfig) -> Store:
    """The project's store (``cache.store``), a local folder created if absent. Here, not beside the
    packing that needs torch: the operator CLI lists snapshots through it on every call."""
    spec = cfg.cache.store
    if "://" not in spec:
        Path(spec).mkdir(parents=True, exist_ok=True)
    return open_store(spec)


def open_store(
    spec: str | Store,
    *,
    head_url: str | None = None,
    token: str | None = None,
    config: HttpConfig | None = None,
) -> Store:
    """``/path`` or ``file:///path`` -> LocalStore; ``hf://datasets/<owner>/<name>`` -> HubStore;
    ``http(s)://.../{revision}/{path}`` -> HttpStore (a URL without placeholders gets
    ``/resolve/{revision}/{path}`` appended and ``/api/head`` as head URL, the loopback-server
    layout)."""
    if isinstance(spec, Store):
        return spec
    if spec.startswith("hf://"):
        rest = spec[len("hf://") :]
        repo_type = "dataset"
        for prefix, kind in (("datasets/", "dataset"), ("models/", "model"), ("spaces/", "space")):
            if rest.startswith(prefix):
                repo_type, rest = kind, rest[len(prefix) :]
        return HubStore(rest.strip("/"), token=token, repo_type=repo_type, config=config)
    if spec.startswith(("http://", "https://")):
        if "{revision}" in spec:
            return HttpStore(spec, head_url=head_url, config=config)
        base = spec.rstrip("/")
        return HttpStore(
            f"{base}/resolve/{{revision}}/{{path}}", head_url=head_url or f"{base}/api/head", config=config
        )
    if spec.startswith("file://"):
        spec = spec[len("file://") :]
    return LocalStore(spec)
