"""The UI flow in a real browser: `dg dev` (webserver + daemon) on the embedded default and headless
Chromium (Debian's chromium + chromium-driver, driven by selenium).

- the Lineage page draws a node for every asset of the code location;
- "Materialize" on text_table's page launches a run that the daemon dequeues and runs to success;
- cache_snapshot_sensor, on a snapshot published before the daemon started, adds its partition and
  requests its verification run (run_key = snapshot id).

On failure a screenshot, the page's HTML and the server's log are written to $GC25D_UI_ARTIFACTS
(default artifacts/ui/ in the repository; CI keeps that folder). Skipped when chromium or chromedriver
is missing, unless GC25D_REQUIRE_BROWSER=1 (CI sets it: there the test must run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from gc25d_pipeline.defs.cache.assets import training_cache
from gc25d_pipeline.lib.project import Gc25dProject
from tests.launch_helpers import free_port, wait_for

from ..test_cache_pipeline import _write_clips

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("GC25D_UI_ARTIFACTS", ROOT / "artifacts" / "ui"))

pytestmark = pytest.mark.slow

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    if os.environ.get("GC25D_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"GC25D_REQUIRE_BROWSER=1 but {CHROMIUM} or {CHROMEDRIVER} is missing")
    pytest.skip("needs Debian's chromium and chromium-driver", allow_module_level=True)


@dataclass
class Server:
    url: str
    home: Path
    log: Path

    def graphql(self, query: str) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())["data"]


def _default_signals() -> None:
    # a parent started in the background may ignore SIGINT / SIGTERM; dagster dev must not
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    (root / "data").mkdir()  # a data root the user names must exist (config.check_given_roots)
    overrides = [
        f"paths.data_root={root / 'data'}",
        f"paths.runs_root={root / 'runs'}",
        f"raw.root={root / 'raw'}",
        f"cache.store={root / 'cache'}",
        "cache.samples_per_shard=2",
    ]
    # a published snapshot before the daemon's first sensor tick (processed clips, no raw data)
    project = Gc25dProject(preset="tiny", overrides=overrides)
    _write_clips(project.config(), {"R10_s1512": "val", "R10_s2024": "train"})
    training_cache(dg.build_asset_context(), project=project)
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC25D_PRESET": "tiny",
        "GC25D_OVERRIDES": ";".join(overrides),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    log = root / "dg_dev.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dg"), "dev", "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole below
            preexec_fn=_default_signals,
        )
    srv = Server(f"http://127.0.0.1:{port}", home, log)
    try:
        wait_for(
            "the webserver",
            lambda: proc.poll() is None and urllib.request.urlopen(f"{srv.url}/server_info", timeout=5),
            timeout_s=90,
        )
        yield srv
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to dg dev's process group (it shuts its webserver, daemon and code servers down), then
    SIGKILL to whatever of that group is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1600,1000")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        driver.get(server.url)
        # the "join the community" dialog covers the page on a first visit
        driver.execute_script("window.localStorage.setItem('communityNux', '1')")
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def evidence(request, server: Server, browser: Any) -> Iterator[None]:
    """On failure: <test>.png (screenshot), <test>.html (the page) and dg_dev.log in ARTIFACTS."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = request.node.name
        browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))
        (ARTIFACTS / f"{name}.html").write_text(browser.page_source)
        shutil.copy(server.log, ARTIFACTS / "dg_dev.log")
        print(f"UI evidence of {name} in {ARTIFACTS}", file=sys.stderr)


def _asset_names() -> set[str]:
    from gc25d_pipeline.definitions import defs

    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def test_lineage_draws_every_asset(server: Server, browser: Any, evidence: None):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(f"{server.url}/asset-groups")
    wait_for("the lineage graph", lambda: browser.find_elements(By.CSS_SELECTOR, "svg foreignObject"), 60)
    # groups start collapsed; the graph's own shortcut (Alt+E) expands them all
    ActionChains(browser).key_down(Keys.ALT).send_keys("e").key_up(Keys.ALT).perform()
    expected = _asset_names()

    def drawn() -> set[str]:
        return {e.text.strip() for e in browser.find_elements(By.CSS_SELECTOR, "svg foreignObject")}

    missing = wait_for("every asset node", lambda: not (expected - drawn()), 30) and expected - drawn()
    assert not missing, f"not drawn: {sorted(missing)}"


def test_materialize_button_runs_text_table_to_success(server: Server, browser: Any, evidence: None):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def runs() -> dict[str, str]:
        data = server.graphql("{ runsOrError(limit: 50) { ... on Runs { results { runId status } } } }")
        return {r["runId"]: r["status"] for r in data["runsOrError"]["results"]}

    before = runs()
    browser.get(f"{server.url}/assets/text_table")
    button = "//button[normalize-space()='Materialize']"
    # the page re-renders as its queries come in: find and click in one poll
    wait_for("a click on Materialize", lambda: browser.find_element(By.XPATH, button).click() or True, 60)
    (run_id,) = wait_for("the launched run", lambda: set(runs()) - set(before), 30)

    def status() -> str | None:
        state = runs().get(run_id)
        return state if state in ("SUCCESS", "FAILURE", "CANCELED") else None

    assert wait_for(f"run {run_id}", status, timeout_s=90, every_s=1) == "SUCCESS"
    # and the page shows the materialization the run recorded
    browser.get(f"{server.url}/assets/text_table")
    WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.XPATH, "//*[text()='sha256']")))


def test_snapshot_sensor_adds_the_partition_and_requests_its_run(
    server: Server, browser: Any, evidence: None
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def requested() -> list[dict[str, Any]]:
        runs = server.graphql(
            '{ runsOrError(filter: {tags: [{key: "dagster/partition", value: "v000001"}]}) '
            "{ ... on Runs { results { runId jobName tags { key value } } } } }"
        )
        return runs["runsOrError"]["results"]

    (run,) = wait_for("the sensor's run request", requested, timeout_s=90, every_s=1)
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert run["jobName"] == "cache_snapshot_job"
    assert tags["dagster/sensor_name"] == "cache_snapshot_sensor" and tags["dagster/run_key"] == "v000001"
    # the partition it added, as the asset's Partitions tab lists it
    browser.get(f"{server.url}/assets/cache_snapshot?view=partitions")
    WebDriverWait(browser, 60).until(ec.presence_of_element_located((By.XPATH, "//*[text()='v000001']")))
