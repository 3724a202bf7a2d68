"""The local web page of a live session (starlette + uvicorn; no dagster here).

``GET /`` is the page; ``/ws`` a WebSocket: the page sends ``{"keys": [...]}`` whenever the held
keys change (``actions.keys_to_block``), the server starts a session per connection and sends one
JSON message per cell: its frames (JPEG) and ids (colour-coded PNG) as base64, the prompt key, and
the cell's times (world, denoise, commit, decode, total). The server sends at the content rate
(one cell per 0.25 s at most: 4 frames at 16 fps); the page plays through a small jitter buffer
(starts after 2 frames, holds on underrun, drops the oldest past 12) and shows the live fps and
the per-cell latency, denoise and decode apart. One session runs at a time (one model).

Who may connect: the page is served to browsers, and a browser lets any site it visits open a
WebSocket to ``127.0.0.1`` (and, by DNS rebinding, send any request there under a name of its
choosing). So the ``Host`` of every request must name the served address (for a loopback bind:
``127.0.0.1``, ``localhost`` or ``[::1]``; for a wildcard bind: this machine's names and addresses),
else 400; and a WebSocket whose ``Origin`` is not ``http://<allowed host>:<port>`` is refused (403)
before it can take the session. A handshake without ``Origin`` (not a browser) is let through:
browsers always send one. ``allow_hosts`` / ``allow_origins`` (``serve --allow-host`` /
``--allow-origin``) admit more, e.g. behind a reverse proxy; ``*`` turns a check off.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import re
import time
from collections.abc import Iterable
from socket import AF_INET, AF_INET6, getfqdn, gethostname
from typing import Any

import cv2
import numpy as np

from gc25d_core.deploy.actions import keys_to_block
from gc25d_core.preview import colorize_ids, png_bytes

CELL_S = 0.25  # 4 frames at 16 fps
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")
_HOST = re.compile(r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?|\[[0-9a-f:.]+\]")
_ORIGIN = re.compile(r"(https?)://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::(\d{1,5}))?")


def _jpeg(rgb: np.ndarray) -> str:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


def _png(rgb: np.ndarray) -> str:
    return base64.b64encode(png_bytes(rgb)).decode()


def cell_message(
    cell: int, key: str, frames: list[np.ndarray], ids: np.ndarray, times: dict[str, float]
) -> str:
    rgb = [f for clip in frames for f in clip]
    return json.dumps(
        {
            "type": "cell",
            "cell": cell,
            "key": key,
            "frames": [_jpeg(f) for f in rgb],
            "ids": [_png(colorize_ids(i)) for i in ids[-len(rgb) :]] if rgb else [],
            "times": times,
        }
    )


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>gc25d live</title>
<style>
 body { font: 14px sans-serif; background: #111; color: #ddd; margin: 16px; }
 .views { display: flex; gap: 12px; } img { image-rendering: pixelated; width: 512px; background: #000; }
 .stats span { display: inline-block; min-width: 120px; } kbd { background: #333; padding: 0 4px; }
</style></head>
<body>
<div class="views"><div><div>picture</div><img id="rgb" alt="rgb"></div>
<div><div>ids</div><img id="ids" alt="ids"></div></div>
<div class="stats">
 <span>status <b id="status">connecting</b></span> <span>cell <b id="cell">0</b></span>
 <span>action <b id="key">-</b></span> <span>fps <b id="fps">0</b></span>
 <span>latency <b id="latency">-</b> ms</span> <span>denoise <b id="denoise">-</b> ms</span>
 <span>decode <b id="decode">-</b> ms</span> <span>buffer <b id="buffer">0</b></span>
</div>
<p><kbd>W</kbd><kbd>A</kbd><kbd>S</kbd><kbd>D</kbd> move, <kbd>Shift</kbd> run, <kbd>J</kbd>/<kbd>K</kbd> light/heavy
attack, <kbd>L</kbd> dodge, <kbd>Space</kbd> jump, <kbd>G</kbd> guard.</p>
<script>
const held = new Set(); const queue = []; let playing = false, shown = 0, fps = 0, lastTick = performance.now();
const $ = (id) => document.getElementById(id);
const ws = new WebSocket(`ws://${location.host}/ws`);
const send = () => { if (ws.readyState === 1) ws.send(JSON.stringify({keys: [...held]})); };
ws.onopen = () => { $("status").textContent = "live"; send(); };
ws.onclose = () => { $("status").textContent = "closed"; };
ws.onmessage = (ev) => {
  const m = JSON.parse(ev.data);
  if (m.type === "error") { $("status").textContent = "error: " + m.error; return; }
  for (let i = 0; i < m.frames.length; i++) queue.push([m.frames[i], m.ids[i]]);
  while (queue.length > 12) queue.shift();  // overlap: drop the oldest
  $("cell").textContent = m.cell; $("key").textContent = m.key;
  const t = m.times;
  $("latency").textContent = (1000 * t.total).toFixed(1);
  $("denoise").textContent = (1000 * (t.denoise + t.commit)).toFixed(1);
  $("decode").textContent = (1000 * t.decode).toFixed(1);
};
const norm = (k) => (k === " " ? " " : k.toLowerCase());
document.addEventListener("keydown", (e) => { const k = norm(e.key); if (!held.has(k)) { held.add(k); send(); } });
document.addEventListener("keyup", (e) => { held.delete(norm(e.key)); send(); });
window.addEventListener("blur", () => { held.clear(); send(); });
setInterval(() => {  // 16 fps through the jitter buffer
  const now = performance.now();
  if (!playing && queue.length >= 2) playing = true;
  if (playing && queue.length) {
    const [rgb, ids] = queue.shift();
    $("rgb").src = "data:image/jpeg;base64," + rgb;
    if (ids) $("ids").src = "data:image/png;base64," + ids;
    shown += 1;
  } else if (playing && !queue.length) { /* underrun: hold the last frame */ }
  if (now - lastTick >= 1000) { fps = shown * 1000 / (now - lastTick); shown = 0; lastTick = now;
    $("fps").textContent = fps.toFixed(1); }
  $("buffer").textContent = queue.length;
}, 62.5);
</script></body></html>
"""


def host_name(host: str) -> str:
    """``host`` as a Host header names it: lowercase, an IPv6 address in brackets."""
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _machine_names() -> set[str]:
    """What a client may call this machine by when the server listens on every interface."""
    import psutil

    names = {gethostname(), getfqdn()}
    for addrs in psutil.net_if_addrs().values():
        names |= {a.address for a in addrs if a.family in (AF_INET, AF_INET6)}
    return {host_name(n) for n in names if n and "%" not in n}  # no scoped link-local addresses


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> list[str]:
    """Host names a request may carry for a server bound to ``bound``, plus ``extra`` (validated)."""
    bound = bound.strip().lower()
    if bound in WILDCARD_BINDS:
        names = set(LOOPBACK_HOSTS) | _machine_names()
    else:
        names = {host_name(bound)} | (set(LOOPBACK_HOSTS) if _is_loopback(bound) else set())
    for host in extra:
        name = host_name(host)
        if not _HOST.fullmatch(name):
            raise ValueError(f"--allow-host {host!r}: expected a host name, an IP address, *.domain or *")
        names.add(name)
    return sorted(names)


def allowed_origins(hosts: Iterable[str], port: int, extra: Iterable[str] = ()) -> set[str]:
    """``http://<host>:<port>`` of every exact allowed host (a browser omits port 80), plus ``extra``."""
    origins = set()
    for host in hosts:
        if "*" not in host:
            origins.add(f"http://{host}:{port}")
            if port == 80:
                origins.add(f"http://{host}")
    for origin in extra:
        normal = origin.strip().lower().rstrip("/")
        if normal != "*" and not _ORIGIN.fullmatch(normal):
            raise ValueError(f"--allow-origin {origin!r}: expected scheme://host[:port] (or *)")
        origins.add(normal)
    return origins


def create_app(
    session: Any,
    *,
    host: str,
    port: int,
    allow_hosts: Iterable[str] = (),
    allow_origins: Iterable[str] = (),
):
    """The starlette app serving ``session`` (a ``session.LiveSession``) at ``host``:``port``,
    answering only requests addressed to it (see the module's docstring)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import HTMLResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    hosts = allowed_hosts(host, allow_hosts)
    origins = allowed_origins(hosts, port, allow_origins)
    lock = asyncio.Lock()

    async def page(request: Any) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def ws(socket: WebSocket) -> None:
        origin = socket.headers.get("origin")
        if origin is not None and "*" not in origins and origin.lower().rstrip("/") not in origins:
            await socket.close(code=1008, reason="origin not allowed")  # before accept: HTTP 403
            return
        await socket.accept()
        if lock.locked():
            await socket.send_text(json.dumps({"type": "error", "error": "another session is running"}))
            await socket.close()
            return
        async with lock:
            held: list[str] = []

            async def receive() -> None:
                nonlocal held
                while True:
                    msg = json.loads(await socket.receive_text())
                    held = [str(k) for k in msg.get("keys", [])][:16]

            reader = asyncio.create_task(receive())
            try:
                t0 = time.perf_counter()
                frames0 = await asyncio.to_thread(session.start)
                zero = {
                    "world": 0.0,
                    "denoise": 0.0,
                    "commit": 0.0,
                    "decode": 0.0,
                    "total": time.perf_counter() - t0,
                }
                await socket.send_text(cell_message(0, "anchor", frames0, session.ids0, zero))
                next_at = time.perf_counter()
                while not reader.done():
                    block = keys_to_block(held)
                    out = await asyncio.to_thread(session.step, block)
                    await socket.send_text(
                        cell_message(out.cell, out.key, out.out.frames, out.ids, out.out.times.as_dict())
                    )
                    next_at = max(next_at + CELL_S, time.perf_counter() - CELL_S)  # content rate
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            except (WebSocketDisconnect, RuntimeError):  # the page went away mid-send
                pass
            finally:
                reader.cancel()

    return Starlette(
        routes=[Route("/", page), WebSocketRoute("/ws", ws)],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False)],
    )
