"""Guard: no code of ours unpickles anything but weights-only data.

Scans gc25d_core/, gc25d_pipeline/ and bench/ (the AST, so comments and docstrings do not count,
and imported aliases resolve): every ``torch.load`` passes ``weights_only=True``; nothing calls
``pickle.load(s)`` (or dill / cloudpickle / joblib / pandas.read_pickle, or an ``Unpickler``); no
``numpy.load`` allows pickles; a module that resumes a DeepSpeed / accelerate engine
(``load_checkpoint`` / ``load_state``) installs our safe checkpoint engine."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("gc25d_core", "gc25d_pipeline", "bench")
PICKLE_MODULES = ("pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib")
UNPICKLERS = {f"{m}.{f}" for m in PICKLE_MODULES for f in ("load", "loads", "Unpickler")}
UNPICKLERS |= {"pandas.read_pickle", "torch.serialization.pickle.load"}
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
ENGINE_RESUMES = {"load_checkpoint", "load_state"}
INSTALLER = "install_safe_checkpoint_engine"


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``np`` -> ``numpy``, ``load`` -> ``torch.load``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(func: ast.expr, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    return ".".join([aliases.get(func.id, func.id), *reversed(parts)])


def _keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords
    )


def _allows_pickles(call: ast.Call) -> bool:
    """``allow_pickle`` passed as anything but a literal False (numpy's default is False)."""
    given = any(k.arg == "allow_pickle" for k in call.keywords)
    return given and not _keyword_is(call, "allow_pickle", False)


def violations(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: list[str] = []
    resumes_engine = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        at = f"{where}:{node.lineno}"
        if isinstance(node.func, ast.Attribute) and node.func.attr in ENGINE_RESUMES:
            resumes_engine = True
        if name in TORCH_LOADS and not _keyword_is(node, "weights_only", True):
            found.append(f"{at}: {name} without weights_only=True")
        elif name in UNPICKLERS:
            found.append(f"{at}: {name} unpickles arbitrary objects")
        elif name == "numpy.load" and _allows_pickles(node):
            found.append(f"{at}: numpy.load allowing pickles")
    if resumes_engine and INSTALLER not in source:
        found.append(f"{where}: resumes a DeepSpeed engine without {INSTALLER}")
    return found


def test_the_guard_catches_each_kind_of_unsafe_load():
    source = """
import pickle as pk
import numpy as np
import torch
from torch import load
from joblib import load as jl
a = torch.load(p)
b = torch.load(p, weights_only=False)
c = load(p, map_location="cpu")
d = pk.loads(blob)
e = np.load(p, allow_pickle=True)
f = jl(p)
engine.load_checkpoint(folder)
ok = torch.load(p, weights_only=True), np.load(p), np.load(p, allow_pickle=False)
"""
    found = violations(source, "x.py")
    assert [v.split(": ", 1)[0] for v in found] == [f"x.py:{n}" for n in range(7, 13)] + ["x.py"]


def _scan(folder: str) -> list[str]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, folder
    return [v for f in files for v in violations(f.read_text(), str(f.relative_to(ROOT)))]


@pytest.mark.parametrize("folder", SCANNED)
def test_our_code_deserialises_only_weights_only_data(folder):
    # in a fresh interpreter: CPython 3.11's ast.parse fails with "AST constructor recursion depth
    # mismatch" when a thread left by an earlier test parses at the same time (test_declared_deps)
    out = subprocess.run([sys.executable, __file__, folder], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout)
    assert not found, "\n".join(found)


if __name__ == "__main__":
    print(json.dumps(_scan(sys.argv[1])))
