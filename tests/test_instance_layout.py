"""The instance files and the Makefile's Dagster commands: dagster.yaml at the top level is the
embedded default, used in place, and `make dev` / `make validate` print neither dg's venv-mismatch
warning nor dagster dev's "a dagster.yaml in the current folder is ignored" warning.

The Makefile runs in a copy of the project's top-level files (packages linked, not copied) whose
``.venv`` is a real folder, as in a fresh clone, so that neither the repo's own instance state nor a
``.venv`` symlink (as in a git worktree) decides the outcome.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.common import stop_group

ROOT = Path(__file__).resolve().parent.parent
VENV_MISMATCH = "does not match the virtual environment"
SHADOWED = "Found a dagster instance configuration"
NO_INSTANCE = "No dagster instance configuration file"


def test_top_level_instance_files():
    """dagster.yaml is the embedded default (SQLite: no storage section) and dagster.postgres.yaml,
    beside it, differs from it only in its storage."""
    assert not (ROOT / "dagster.sqlite.yaml").exists()
    sqlite = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    postgres = yaml.safe_load((ROOT / "dagster.postgres.yaml").read_text())
    assert "storage" not in sqlite
    assert "postgres" in postgres.pop("storage")
    assert postgres == sqlite


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The project's top-level files in ``tmp_path / "repo"``, its packages linked, and a ``.venv``
    that is a real folder running this interpreter's environment."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Makefile", "pyproject.toml", "dagster.yaml", "dagster.postgres.yaml", "workspace.yaml"):
        shutil.copy(ROOT / name, repo / name)
    for name in ("gc25d_core", "gc25d_pipeline", "configs"):
        (repo / name).symlink_to(ROOT / name)
    env_root = Path(sys.prefix)
    venv = repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(env_root / "pyvenv.cfg", venv / "pyvenv.cfg")
    for entry in (env_root / "bin").iterdir():
        (venv / "bin" / entry.name).symlink_to(entry)
    for entry in env_root.iterdir():
        if entry.name not in ("bin", "pyvenv.cfg"):
            (venv / entry.name).symlink_to(entry)
    return repo


def _env(repo: Path) -> dict[str, str]:
    """A shell as a user has it after cloning: no venv active, no DAGSTER_HOME."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "DAGSTER_HOME", "MAKEFLAGS")}
    # this checkout's code (the venv may hold another checkout's editable install)
    env["PYTHONPATH"] = str(repo)
    return env


def test_make_validate_prints_no_warning(checkout: Path):
    proc = subprocess.run(
        ["make", "-s", "validate"],
        cwd=checkout,
        env=_env(checkout),
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "All definitions loaded successfully" in out, out
    for warning in (VENV_MISMATCH, SHADOWED, NO_INSTANCE):
        assert warning not in out, out
    assert (checkout / "dagster.yaml").read_text() == (ROOT / "dagster.yaml").read_text()


def test_make_dev_prints_no_warning_and_keeps_state_beside_dagster_yaml(checkout: Path):
    """`make dev` up to "Launching Dagster services" (dagster dev's warnings come before it), then
    stopped: the webserver need not come up for this."""
    proc = subprocess.Popen(
        ["make", "-s", "dev"],
        cwd=checkout,
        env=_env(checkout),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 300
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Launching Dagster services" in line or time.monotonic() > deadline:
                break
    finally:
        stop_group(proc, 60)
    out = "".join(lines)
    assert "Launching Dagster services" in out, out
    for warning in (VENV_MISMATCH, SHADOWED, NO_INSTANCE):
        assert warning not in out, out
    # the instance is the checkout's folder: its SQLite run storage is there
    assert (checkout / "history" / "runs.db").is_file(), sorted(p.name for p in checkout.iterdir())


def test_make_clean_removes_the_instance_state_not_the_checkout(checkout: Path):
    for name in ("history", "schedules", "storage", "data/tiny", "outputs/tiny"):
        (checkout / name).mkdir(parents=True)
        (checkout / name / "x").write_text("x")
    proc = subprocess.run(
        ["make", "-s", "clean"], cwd=checkout, env=_env(checkout), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("history", "schedules", "storage", "data/tiny", "outputs/tiny"):
        assert not (checkout / name).exists(), name
    for name in ("dagster.yaml", "dagster.postgres.yaml", "Makefile", "pyproject.toml", ".venv"):
        assert (checkout / name).exists(), name


def test_make_stops_on_a_dagster_home_without_dagster_yaml(checkout: Path, tmp_path: Path):
    """Dagster would fall back to its defaults (no run queue, no gpu pool, no retries) with only a
    warning; the Makefile stops and names the folder."""
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    proc = subprocess.run(
        ["make", "-s", "validate"],
        cwd=checkout,
        env={**_env(checkout), "DAGSTER_HOME": str(empty)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"DAGSTER_HOME={empty} holds no dagster.yaml" in proc.stderr, proc.stderr
