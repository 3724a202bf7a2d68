"""Action-to-photon tags of the play server (starlette's TestClient, a real WebSocket, the tiny
models): each key event the page numbers is answered by the first frame of the first cell whose
action block was taken after the event arrived, and only by that one."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from gc25d_core.deploy.web import create_app, event_id

PORT = 8765
SERVED = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def session(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    return open_session(tiny_export, deploy_cfg, options=RuntimeOptions(seed=0), device="cpu")


def _until_ack(ws, event: int, cells: int = 8) -> tuple[list[dict], dict]:
    """Messages up to (not including) the one whose acks name ``event``, and that one."""
    before = []
    for _ in range(cells):
        m = json.loads(ws.receive_text())
        if any(a["event"] == event for a in m["acks"]):
            return before, m
        before.append(m)
    raise AssertionError(f"no frame answered key event {event} within {cells} cells")


def test_the_first_frame_reflecting_a_key_event_carries_its_number(session):
    app = create_app(session, host="127.0.0.1", port=PORT)
    with (
        TestClient(app, base_url=SERVED) as client,
        client.websocket_connect(f"ws://127.0.0.1:{PORT}/ws", headers={"origin": SERVED}) as ws,
    ):
        anchor = json.loads(ws.receive_text())
        assert anchor["cell"] == 0 and anchor["acks"] == [] and len(anchor["frames"]) == 1
        first = json.loads(ws.receive_text())  # taken before any key event
        assert first["key"] == "idle" and first["acks"] == []

        ws.send_text(json.dumps({"keys": ["d"], "id": 1}))
        before, tagged = _until_ack(ws, 1)
        assert all(m["key"] == "idle" and m["acks"] == [] for m in before)  # taken before it arrived
        assert tagged["key"] == "walk_right"  # the frame reflects the key
        assert tagged["acks"] == [{"frame": 0, "event": 1}] and len(tagged["frames"]) == 4
        after = json.loads(ws.receive_text())
        assert after["key"] == "walk_right" and after["acks"] == []  # answered once

        # two events close together: the newest is answered by a frame under its keys; an
        # earlier one is answered by its own frame or by the same one
        ws.send_text(json.dumps({"keys": [], "id": 2}))
        ws.send_text(json.dumps({"keys": ["j"], "id": 3}))
        before, tagged = _until_ack(ws, 3)
        assert tagged["key"] == "light_attack" and tagged["acks"][-1] == {"frame": 0, "event": 3}
        assert all(a["event"] == 2 for m in before for a in m["acks"])


def test_event_numbers_are_positive_ints():
    assert event_id({"id": 7}) == 7
    assert event_id({"keys": []}) is None
    assert event_id({"id": True}) is None and event_id({"id": "3"}) is None and event_id({"id": 0}) is None


def test_the_pages_side_stream_switch_reaches_the_runtime(session):
    """The page's switch ({"decode_stream": bool}) is applied to the session's runtime between
    cells; a CPU session cannot decode on a second stream, so its next message says why and every
    message reports the decode still on the main stream. A switch message leaves the held keys."""
    app = create_app(session, host="127.0.0.1", port=PORT)
    with (
        TestClient(app, base_url=SERVED) as client,
        client.websocket_connect(f"ws://127.0.0.1:{PORT}/ws", headers={"origin": SERVED}) as ws,
    ):
        anchor = json.loads(ws.receive_text())
        assert anchor["decode_stream"] is False
        ws.send_text(json.dumps({"keys": ["d"], "id": 1}))
        _until_ack(ws, 1)
        ws.send_text(json.dumps({"decode_stream": True}))
        for _ in range(8):
            m = json.loads(ws.receive_text())
            assert m["decode_stream"] is False and m["key"] == "walk_right"
            if "note" in m:
                break
        else:
            raise AssertionError("the switch never reached the runtime")
        assert "decode_stream needs a CUDA device" in m["note"]
        assert not session.runtime.options.decode_stream
        nxt = json.loads(ws.receive_text())
        assert "note" not in nxt and nxt["key"] == "walk_right"  # said once


def test_the_pages_decoder_switch_reaches_the_runtime(session):
    """Every message names the decoder and the decoders the session has (the page shows its switch
    only where there are two); a switch to one it lacks comes back once as a note, the session
    decoding on with the VAE (the switch itself: tests/deploy/test_fast_decoder_deploy.py)."""
    app = create_app(session, host="127.0.0.1", port=PORT)
    with (
        TestClient(app, base_url=SERVED) as client,
        client.websocket_connect(f"ws://127.0.0.1:{PORT}/ws", headers={"origin": SERVED}) as ws,
    ):
        anchor = json.loads(ws.receive_text())
        assert anchor["decoder"] == "vae" and anchor["decoders"] == ["vae"]
        ws.send_text(json.dumps({"decoder": "fast"}))
        for _ in range(8):
            m = json.loads(ws.receive_text())
            assert m["decoder"] == "vae"
            if "note" in m:
                break
        else:
            raise AssertionError("the switch never reached the runtime")
        assert "no 'fast' decoder in this session" in m["note"]
        assert "note" not in json.loads(ws.receive_text())  # said once


def test_serve_sends_cells_without_per_message_deflate(session):
    """``serve``'s uvicorn settings (``web.server_config``) turn the WebSocket's per-message deflate
    off: a client that offers it (browsers and ``websockets`` do) gets the cells uncompressed."""
    import threading

    import uvicorn
    from websockets.sync.client import connect

    from gc25d_core.deploy.web import server_config
    from tests.launch_helpers import free_port, wait_for

    port = free_port()
    server = uvicorn.Server(
        server_config(create_app(session, host="127.0.0.1", port=port), "127.0.0.1", port)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("the server", lambda: server.started, timeout_s=20, every_s=0.05)
        with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
            assert "permessage-deflate" in (ws.request.headers.get("Sec-WebSocket-Extensions") or "")
            assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
            assert json.loads(ws.recv())["cell"] == 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
