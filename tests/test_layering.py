"""The layering contract ([tool.importlinter] in pyproject.toml) holds for the tree, and breaks when a
module imports above its layer (so the check in CI is one that can fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages under ``root`` with the contracts of its pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_tree_keeps_its_layers():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_an_import_across_the_layers_breaks_the_contract(tmp_path):
    """A copy of the tree where deploy reads the training data module and the VAE module reaches
    into preprocessing: both named, and the run fails."""
    for pkg in ("gc25d_core", "gc25d_pipeline"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lazy_import = "\n\ndef _later():\n    from {} import {}\n\n    return {}\n"
    with open(tmp_path / "gc25d_core" / "deploy" / "cli.py", "a") as f:
        f.write(lazy_import.format("gc25d_core.train.data", "TrainingStream", "TrainingStream"))
    with open(tmp_path / "gc25d_core" / "models" / "vae.py", "a") as f:
        f.write(lazy_import.format("gc25d_core.preprocess.latents", "load_clip_frames", "load_clip_frames"))
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "gc25d_core.deploy.cli -> gc25d_core.train.data" in proc.stdout
    assert "gc25d_core.models.vae -> gc25d_core.preprocess.latents" in proc.stdout
