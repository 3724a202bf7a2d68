"""The stage table (gc25d_core.stages) is the one place a stage is named: the run config's sections,
the presets, the entry point, the assets and eval's sources follow it; the table refuses what would
break the chain; and docs/architecture.md's "Adding a stage" names only files and symbols that exist."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, get_args

import pytest

from gc25d_core import stages as table
from gc25d_core.config import Gc25dConfig, RootConfig
from gc25d_core.handoff import FINAL, TEACHER
from gc25d_core.stage_config import StageConfig
from gc25d_core.stages import STAGES, HandoffFile, Stage, Upstream, check_table, stage

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_names_the_handoff_files_as_handoff_writes_them():
    assert (table.FINAL, table.TEACHER) == (FINAL, TEACHER)
    assert set(get_args(HandoffFile)) == {FINAL, TEACHER}


def test_the_run_config_has_one_typed_optional_section_per_stage_in_table_order():
    names = [s.name for s in STAGES]
    assert list(Gc25dConfig.model_fields)[len(RootConfig.model_fields) :] == names
    for s in STAGES:
        field = Gc25dConfig.model_fields[s.name]
        assert field.default is None and set(get_args(field.annotation)) == {s.section, type(None)}
    assert Gc25dConfig().stage1_tf is None  # attribute access, as before


def test_presets_and_the_loop_dispatch_follow_the_table():
    from gc25d_core.train.presets import STAGES as PRESET_STAGES

    assert {s.name: s.section for s in STAGES} == PRESET_STAGES
    for s in STAGES:
        assert sorted((ROOT / "configs" / s.preset_folder).glob("*.yaml")), s.name
        # the run class exists, is named after its stage, and is imported only when asked for
        assert s.run_class().name == s.name


def test_an_unknown_stage_is_named_with_the_known_ones():
    from gc25d_core.schema import ConfigError

    with pytest.raises(ConfigError, match=r"unknown stage 'nope' .*'stage1_tf'"):
        stage("nope")


def test_the_entry_point_offers_every_stage():
    out = subprocess.run(
        [sys.executable, "-m", "gc25d_core.jobs.train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "{" + ",".join(sorted(s.name for s in STAGES)) + "}" in out.stdout


def _entry(name: str, **kw: Any) -> Stage:
    return Stage(name, StageConfig, "gc25d_core.train.sft:SftRun", "", **kw)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ((_entry("a"), _entry("a")), "stage 'a' is in the table twice"),
        ((_entry("a", init_from=Upstream("b")), _entry("b")), "init_from='b' is not a stage before it"),
        ((_entry("a", real_from=Upstream("a")),), "real_from='a' is not a stage before it"),
        ((_entry("../a"),), "stage name"),
        ((_entry("a", handoff="best.json"),), "handoff='best.json'"),
        ((Stage("a", StageConfig, "gc25d_core.train.sft.SftRun", ""),), "is not 'module:Class'"),
    ],
)
def test_the_table_refuses_what_would_break_the_chain(table, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_table(table)


def test_the_assets_eval_and_deploy_follow_the_table():
    import dagster as dg

    from gc25d_pipeline.definitions import defs
    from gc25d_pipeline.defs.deploy.assets import SOURCES, DeployExportConfig
    from gc25d_pipeline.defs.eval.assets import EVAL_SOURCES
    from gc25d_pipeline.defs.train.assets import STAGE_ASSETS, sft_teacher

    graph = defs.resolve_asset_graph()
    assert list(STAGE_ASSETS) == [s.name for s in STAGES]
    for s in STAGES:
        parents = {p.to_user_string() for p in graph.get(dg.AssetKey(s.name)).parent_keys}
        ups = [u for u in (s.init_from, s.real_from) if u is not None]
        want = {"sft_teacher" if stage(u.stage).handoff == TEACHER else u.stage for u in ups}
        assert parents == (want or {"cache_snapshot"}), s.name
    assert [(e.label, e.file) for e in EVAL_SOURCES] == [
        *((s.name, s.handoff) for s in STAGES if s.evaluated),
        ("deploy", FINAL),
    ]
    assert EVAL_SOURCES[0].asset is sft_teacher
    feeders = {s.name for s in STAGES if s.feeds_deploy}
    assert set(SOURCES) == feeders
    # the launch's choice is a Literal for the UI: it must name the same stages
    assert set(get_args(DeployExportConfig.model_fields["source"].annotation)) == feeders


# -- docs/architecture.md, "Adding a stage" ------------------------------------------------------

SECTION = "## Adding a stage"
PLACEHOLDERS = {"<name>": "sft", "<stage>": "sft", "<preset>": "tiny"}
REPO_DIRS = ("gc25d_core/", "gc25d_pipeline/", "configs/", "tests/", "docs/", "bench/")
DOTTED = re.compile(r"gc25d_(?:core|pipeline)(?:\.\w+)+")


def section(text: str) -> str:
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


@cache
def _defined_names() -> frozenset[str]:
    """Every name the packages define: module-level, in classes (methods, attributes, fields), and
    function parameters; the run config's derived fields; module names."""
    names: set[str] = set(Gc25dConfig.model_fields)
    for package in ("gc25d_core", "gc25d_pipeline", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            names.add(path.stem)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                if isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                    names.update(
                        e.id
                        for t in node.targets
                        if isinstance(t, ast.Tuple)
                        for e in t.elts
                        if isinstance(e, ast.Name)
                    )
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
                    names.add(node.value)  # file names such as final.json
    return frozenset(names)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def problems(text: str) -> list[str]:
    """What the backticked spans of ``text`` name that does not exist: repository paths, importable
    ``gc25d_*`` dotted names, a command's flags, and every other identifier."""
    out = []
    for span in re.findall(r"`([^`]+)`", text):
        concrete = span
        for k, v in PLACEHOLDERS.items():
            concrete = concrete.replace(k, v)
        for dotted in DOTTED.findall(concrete):
            if not _resolves(dotted):
                out.append(f"{span}: {dotted} does not import")
        if span.startswith("python "):
            module = DOTTED.findall(concrete)[0]
            flags = importlib.import_module(module).parser()._option_string_actions
            out += [f"{span}: {module} has no {f}" for f in re.findall(r"--[\w-]+", span) if f not in flags]
            continue
        if concrete.startswith(REPO_DIRS):
            if not (ROOT / concrete).exists():
                out.append(f"{span}: no such file")
            continue
        bare = re.sub(r"\"[^\"]*\"|<[^>]*>|" + DOTTED.pattern, " ", span)
        for ident in re.findall(r"[A-Za-z_]\w*", bare):
            if ident not in _defined_names():
                out.append(f"{span}: {ident} is defined nowhere")
    return out


def test_the_adding_a_stage_section_names_only_what_exists():
    text = section((ROOT / "docs" / "architecture.md").read_text())
    assert "gc25d_core/stages.py" in text and "gc25d_core.jobs.train" in text
    assert problems(text) == []


def test_the_section_check_catches_what_drifted():
    # what the section said before the table: a per-stage entry module and a parser that is gone,
    # and a dispatch table that no longer exists
    old = (
        "3. **Its entry point.** `gc25d_core/jobs/stage1_tf.py`, as thin as the others (`stage_parser`). "
        "Add it to `gc25d_core.train.loop.STAGE_RUNS`; `python -m gc25d_core.jobs.train --stages`."
    )
    assert problems(old) == [
        "gc25d_core/jobs/stage1_tf.py: no such file",
        "stage_parser: stage_parser is defined nowhere",
        "gc25d_core.train.loop.STAGE_RUNS: gc25d_core.train.loop.STAGE_RUNS does not import",
        "python -m gc25d_core.jobs.train --stages: gc25d_core.jobs.train has no --stages",
    ]
