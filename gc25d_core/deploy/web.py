"""The local web page of a live session (starlette + uvicorn; no dagster here).

``GET /`` is the page; ``/ws`` a WebSocket: the page sends ``{"keys": [...], "id": n}`` whenever
the held keys change (``actions.keys_to_block``; ``id`` numbers the key events, increasing), the
server starts a session per connection and sends one JSON message per cell: its frames (JPEG) and
ids (colour-coded PNG) as base64, the prompt key, the cell's times (world, denoise, commit, decode,
total), ``decode_stream`` (whether the side-stream decode is on; the page's switch sends
``{"decode_stream": true|false}``, applied between cells — a session that cannot adds ``note``:
why), ``decoder`` and ``decoders`` (the one decoding, and those the session has: the page offers
the switch ``{"decoder": "fast"|"vae"}`` where it has both) and ``acks``: ``[{"frame": i, "event": n}]`` where frame ``i`` of the message is the first
frame that reflects key event ``n`` (and every event before it) — the first frame of the first
cell whose action block was taken after the event arrived (with the side-stream decode that cell's
frames come one message later, and the tag travels with them). The server sends at the content
rate (one cell per 0.25 s at most: 4 frames at 16 fps); the page plays through a small jitter
buffer (starts after 2 frames, holds on underrun, drops the oldest past 12) and shows the live
fps, the per-cell latency (denoise and decode apart) and the action-to-photon latency: from the
key event to the moment its tagged frame is put on the screen (the last one and the p50 of the
last 50). One session runs at a time (one model).

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
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from socket import AF_INET, AF_INET6, getfqdn, gethostname
from typing import Any

import cv2
import numpy as np

from gc25d_core.deploy.actions import keys_to_block
from gc25d_core.preview import colorize_ids

CELL_S = 0.25  # 4 frames at 16 fps
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")
_HOST = re.compile(r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?|\[[0-9a-f:.]+\]")
_ORIGIN = re.compile(r"(https?)://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::(\d{1,5}))?")


# the ids' colours as a BGR lookup table: cv2.LUT colours a frame without holding the GIL
_IDS_LUT_BGR = np.ascontiguousarray(colorize_ids(np.arange(256, dtype=np.uint8))[:, ::-1]).reshape(1, 256, 3)
# a cell's 8 images (4 frames, 4 ids) are encoded at once: the encode sits between the cell's
# frames and the page, so it is on every key press's path to the screen (cv2 releases the GIL)
_ENCODERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gc25d-encode")


def _jpeg(rgb: np.ndarray) -> str:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


def _ids_png(ids: np.ndarray) -> str:
    """uint8 ids [H, W] -> their colours (``preview.colorize_ids``) as PNG, base64."""
    bgr = cv2.LUT(cv2.merge([np.ascontiguousarray(ids)] * 3), _IDS_LUT_BGR)
    ok, buf = cv2.imencode(".png", bgr)
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


def cell_message(
    cell: int,
    key: str,
    clips: list[tuple[np.ndarray, np.ndarray, int | None]],
    times: dict[str, float],
    **extra: Any,
) -> str:
    """One message: the decoded ``clips`` in order, each (frames RGB uint8 [T, H, W, 3], the ids
    of its cell [>= T, H, W], the key event its first frame is the first to reflect, or None);
    ``extra``: more fields (the session's state, e.g. ``decode_stream``)."""
    frames: list[Future[str]] = []
    ids: list[Future[str]] = []
    acks: list[dict[str, int]] = []
    for rgb, cell_ids, event in clips:
        if event is not None:
            acks.append({"frame": len(frames), "event": event})
        frames += [_ENCODERS.submit(_jpeg, f) for f in rgb]
        ids += [_ENCODERS.submit(_ids_png, i) for i in cell_ids[-len(rgb) :]]
    return json.dumps(
        {
            "type": "cell",
            "cell": cell,
            "key": key,
            "frames": [f.result() for f in frames],
            "ids": [i.result() for i in ids],
            "acks": acks,
            "times": times,
            **extra,
        }
    )


def server_config(app: Any, host: str, port: int) -> Any:
    """uvicorn's settings for the page. No per-message deflate: a cell's message is about a
    megabyte of base64 JPEG / PNG that deflate shrinks only by the base64 overhead, for tens of
    milliseconds of zlib on each side (2.2 MB: 0.21 s at level 6 on one core here), all of it on
    every key's way to the screen."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", ws_per_message_deflate=False)


def apply_switch(current: Any, wanted: Any, apply: Callable[[Any], None]) -> str | None:
    """A page switch applied to the session between cells (``wanted`` None: not touched); None, or
    why the session cannot (e.g. no CUDA device for the side-stream decode, no fast decoder)."""
    if wanted is None or wanted == current:
        return None
    try:
        apply(wanted)
    except ValueError as e:
        return str(e)
    return None


def event_id(msg: dict[str, Any]) -> int | None:
    """The key event number a page message carries (a positive int), else None."""
    n = msg.get("id")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>gc25d live</title>
<style>
 body { font: 14px sans-serif; background: #111; color: #ddd; margin: 16px; }
 .views { display: flex; gap: 12px; } img { image-rendering: pixelated; width: 512px; background: #000; }
 .stats span { display: inline-block; min-width: 120px; } kbd { background: #333; padding: 0 4px; }
 .stats span[hidden] { display: none; }
</style></head>
<body>
<div class="views"><div><div>picture</div><img id="rgb" alt="rgb"></div>
<div><div>ids</div><img id="ids" alt="ids"></div></div>
<div class="stats">
 <span>status <b id="status">connecting</b></span> <span>cell <b id="cell">0</b></span>
 <span>action <b id="key">-</b></span> <span>fps <b id="fps">0</b></span>
 <span>latency <b id="latency">-</b> ms</span> <span>denoise <b id="denoise">-</b> ms</span>
 <span>decode <b id="decode">-</b> ms</span> <span>buffer <b id="buffer">0</b></span>
 <span>key&rarr;photon last <b id="photon">-</b> ms</span> <span>p50 <b id="photon_p50">-</b> ms</span>
 <span>over <b id="photon_n">0</b> keys</span>
 <span><label><input type="checkbox" id="stream"> side-stream decode</label> (now <b id="decode_mode">-</b>)</span>
 <span id="decoder_switch" hidden><label><input type="checkbox" id="fast"> fast decoder</label> (now <b id="decoder">-</b>)</span>
 <span id="note"></span>
</div>
<p><kbd>W</kbd><kbd>A</kbd><kbd>S</kbd><kbd>D</kbd> move, <kbd>Shift</kbd> run, <kbd>J</kbd>/<kbd>K</kbd> light/heavy
attack, <kbd>L</kbd> dodge, <kbd>Space</kbd> jump, <kbd>G</kbd> guard.</p>
<script>
const held = new Set(); const queue = []; let playing = false, shown = 0, fps = 0, lastTick = performance.now();
const $ = (id) => document.getElementById(id);
const ws = new WebSocket(`ws://${location.host}/ws`);
// key events: numbered; the server tags the first frame that reflects each (m.acks)
let nextEvent = 0, answered = 0; const sentAt = new Map(); const photon = [];
const send = () => {
  if (ws.readyState !== 1) return;
  nextEvent += 1; sentAt.set(nextEvent, performance.now());
  ws.send(JSON.stringify({keys: [...held], id: nextEvent}));
};
const onScreen = (event) => {  // the tagged frame is shown now: every event up to it is answered
  const now = performance.now();
  for (const [n, t] of sentAt) if (n <= event) { photon.push(now - t); sentAt.delete(n); answered += 1; }
  while (photon.length > 50) photon.shift();
  if (!photon.length) return;
  const s = [...photon].sort((a, b) => a - b);
  $("photon").textContent = photon[photon.length - 1].toFixed(0);
  $("photon_p50").textContent = s[Math.floor((s.length - 1) / 2)].toFixed(0);
  $("photon_n").textContent = answered;
};
ws.onopen = () => { $("status").textContent = "live"; send(); };
// the side-stream decode (frames one cell later, the next cell's denoise overlapping the decode)
let switched = false;
$("stream").addEventListener("change", () => {
  switched = true;
  if (ws.readyState === 1) ws.send(JSON.stringify({decode_stream: $("stream").checked}));
});
// the decoder: the VAE's, or the fast decoder the project distils from it (where the session has it)
let picked = false;
$("fast").addEventListener("change", () => {
  picked = true;
  if (ws.readyState === 1) ws.send(JSON.stringify({decoder: $("fast").checked ? "fast" : "vae"}));
});
ws.onclose = () => { $("status").textContent = "closed"; };
ws.onmessage = (ev) => {
  const m = JSON.parse(ev.data);
  if (m.type === "error") { $("status").textContent = "error: " + m.error; return; }
  const tags = new Map((m.acks || []).map((a) => [a.frame, a.event]));
  for (let i = 0; i < m.frames.length; i++) queue.push([m.frames[i], m.ids[i], tags.get(i)]);
  while (queue.length > 12) {  // overlap: drop the oldest (its tag moves to the next frame)
    const [, , tag] = queue.shift();
    if (tag !== undefined) queue[0][2] = Math.max(tag, queue[0][2] ?? 0);
  }
  $("cell").textContent = m.cell; $("key").textContent = m.key;
  if (m.decode_stream !== undefined) {
    if (!switched) $("stream").checked = m.decode_stream;  // the server's state until the user switches
    $("decode_mode").textContent = m.decode_stream ? "side stream" : "main stream";
  }
  if (m.decoder !== undefined) {
    $("decoder_switch").hidden = !(m.decoders || []).includes("fast");
    if (!picked) $("fast").checked = m.decoder === "fast";
    $("decoder").textContent = m.decoder;
  }
  if (m.note) $("note").textContent = m.note;
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
    const [rgb, ids, tag] = queue.shift();
    $("rgb").src = "data:image/jpeg;base64," + rgb;
    if (ids) $("ids").src = "data:image/png;base64," + ids;
    if (tag !== undefined) onScreen(tag);
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
            received = 0  # the newest key event number received
            arrived = 0.0  # when it arrived
            stream: bool | None = None  # the page's side-stream decode switch, once touched
            decoder: str | None = None  # the page's decoder switch, once touched

            async def receive() -> None:
                nonlocal held, received, arrived, stream, decoder
                while True:
                    msg = json.loads(await socket.receive_text())
                    if "keys" in msg:
                        held = [str(k) for k in msg.get("keys", [])][:16]
                        if (event_id(msg) or 0) > received:
                            received, arrived = event_id(msg) or 0, time.perf_counter()
                    if isinstance(msg.get("decode_stream"), bool):
                        stream = msg["decode_stream"]
                    if isinstance(msg.get("decoder"), str):
                        decoder = msg["decoder"][:16]

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
                # cells whose frames are still to come, in order: (the key event the cell is the
                # first to reflect, its ids) — the side-stream decode hands frames out a cell late
                waiting: deque[tuple[int | None, Any]] = deque([(None, lambda: session.ids0)])

                def message(
                    cell: int, key: str, clips: list[np.ndarray], times: dict[str, float], **extra: Any
                ) -> str:
                    tagged = []
                    for rgb in clips:
                        event, ids = waiting.popleft()
                        tagged.append((rgb, ids(), event))
                    rt = session.runtime
                    state = {
                        "decode_stream": rt.options.decode_stream,
                        "decoder": rt.options.decoder,
                        "decoders": sorted(rt.decoders),
                    }
                    return cell_message(cell, key, tagged, times, **state, **extra)

                def step(
                    block: np.ndarray, stream: bool | None, decoder: str | None
                ) -> tuple[Any, str | None]:
                    # between cells, in the cells' thread
                    rt = session.runtime
                    notes = [
                        apply_switch(rt.options.decode_stream, stream, rt.set_decode_stream),
                        apply_switch(rt.options.decoder, decoder, rt.set_decoder),
                    ]
                    return session.step(block), "; ".join(n for n in notes if n) or None

                text = await asyncio.to_thread(message, 0, "anchor", frames0, zero)
                await socket.send_text(text)
                next_at = time.perf_counter()
                taken = 0
                encoded = 0.0
                while not reader.done():
                    block = keys_to_block(held)
                    t_take = time.perf_counter()
                    event, taken = (received if received > taken else None), received
                    queued = t_take - arrived if event is not None else None
                    out, note = await asyncio.to_thread(step, block, stream, decoder)
                    if note:  # said once; the switches stay where the session is
                        stream = decoder = None
                    waiting.append((event, lambda out=out: out.ids))
                    t_frames = time.perf_counter()
                    # where a key's way to the screen goes, server side: queued (its arrival to its
                    # block's take), step (the take to the frames on the host), encode_prev (the
                    # previous message's encode: this one's is not done while it is built)
                    times = {**out.out.times.as_dict(), "step": t_frames - t_take, "encode_prev": encoded}
                    if queued is not None:
                        times["queued"] = queued
                    text = await asyncio.to_thread(
                        message,
                        out.cell,
                        out.key,
                        out.out.frames,
                        times,
                        **({"note": note} if note else {}),
                    )
                    encoded = time.perf_counter() - t_frames
                    await socket.send_text(text)
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
