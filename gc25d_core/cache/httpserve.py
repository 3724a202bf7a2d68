"""Loopback HTTP server with Range support, for tests, benchmarks and local serving.

Serves ``GET /resolve/<revision>/<path>`` (and ``/<anything>/resolve/<revision>/<path>``, the Hub
layout) from a ``resolve(revision, path)`` callback returning bytes, a file Path, or None (404).
``GET /api/head`` answers the head commit when a ``head`` callback is given. ``Range: bytes=a-b``
and ``bytes=a-`` get 206 with Content-Range; unsatisfiable ranges get 416.

Fault injection for tests: ``fault(request) -> Fault | None`` is asked once per request.
(The stdlib ``python -m http.server`` ignores Range, so it cannot serve these tests.)

With ``tls`` (an ``ssl.SSLContext``) the same port answers both https and plain http, told apart by
the first byte (a TLS handshake starts with 0x16), so a test can redirect between the schemes of
one host:port. ``seen`` records every request's scheme, path and Authorization header.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gc25d_core.cache.errors import StoreError


@dataclass(frozen=True)
class FaultRequest:
    n: int  # request number (0-based) on this server
    revision: str
    path: str
    start: int | None  # range start (None: no Range header)
    end: int | None
    url: str = ""  # the raw request path


@dataclass(frozen=True)
class Fault:
    """``drop``: send headers and ``after`` body bytes, then cut the connection.
    ``status``: answer ``status`` (200 = ignore the Range and send the whole file; 5xx/4xx = error).
    ``content_range``: answer 206 with this (wrong) Content-Range header and the requested bytes.
    ``redirect``: answer 302 to ``location`` (e.g. a CDN-like path on the same server)."""

    kind: str
    after: int = 0
    status: int = 503
    content_range: str = ""
    location: str = ""


@dataclass(frozen=True)
class SeenRequest:
    n: int
    scheme: str  # "https" or "http"
    url: str  # the raw request path
    authorization: str | None


Resolver = Callable[[str, str], "bytes | Path | None"]
_TLS_HANDSHAKE = 0x16  # first byte of a TLS ClientHello record


def _parse_range(h: str | None, size: int) -> tuple[int, int] | None | str:
    if not h:
        return None
    if not h.startswith("bytes=") or "," in h:
        return "bad"
    a, _, b = h[6:].partition("-")
    try:
        if a == "":
            n = int(b)
            return (max(0, size - n), size - 1) if n > 0 else "bad"
        start = int(a)
        end = int(b) if b else size - 1
    except ValueError:
        return "bad"
    if start >= size or end < start:
        return "bad"
    return start, min(end, size - 1)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _plain(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.close_connection = True
        srv = self.server
        scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        with srv.lock:
            n = srv.requests
            srv.requests += 1
            srv.seen.append(SeenRequest(n, scheme, self.path, self.headers.get("Authorization")))
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        if path == "/api/head":
            head = srv.head() if srv.head else None
            return self._plain(200 if head else 404, (head or "").encode())
        marker = "/resolve/"
        if marker not in path:
            return self._plain(404)
        rev, _, rel = path.split(marker, 1)[1].partition("/")
        try:
            obj = srv.resolve(rev, rel)
        except (StoreError, ValueError, FileNotFoundError):
            obj = None
        if obj is None:
            return self._plain(404)
        size = obj.stat().st_size if isinstance(obj, Path) else len(obj)
        rng = _parse_range(self.headers.get("Range"), size)
        start, end = rng if isinstance(rng, tuple) else (None, None)
        fault = srv.fault(FaultRequest(n, rev, rel, start, end, self.path)) if srv.fault else None
        with srv.lock:
            srv.log.append((n, rev, rel, start, end, fault.kind if fault else None))
        if rng == "bad":
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return
        if fault is not None and fault.kind == "redirect":
            self.send_response(302)
            self.send_header("Location", fault.location)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return
        if fault is not None and fault.kind == "status" and fault.status != 200:
            return self._plain(fault.status, b"injected")
        if rng is None or (fault is not None and fault.kind == "status"):
            start, end, status = 0, size - 1, 200
        else:
            assert isinstance(rng, tuple)
            start, end = rng
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Connection", "close")
        if status == 206:
            cr = f"bytes {start}-{end}/{size}"
            if fault is not None and fault.kind == "content_range":
                cr = fault.content_range
            self.send_header("Content-Range", cr)
        self.end_headers()
        count = end - start + 1
        if fault is not None and fault.kind == "drop":
            count = min(count, fault.after)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._send_body(obj, start, count)
            self.wfile.flush()
            if fault is not None and fault.kind == "drop":
                with contextlib.suppress(OSError):
                    self.connection.shutdown(2)

    def _send_body(self, obj: bytes | Path, start: int, count: int) -> None:
        if count <= 0:
            return
        if isinstance(obj, Path):
            self.wfile.flush()
            with open(obj, "rb") as f:
                sent = 0
                while sent < count:
                    k = os.sendfile(self.connection.fileno(), f.fileno(), start + sent, count - sent)
                    if k == 0:
                        break
                    sent += k
        else:
            self.wfile.write(obj[start : start + count])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        addr: tuple[str, int],
        resolve: Resolver,
        head: Callable[[], str | None] | None,
        fault: Callable[[FaultRequest], Fault | None] | None,
        tls: ssl.SSLContext | None,
    ):
        super().__init__(addr, _Handler)
        self.resolve, self.head, self.fault, self.tls = resolve, head, fault, tls
        self.lock = threading.Lock()
        self.requests = 0
        self.log: list[tuple[Any, ...]] = []
        self.seen: list[SeenRequest] = []

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the request's own thread: wrap TLS connections (sniffed by their first byte)."""
        if self.tls is not None:
            try:
                request.settimeout(10)
                first = request.recv(1, socket.MSG_PEEK)
                if first and first[0] == _TLS_HANDSHAKE:
                    request = self.tls.wrap_socket(request, server_side=True)
                request.settimeout(None)
            except OSError:  # ssl.SSLError included: a client that rejects our certificate
                request.close()
                return
        super().finish_request(request, client_address)


class RangeServer:
    """``with RangeServer(resolve) as srv: srv.url`` — a threaded server on 127.0.0.1."""

    def __init__(
        self,
        resolve: Resolver,
        *,
        head: Callable[[], str | None] | None = None,
        fault: Callable[[FaultRequest], Fault | None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ):
        self._srv = _Server((host, port), resolve, head, fault, tls)
        self._thread: threading.Thread | None = None

    @classmethod
    def for_local_store(cls, store: Any, **kw: Any) -> RangeServer:
        """Serve a LocalStore read-only (immutable files via sendfile, manifest.json as bytes)."""
        from gc25d_core.cache.stores import MUTABLE_PATHS

        def resolve(rev: str, path: str) -> bytes | Path | None:
            if not store.exists(path, rev):
                return None
            return store.read_bytes(path, rev) if path in MUTABLE_PATHS else store.local_path(path, rev)

        return cls(resolve, head=store.head, **kw)

    @property
    def url(self) -> str:
        host, port = self._srv.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}"

    @property
    def https_url(self) -> str:
        """The same host:port over TLS (only with ``tls``)."""
        if self._srv.tls is None:
            raise StoreError("this server was started without tls")
        return "https" + self.url.removeprefix("http")

    @property
    def log(self) -> list[tuple[Any, ...]]:
        return self._srv.log

    @property
    def seen(self) -> list[SeenRequest]:
        return self._srv.seen

    def set_fault(self, fault: Callable[[FaultRequest], Fault | None] | None) -> None:
        self._srv.fault = fault

    def start(self) -> RangeServer:
        self._thread = threading.Thread(
            target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
