"""bench/suites.py: every named suite is valid bash and names only scripts that exist; bench/ imports
nothing from tests/."""

import re
import subprocess
from pathlib import Path

import pytest

from bench.suites import SUITES, Suite, main, script_of

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


def _run_suite(monkeypatch, tmp_path, capfd, script: str) -> tuple[int, str]:
    """``script`` as a suite run by the real bash through main(), as `python bench/suites.py` runs it."""
    monkeypatch.setitem(SUITES, "probe", Suite("nvidia-h200", "a test suite", script, wheels=False))
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = main(["probe"])
    out, err = capfd.readouterr()
    return rc, out + err


def test_a_step_that_times_out_fails_the_suite_and_is_named(monkeypatch, tmp_path, capfd):
    # the `small` suite's shape: the timed step in a pipeline, then commands that succeed
    rc, text = _run_suite(
        monkeypatch,
        tmp_path,
        capfd,
        """timeout 1 sleep 5 2>&1 | grep '^{' > "$OUT/x.log"
timeout 5 true
tail -n 3 "$OUT/x.log"
echo tail-ran""",
    )
    assert rc != 0
    assert "tail-ran" in text  # the remaining steps still run and print their results
    assert "suite probe: step timed out after 1s: sleep 5" in text


def test_a_step_that_fails_fails_the_suite(monkeypatch, tmp_path, capfd):
    rc, text = _run_suite(monkeypatch, tmp_path, capfd, "timeout 5 sh -c 'exit 3' | cat\necho done")
    assert rc != 0 and "step failed (exit 3): sh -c exit 3" in text


def test_a_suite_whose_steps_pass_exits_0_though_a_grep_finds_nothing(monkeypatch, tmp_path, capfd):
    # grep finding no error line is the good case, not a failure; env prefixes reach the step
    rc, text = _run_suite(
        monkeypatch,
        tmp_path,
        capfd,
        """X=7 timeout 5 sh -c 'echo "x=$X"' > "$OUT/ok.log"
grep -E 'Error|Traceback' "$OUT/ok.log" | head -n 3""",
    )
    assert rc == 0, text
    assert (tmp_path / "ok.log").read_text() == "x=7\n"
