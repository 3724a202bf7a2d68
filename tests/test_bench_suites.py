"""bench/suites.py: every named suite is valid bash and names only scripts that exist; bench/ runs as a
package (no sys.path edits, imports that resolve) and imports nothing from tests/."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from bench.suites import SUITES, Suite, main, script_of

ROOT = Path(__file__).resolve().parent.parent


def _module_file(name: str) -> Path | None:
    base = ROOT / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__main__.py", base / "__init__.py"):
        if path.is_file():
            return path
    return None


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suite_is_valid_bash_over_existing_scripts(name):
    script = script_of(name)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    for path in re.findall(r"\b(bench/[\w/]+\.(?:py|sh)|tests/[\w/]+\.py)\b", script):
        assert (ROOT / path).is_file(), f"{name}: {path} does not exist"
    for module in re.findall(r"-m (bench\.[\w.]+)", script):
        assert _module_file(module), f"{name}: no module {module}"


def test_bench_imports_nothing_from_tests():
    for path in (ROOT / "bench").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) tests\b", text, re.M), path


def test_bench_runs_as_a_package_without_sys_path_edits():
    """Scripts run as ``python -m bench.<folder>.<name>`` from the repository root: none edits sys.path,
    and every ``bench.…`` import (in bench/ and tests/) names a module that exists."""
    for path in (ROOT / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):  # code only: docstrings may say sys.path
            is_sys = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            )
            assert not (is_sys and node.attr == "path"), f"{path}:{node.lineno}: edits sys.path"
    for path in [*(ROOT / "bench").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for mod in names:
                if mod == "bench" or mod.startswith("bench."):
                    assert _module_file(mod), f"{path}: imports {mod}, which does not exist"


def test_every_script_is_in_a_folder_that_says_what_it_measures():
    top = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert top == {"__init__.py", "common.py", "suites.py"}
    for folder in ("speed", "quality", "probes"):
        assert (ROOT / "bench" / folder / "__init__.py").is_file()


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
