"""dagster.postgres.yaml against a real PostgreSQL server (.ci/services.sh): a run of the graph and
a sensor tick of the daemon land in its run, event-log and schedule storage."""

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench.common import stop_group
from tests.services import PG_DSN, ensure_service, postgres_up

ROOT = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture
def database():
    """A fresh database on the server, dropped afterwards."""
    ensure_service("postgres", postgres_up)
    import psycopg2

    name = f"gc25d_test_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(**PG_DSN)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def _query(db: str, sql: str) -> list[tuple]:
    import psycopg2

    with contextlib.closing(psycopg2.connect(**{**PG_DSN, "dbname": db})) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_a_run_and_a_sensor_tick_land_in_postgres(tmp_path, database):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.postgres.yaml").read_text())
    (tmp_path / "data").mkdir()  # a data root the user names must exist (config.check_given_roots)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC25D_PRESET": "tiny",
        "GC25D_OVERRIDES": f"paths.runs_root={tmp_path / 'runs'};paths.data_root={tmp_path / 'data'}",
        "GC25D_PG_HOST": PG_DSN["host"],
        "GC25D_PG_PORT": str(PG_DSN["port"]),
        "GC25D_PG_USER": PG_DSN["user"],
        "GC25D_PG_PASSWORD": PG_DSN["password"],
        "GC25D_PG_DB": database,
    }
    env.pop("GC25D_LAUNCHER_CONFIG", None)
    mod = ["-m", "gc25d_pipeline.definitions"]
    run = subprocess.run(
        [str(DAGSTER / "dagster"), "asset", "materialize", *mod, "--select", "text_table"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert _query(database, "SELECT status FROM runs") == [("SUCCESS",)]
    mats = _query(
        database, "SELECT asset_key FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
    )
    assert mats == [('["text_table"]',)]
    # the daemon evaluates cache_snapshot_sensor (running by default) at once; its tick is stored
    daemon = subprocess.Popen(
        [str(DAGSTER / "dagster-daemon"), "run", *mod],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline, ticks = time.monotonic() + 180, []
        while time.monotonic() < deadline and daemon.poll() is None:
            ticks = _query(database, "SELECT selector_id, type, status FROM job_ticks")
            if any(status != "STARTED" for _, _, status in ticks):
                break
            time.sleep(1.0)
        assert ticks, f"no sensor tick in postgres (daemon exit {daemon.poll()})"
        assert {kind for _, kind, _ in ticks} == {"SENSOR"}
        assert any(status in ("SKIPPED", "SUCCESS") for _, _, status in ticks), ticks
    finally:
        stop_group(daemon, 30)
