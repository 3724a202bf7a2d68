"""bench/suites.py: every named suite is valid bash and names only scripts that exist; bench/ imports
nothing from tests/."""

import re
import subprocess
from pathlib import Path

import pytest

from bench.suites import SUITES, script_of

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suite_is_valid_bash_over_existing_scripts(name):
    script = script_of(name)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    for path in re.findall(r"\b(bench/[\w/]+\.(?:py|sh)|tests/[\w/]+\.py)\b", script):
        assert (ROOT / path).is_file(), f"{name}: {path} does not exist"


def test_bench_imports_nothing_from_tests():
    for path in (ROOT / "bench").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) tests\b", text, re.M), path
