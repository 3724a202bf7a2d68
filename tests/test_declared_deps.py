"""Every third-party distribution the shipped packages import is declared in pyproject.toml.

A package that only arrives through another one (pillow through tensorboard, uvicorn through
dagster-webserver) disappears when that one drops it or when a user installs less (gc25d_core without
the webserver), and the failure shows up at run time, far from the cause. The imports are read with
``ast`` from every module of gc25d_core and gc25d_pipeline (including imports inside functions),
mapped to distributions by ``importlib.metadata.packages_distributions()`` and checked against
``[project] dependencies``; an optional extra counts only for the modules listed in ``OPTIONAL``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("gc25d_core", "gc25d_pipeline")

# Imports that only an optional extra provides: import name -> (extra, the modules documented to
# need it). Those modules import it inside a function, so the embedded default loads without it.
OPTIONAL: dict[str, tuple[str, frozenset[str]]] = {
    "kubernetes": ("scaleout", frozenset({"gc25d_pipeline/lib/k8s.py"})),
    "flash_attn": ("fa4", frozenset({"gc25d_core/models/fa4.py"})),
    "torchao": ("fp8", frozenset({"gc25d_core/models/fp8.py"})),
}
# Optional packages that are not installed in a CPU checkout (packages_distributions cannot map them)
NOT_INSTALLED_HERE = {"flash_attn": "flash-attn-4", "torchao": "torchao"}


def _normalize(name: str) -> str:
    """PEP 503 name: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"pyproject.toml: cannot read the requirement {requirement!r}"
    return _normalize(match.group(1))


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        extra: {_requirement_name(r) for r in reqs}
        for extra, reqs in project.get("optional-dependencies", {}).items()
    }
    return base, extras


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level name, line, at module level) of every absolute import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(child) for child in ast.walk(node) if child is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out.extend((name.split(".")[0], node.lineno, id(node) not in in_function) for name in names)
    return out


def _third_party_imports() -> dict[str, list[tuple[str, int, bool]]]:
    """import name -> [(module path relative to the repo, line, at module level)], scanned in a
    fresh interpreter: CPython 3.11's ``ast.parse`` keeps its recursion-depth count per process,
    and a thread left running by an earlier test (a server, a pool) that parses at the same time
    makes it fail with "AST constructor recursion depth mismatch" (fixed in later CPythons)."""
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, check=True).stdout
    return {name: [(rel, line, top) for rel, line, top in sites] for name, sites in json.loads(out).items()}


def _scan() -> dict[str, list[tuple[str, int, bool]]]:
    found: dict[str, list[tuple[str, int, bool]]] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, line, top in _imports(path):
                if name in sys.stdlib_module_names or name in SHIPPED:
                    continue
                found.setdefault(name, []).append((rel, line, top))
    return found


def test_the_scan_sees_imports_inside_functions():
    """The walker must not stop at module level: PIL is imported only inside gc25d_core.preview's
    functions, and is one of the imports this test exists for."""
    found = _third_party_imports()
    assert any(rel == "gc25d_core/preview.py" and not top for rel, _, top in found["PIL"])
    assert "torch" in found and "dagster" in found


def test_every_imported_distribution_is_declared():
    base, extras = _declared()
    to_dists = importlib.metadata.packages_distributions()
    problems = []
    for name, sites in sorted(_third_party_imports().items()):
        dists = to_dists.get(name) or ([NOT_INSTALLED_HERE[name]] if name in NOT_INSTALLED_HERE else [])
        where = ", ".join(f"{rel}:{line}" for rel, line, _ in sorted(sites))
        if not dists:
            problems.append(f"{name}: no installed distribution provides it (imported at {where})")
            continue
        dists_n = {_normalize(d) for d in dists}
        if dists_n & base:
            continue
        if name in OPTIONAL:
            extra, modules = OPTIONAL[name]
            outside = [f"{rel}:{line}" for rel, line, _ in sites if rel not in modules]
            eager = [f"{rel}:{line}" for rel, line, top in sites if top]
            if dists_n & extras.get(extra, set()) and not outside and not eager:
                continue
            problems.append(
                f"{name} ({', '.join(sorted(dists))}): only the modules {sorted(modules)} may import it, "
                f"inside a function, from the extra [{extra}]; imported at {where}"
            )
            continue
        problems.append(
            f"{name} ({', '.join(sorted(dists))}): imported at {where} but not in pyproject.toml's "
            "[project] dependencies"
        )
    assert not problems, "\n".join(problems)


def test_optional_list_is_still_needed():
    """Each OPTIONAL entry names an extra that exists and an import that still happens."""
    _, extras = _declared()
    found = _third_party_imports()
    for name, (extra, modules) in OPTIONAL.items():
        assert extra in extras, f"pyproject.toml has no extra [{extra}] (OPTIONAL[{name!r}])"
        assert {rel for rel, _, _ in found.get(name, [])} == set(modules), name


if __name__ == "__main__":  # the scan of _third_party_imports, in its own interpreter
    print(json.dumps(_scan()))
