"""The web page in a real headless Chromium (Debian's chromium + chromedriver, selenium) on the
tiny models: frames arrive, they change with the keys held, the per-cell latency is shown, and so
is the action-to-photon latency of the keys pressed (the server's tagged frames put on screen), and
the side-stream decode switch reaches the session, and so does the decoder switch where the session
has the fast decoder.
A failure saves a screenshot under $GC25D_TEST_ARTIFACTS (default: the test's tmp dir)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Collection
from pathlib import Path

import pytest

selenium = pytest.importorskip("selenium")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(session):
    """The page of ``session`` served by uvicorn in a thread; yields its URL."""
    import uvicorn

    from gc25d_core.deploy.web import create_app, server_config

    port = _free_port()
    srv = uvicorn.Server(server_config(create_app(session, host="127.0.0.1", port=port), "127.0.0.1", port))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield f"http://127.0.0.1:{port}/"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def server(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session

    yield from _serve(open_session(tiny_export, deploy_cfg, options=RuntimeOptions(seed=0), device="cpu"))


@pytest.fixture
def fast_server(tiny_export, tmp_path):
    """A session with the fast_decoder asset's file beside the VAE (a random tiny one)."""
    import json

    import torch

    from gc25d_core.deploy.session import open_session
    from gc25d_core.models.fast_decoder import FastDecoder, record_file, save_fast_decoder, weights_file
    from tests.deploy.conftest import tiny_deploy_cfg

    cfg = tiny_deploy_cfg(tmp_path / "fast")
    torch.manual_seed(0)
    digest = save_fast_decoder(FastDecoder(width=8), weights_file(cfg))
    record_file(cfg).write_text(json.dumps({"sha256": digest, "inputs_key": "test"}))
    session = open_session(tiny_export, cfg, device="cpu")
    yield from _serve(session)
    assert session.runtime.options.decoder == "fast"  # the page's switch reached the runtime


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,800",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def _wait(cond, timeout=30.0, what="condition", state=None):
    """``cond()`` once it is truthy; past ``timeout`` an error naming ``what`` and, given
    ``state``, what the page showed then."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"; the page: {state()}" if state else ""))


def _page_state(browser) -> dict[str, object]:
    """The page's status line, switches and note (for a failure's message)."""
    texts = {
        i: browser.find_element("id", i).get_attribute("textContent")
        for i in ("status", "cell", "key", "decoder", "note")
    }
    return {**texts, "fast checked": browser.find_element("id", "fast").is_selected()}


def _screenshot(browser, tmp_path, request) -> None:
    """The page as it was when the test failed, under $GC25D_TEST_ARTIFACTS (default ``tmp_path``)."""
    artifacts = Path(os.environ.get("GC25D_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(artifacts / f"{request.node.name}.png"))


def test_page_plays_frames_that_follow_the_keys(server, browser, tmp_path, request):
    from selenium.webdriver.common.action_chains import ActionChains

    by_id = lambda i: browser.find_element("id", i)  # noqa: E731
    try:
        browser.get(server)
        _wait(lambda: by_id("status").text == "live", what="the WebSocket")
        _wait(lambda: int(by_id("cell").text) >= 2, what="the first cells")
        src = _wait(lambda: by_id("rgb").get_attribute("src"), what="a frame on the page")
        assert src.startswith("data:image/jpeg;base64,")
        assert by_id("ids").get_attribute("src").startswith("data:image/png;base64,")
        assert by_id("key").text == "idle"  # nothing held
        frames: set[str] = set()

        def seen(into: set[str], n: int, minus: Collection[str] = ()) -> bool:
            into.add(by_id("rgb").get_attribute("src"))
            return len(into.difference(minus)) >= n

        # the picture keeps moving (16 fps when the machine keeps up; a loaded CI core is slower)
        _wait(lambda: seen(frames, 3), timeout=20, what="three different frames")

        answered = int(by_id("photon_n").text)  # the page's own first event (keys: none)
        ActionChains(browser).key_down("d").perform()
        _wait(lambda: by_id("key").text == "walk_right", what="the held key to reach the world")
        cell = int(by_id("cell").text)
        shown: set[str] = set()  # frames follow the key: the picture under it moves on
        _wait(lambda: seen(shown, 3, frames), timeout=20, what="three new frames under the key")
        _wait(lambda: int(by_id("cell").text) >= cell + 2, what="cells under the held key")
        _wait(lambda: int(by_id("photon_n").text) > answered, what="the key's tagged frame on screen")
        last, p50 = float(by_id("photon").text), float(by_id("photon_p50").text)
        assert 0 < last < 20_000 and 0 < p50 < 20_000  # ms: the key press to its frame shown
        ActionChains(browser).key_up("d").key_down("j").perform()
        _wait(lambda: by_id("key").text == "light_attack", what="the attack key")
        ActionChains(browser).key_up("j").perform()
        _wait(lambda: by_id("key").text == "idle", what="the keys released")
        _wait(lambda: int(by_id("photon_n").text) >= answered + 3, what="every key event answered")

        latency, denoise, decode = (float(by_id(i).text) for i in ("latency", "denoise", "decode"))
        assert latency > 0 and denoise > 0 and decode > 0 and latency >= denoise
        _wait(lambda: float(by_id("fps").text) > 0, what="the live fps")

        # the side-stream decode switch reaches the session's runtime: a CPU one says why it cannot
        assert by_id("decode_mode").text == "main stream" and not by_id("stream").is_selected()
        by_id("stream").click()
        _wait(lambda: "needs a CUDA device" in by_id("note").text, what="the runtime's answer to the switch")
        assert by_id("decode_mode").text == "main stream"
        # a session with the VAE alone: the page names it and hides the decoder switch
        assert by_id("decoder").get_attribute("textContent") == "vae"
        assert not by_id("decoder_switch").is_displayed()
        assert by_id("status").text == "live"
    except BaseException:
        _screenshot(browser, tmp_path, request)
        raise


def test_the_decoder_switch_shows_where_the_session_has_the_fast_decoder(
    fast_server, browser, tmp_path, request
):
    by_id = lambda i: browser.find_element("id", i)  # noqa: E731
    state = lambda: _page_state(browser)  # noqa: E731
    try:
        browser.get(fast_server)
        _wait(lambda: by_id("status").text == "live", what="the WebSocket", state=state)
        _wait(lambda: by_id("decoder_switch").is_displayed(), what="the decoder switch", state=state)
        assert by_id("decoder").text == "vae" and not by_id("fast").is_selected()
        cell = int(by_id("cell").text)
        by_id("fast").click()
        _wait(lambda: by_id("decoder").text == "fast", what="the runtime's fast decoder", state=state)
        _wait(lambda: int(by_id("cell").text) >= cell + 2, what="cells after the switch", state=state)
        assert by_id("status").text == "live" and not by_id("note").text
    except BaseException:
        _screenshot(browser, tmp_path, request)
        raise
