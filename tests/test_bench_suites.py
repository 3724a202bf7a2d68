"""bench/: every named suite's steps run modules and files that exist; a suite run by Python fails when a
step times out or fails, routes each step's output to its $OUT files, and takes its arguments; bench/
runs as a package (no sys.path edits, imports that resolve) and imports nothing from tests/."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import suites
from bench.suites import SUITES, Call, Show, Step, Suite, SuiteError, Tar, Wait, join_split_wheel, main

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _module_file(name: str) -> Path | None:
    base = ROOT / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__main__.py", base / "__init__.py"):
        if path.is_file():
            return path
    return None


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suite_runs_modules_and_files_that_exist(name, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    args = [".fa4/1"] if name == "fa4-stage" else []  # its one argument has no default
    assert main([name, *args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "{" not in text.replace("'^{'", ""), text  # every placeholder resolved
    assert not (tmp_path / "out").exists()  # a dry run runs nothing
    for action in suites.actions(name):
        if not isinstance(action, Step):
            continue
        cmd = list(action.cmd)
        for i, word in enumerate(cmd[:-1]):
            if word == "-m" and cmd[i + 1].split(".")[0] in ("bench", "gc25d_core"):
                assert _module_file(cmd[i + 1]), f"{name}: no module {cmd[i + 1]}"
        for word in cmd:
            if re.fullmatch(r"(bench|tests)/[\w/.]+", word):
                assert (ROOT / word).exists(), f"{name}: {word} does not exist"


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


def _run(monkeypatch, tmp_path, capfd, *steps, defaults=(), args=()) -> tuple[int, str]:
    """``steps`` as a suite run through main(), as `python -m bench.suites NAME` runs it."""
    monkeypatch.setitem(
        SUITES, "probe", Suite("nvidia-h200", "a test suite", steps, wheels=False, defaults=defaults)
    )
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = main(["probe", *args])
    out, err = capfd.readouterr()
    return rc, out + err


def test_a_step_that_times_out_fails_the_suite_and_is_named(monkeypatch, tmp_path, capfd):
    # the `small` suite's shape: the timed step, then steps that succeed and show what there is
    rc, text = _run(
        monkeypatch,
        tmp_path,
        capfd,
        Step(("sleep", "5"), 1, jsonl="x.log"),
        Step(("true",), 5),
        Show("x.log", tail=3),
        Step(("echo", "tail-ran"), 5),
    )
    assert rc == 1
    assert "tail-ran" in text  # the remaining steps still run and print their results
    assert "suite probe: step timed out after 1s: sleep 5" in text
    assert "suite probe FAILED: 1 step(s)" in text


def test_a_timeout_ends_the_steps_whole_process_group(monkeypatch, tmp_path, capfd):
    # torchrun's ranks are children of the launcher: a timed-out step must not leave them running
    script = f"sleep 30 & echo $! > {tmp_path}/child.pid; wait"
    rc, text = _run(monkeypatch, tmp_path, capfd, Step(("sh", "-c", script), 1, log="x.log"))
    assert rc == 1 and "timed out after 1s" in text
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(pid):
        assert time.monotonic() < deadline, f"the step's child {pid} outlived the timeout"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_step_that_fails_fails_the_suite(monkeypatch, tmp_path, capfd):
    rc, text = _run(
        monkeypatch, tmp_path, capfd, Step(("sh", "-c", "exit 3"), 5, log="x.log"), Step(("echo", "done"), 5)
    )
    assert rc == 1 and "step failed (exit 3): sh -c 'exit 3'" in text and "done" in text


def test_a_suite_whose_steps_pass_exits_0_though_a_grep_finds_nothing(monkeypatch, tmp_path, capfd):
    # a grep finding no error line is the good case, not a failure; a step's env reaches it
    rc, text = _run(
        monkeypatch,
        tmp_path,
        capfd,
        Step(("sh", "-c", 'echo "x=$X"'), 5, log="ok.log", env={"X": "7"}),
        Show("ok.log", grep="Error|Traceback", head=3),
    )
    assert rc == 0, text
    assert (tmp_path / "ok.log").read_text() == "x=7\n"


def test_step_output_goes_to_its_files(monkeypatch, tmp_path, capfd):
    emit = 'echo \'{"a": 1234567}\'; echo noise; echo "[2026-12-02 log line"; echo oops >&2'
    rc, text = _run(
        monkeypatch,
        tmp_path,
        capfd,
        Step(("sh", "-c", emit), 5, log="all.log", jsonl="rec.jsonl", width=8),
        Step(("sh", "-c", emit), 5, log="clean.json", drop=r"^\[20"),
        Step(("sh", "-c", emit), 5, log="out.jsonl", err="out.err"),
        Step(("sh", "-c", "echo to-stdout"), 5),
        Show("all.log", grep="^{", width=5),
        Show("all.log", tail_chars=5),
    )
    assert rc == 0, text
    assert (tmp_path / "all.log").read_text() == '{"a": 1234567}\nnoise\n[2026-12-02 log line\noops\n'
    assert (tmp_path / "rec.jsonl").read_text() == '{"a": 12\n'
    assert (tmp_path / "clean.json").read_text() == '{"a": 1234567}\nnoise\noops\n'
    assert (tmp_path / "out.err").read_text() == "oops\n"
    assert "oops" not in (tmp_path / "out.jsonl").read_text()
    assert "to-stdout" in text and '{"a":' in text and "oops\n" in text


def test_arguments_and_their_defaults(monkeypatch, tmp_path, capfd):
    step = Step(("sh", "-c", 'echo "$0 $1" > "$OUT/args.txt"', "{1}", "{2}"), 5)
    rc, _ = _run(monkeypatch, tmp_path, capfd, step, defaults=("a", "b"), args=("x",))
    assert rc == 0 and (tmp_path / "args.txt").read_text() == "x b\n"
    rc, _ = _run(monkeypatch, tmp_path, capfd, step, defaults=("a", "b"), args=("", "y"))
    assert rc == 0 and (tmp_path / "args.txt").read_text() == "a y\n"  # an empty argument takes the default
    rc, text = _run(monkeypatch, tmp_path, capfd, step, defaults=("a",))
    assert rc == 1 and "suite probe needs argument 2" in text


def test_background_step_runs_beside_the_next_and_counts_when_waited_for(monkeypatch, tmp_path, capfd):
    rc, text = _run(
        monkeypatch,
        tmp_path,
        capfd,
        Step(("sh", "-c", 'sleep 1; touch "$OUT/world"; exit 2'), 30, log="gen.log", background=True),
        Step(("sh", "-c", 'test ! -e "$OUT/world"'), 5),  # ran while the world was being made
        Wait(),
        Step(("test", "-e", str(tmp_path / "world")), 5),
    )
    assert rc == 1 and "step failed (exit 2)" in text and "FAILED: 1 step(s)" in text


def test_a_step_is_skipped_when_its_output_exists(monkeypatch, tmp_path, capfd):
    (tmp_path / "full").mkdir()
    rc, text = _run(monkeypatch, tmp_path, capfd, Step(("false",), 5, unless=str(tmp_path / "full")))
    assert rc == 0 and "exists, not run" in text


def test_a_failed_setup_ends_the_suite(monkeypatch, tmp_path, capfd):
    def broken(ctx):
        raise SuiteError("installing broke")

    rc, text = _run(monkeypatch, tmp_path, capfd, Call("install", broken), Step(("echo", "after-install"), 5))
    assert rc == 1 and "installing broke" in text and "after-install" not in text


def test_tar_packs_a_run_folder(monkeypatch, tmp_path, capfd):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("x")
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setitem(
        SUITES,
        "probe",
        Suite("h", "t", (Tar("logs.tgz", str(tmp_path / "logs")), Tar("none.tgz", "/nonexistent"))),
    )
    monkeypatch.setattr(suites, "install_wheels", lambda ctx: None)
    assert main(["probe"]) == 0  # a missing folder is only noted
    with tarfile.open(out / "logs.tgz", "r:gz") as tar:
        assert tar.extractfile("./a.log").read() == b"x"


def test_join_split_wheel_checks_the_digest(tmp_path):
    data = os.urandom(1000)
    name = "nvidia_cutlass_dsl_libs_cu13-4.8.1-py3-none-any.whl"
    for k, part in enumerate((data[:300], data[300:700], data[700:])):
        (tmp_path / f"part-{name}.0{k}").write_bytes(part)
    (tmp_path / "libs.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    join_split_wheel(tmp_path)
    assert (tmp_path / name).read_bytes() == data and not list(tmp_path.glob("part-*"))
    join_split_wheel(tmp_path)  # a second install checks the joined wheel again
    (tmp_path / name).write_bytes(data[:-1])
    with pytest.raises(SuiteError, match="SHA256 differs"):
        join_split_wheel(tmp_path)


def test_suites_run_as_a_module_from_the_repository_root(tmp_path):
    proc = subprocess.run(
        [PY, "-m", "bench.suites", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},  # no PYTHONPATH: `-m` from the root is enough
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert set(SUITES) == {line.split()[0] for line in proc.stdout.splitlines()}


def test_benchmark_table_commands_name_modules_that_exist():
    """docs/benchmarks.md's commands rerun its figures: each ``-m bench.…`` module and ``bench/…`` file
    it names exists (the scripts moved once; a stale command would silently point nowhere)."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    modules = re.findall(r"-m (bench(?:\.\w+)+)", text)
    assert "bench.suites" in modules
    for mod in modules:
        assert _module_file(mod), f"docs/benchmarks.md: no module {mod}"
    for path in re.findall(r"\bbench/[\w/]+\.(?:py|sh)\b", text):
        assert (ROOT / path).is_file(), f"docs/benchmarks.md: {path} does not exist"


def test_the_deploy_suites_default_levers_are_the_loop_benchs():
    """The suite spells the loop bench's lever list (its runner starts before the wheels that
    module's imports need are installed): the two stay equal, exact first in the bench's."""
    from bench.speed.deploy import LOOP_LEVERS

    assert LOOP_LEVERS[0] == "exact"
    assert suites.DEPLOY_LEVERS.split(",") == list(LOOP_LEVERS[1:])


def test_the_suite_runner_imports_no_package_the_gpu_image_lacks():
    """`python -m bench.suites` installs .whl/ before its steps: its own imports must not need it."""
    code = "import sys, bench.suites; print(sorted(m for m in ('pydantic', 'diffsynth', 'deepspeed', 'dagster') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_bench_with_a_failed_or_timed_out_run_exits_non_zero():
    """bench/speed/stages.py and sft.py end with ``exit_on_failed_runs`` over their runs' exit codes:
    a run past its limit (124) or failing makes the bench, and the suite step around it, fail."""
    from bench.common import exit_on_failed_runs

    exit_on_failed_runs({"s3": 0, "s3+module": 0})  # all ran: returns
    with pytest.raises(SystemExit, match=r"runs failed: s3 \(timed out\), sft \(exit 1\)"):
        exit_on_failed_runs({"s3": 124, "s3+module": 0, "sft": 1})
