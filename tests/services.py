"""Find the real services the scale-out tests need, or start them with .ci/services.sh.

In CI (CI=true) a service that cannot be found or started fails the test: it must never pass by
skipping. Elsewhere (a developer without root) the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / ".ci" / "services.sh"


def _ok(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except (OSError, subprocess.SubprocessError):
        return False


def ensure_service(name: str, check: Callable[[], bool]) -> None:
    if _ok(check):
        return
    why = f"{name} is not running"
    if os.geteuid() == 0:
        proc = subprocess.run(["bash", str(SERVICES), name], capture_output=True, text=True, timeout=900)
        if proc.returncode == 0 and _ok(check):
            return
        why = f"bash .ci/services.sh {name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    else:
        why += " and starting it needs root (bash .ci/services.sh as root)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI needs a real {name}: {why}")
    pytest.skip(why)


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and any(
        s.strip("*~#") in ("idle", "mix", "alloc") for s in proc.stdout.split()
    )


PG_DSN = {"host": "127.0.0.1", "port": 5432, "user": "gc25d", "password": "gc25d", "dbname": "gc25d"}


def postgres_up() -> bool:
    import psycopg2

    try:
        psycopg2.connect(connect_timeout=5, **PG_DSN).close()
        return True
    except psycopg2.OperationalError:
        return False
