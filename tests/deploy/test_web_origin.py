"""Who may use the play server: the real app (starlette's TestClient, a real WebSocket handshake) on
the tiny models. A page of another site must not take the single session, neither directly (its
Origin) nor by DNS rebinding (its Host); the served address works; --allow-* admit more."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from gc25d_core.deploy.cli import build_parser, main, serve_app
from gc25d_core.deploy.web import allowed_hosts, create_app

PORT = 8765
SERVED = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def session(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    return open_session(tiny_export, deploy_cfg, options=RuntimeOptions(seed=0), device="cpu")


def _ws_url(client: TestClient) -> str:
    """The WebSocket at the client's address (a relative URL would go to ws://testserver)."""
    return str(client.base_url.copy_with(scheme="ws", path="/ws"))


def _first_cell(client: TestClient, origin: str | None) -> dict:
    headers = {"origin": origin} if origin else {}
    with client.websocket_connect(_ws_url(client), headers=headers) as ws:
        return json.loads(ws.receive_text())


def _refused(client: TestClient, origin: str) -> int:
    with (
        pytest.raises(WebSocketDisconnect) as err,
        client.websocket_connect(_ws_url(client), headers={"origin": origin}),
    ):
        pass
    return err.value.code


def test_the_served_address_plays(session):
    app = create_app(session, host="127.0.0.1", port=PORT)
    for base in (SERVED, f"http://localhost:{PORT}", f"http://[::1]:{PORT}"):
        with TestClient(app, base_url=base) as client:
            assert client.get("/").status_code == 200
            cell = _first_cell(client, origin=base)
            assert cell["type"] == "cell" and cell["cell"] == 0 and cell["frames"]
    with TestClient(app, base_url=SERVED) as client:  # not a browser: no Origin at all
        assert _first_cell(client, origin=None)["type"] == "cell"


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "https://127.0.0.1:8765",  # same host, other scheme
        f"http://127.0.0.1:{PORT + 1}",  # same host, other port: another local site
        "null",  # a sandboxed frame or a file:// page
    ],
)
def test_a_foreign_origin_cannot_open_the_websocket(session, origin):
    app = create_app(session, host="127.0.0.1", port=PORT)
    with TestClient(app, base_url=SERVED) as client:
        assert _refused(client, origin) == 1008


def test_a_foreign_host_gets_400_dns_rebinding_included(session):
    app = create_app(session, host="127.0.0.1", port=PORT)
    rebound = f"http://evil.example:{PORT}"  # evil.example resolved to 127.0.0.1 by its owner
    with TestClient(app, base_url=rebound) as client:
        page = client.get("/")
        assert page.status_code == 400 and "Invalid host header" in page.text
        with (
            pytest.raises(WebSocketDenialResponse) as err,
            client.websocket_connect(_ws_url(client), headers={"origin": rebound}),
        ):
            pass
        assert err.value.status_code == 400


def test_allow_options_admit_the_named_proxy(session):
    proxy = "https://play.example.com"
    argv = ["serve", "--port", str(PORT), "--allow-host", "play.example.com", "--allow-origin", proxy]
    with TestClient(serve_app(build_parser().parse_args(argv), session), base_url=proxy) as client:
        assert client.get("/").status_code == 200
        assert _first_cell(client, origin=proxy)["type"] == "cell"
        assert _refused(client, "https://evil.example") == 1008  # the others stay out
    # without the options the same requests are refused
    plain = serve_app(build_parser().parse_args(["serve", "--port", str(PORT)]), session)
    with TestClient(plain, base_url=proxy) as client:
        assert client.get("/").status_code == 400
    with TestClient(plain, base_url=SERVED) as client:
        assert _refused(client, proxy) == 1008


def test_a_wildcard_bind_answers_to_the_machine_names_only():
    import socket

    hosts = allowed_hosts("0.0.0.0")
    assert {"127.0.0.1", "localhost", "[::1]", socket.gethostname().lower()} <= set(hosts)
    assert "0.0.0.0" not in hosts and "evil.example" not in hosts


@pytest.mark.parametrize(
    ("flag", "value"), [("--allow-origin", "evil.example"), ("--allow-host", "a b"), ("--allow-host", "*x")]
)
def test_a_malformed_allow_value_fails_before_loading_anything(tmp_path, capsys, flag, value):
    argv = ["serve", flag, value, "--set", f"paths.runs_root={tmp_path / 'runs'}", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {value!r}" in err, err  # not "no export found": nothing was loaded
