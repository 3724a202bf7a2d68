"""``import_diffsynth`` loads DiffSynth's two model files without its package initialisers (which
import its whole library: Dynamo through ``torch.compile``, transformers, every model), and the
rest of DiffSynth still works when a process reads it. Each check runs in a fresh interpreter,
since the test session has long imported DiffSynth whole."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from gc25d_core.compat import defer_package_init
from tests.train.resume_checks import ROOT

_PROBE = """
import json, sys
import gc25d_core.models.gcdit, gc25d_core.models.vae
heavy = ("transformers", "diffsynth.core.attention", "diffsynth.core.loader.model", "diffsynth.pipelines")
out = {"heavy_loaded": [m for m in heavy if m in sys.modules]}
import diffsynth  # a user of the rest of the library: the first attribute read runs the initialisers
out["model_config"] = diffsynth.ModelConfig.__name__
from diffsynth.core import load_state_dict
out["loader"] = load_state_dict.__module__
out["heavy_after"] = [m for m in heavy[:3] if m in sys.modules]
print(json.dumps(out))
"""


def test_the_model_files_load_without_the_library_and_the_library_still_loads_on_use():
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy_loaded"] == []
    assert out["model_config"] == "ModelConfig" and out["loader"] == "diffsynth.core.loader.file"
    assert out["heavy_after"] == ["transformers", "diffsynth.core.attention", "diffsynth.core.loader.model"]


def test_a_deferred_package_runs_its_init_once_on_first_read_and_again_after_a_failure(tmp_path, monkeypatch):
    pkg = tmp_path / "deferred_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import os\nCOUNT = int(os.environ['DEFERRED_COUNT'])\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DEFERRED_COUNT", raising=False)
    for name in ("deferred_pkg", "deferred_pkg.sub", "deferred_pkg.sub.leaf"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    defer_package_init("deferred_pkg")
    from deferred_pkg.sub import leaf  # a submodule imports through __path__ alone

    assert leaf.VALUE == 7
    module = sys.modules["deferred_pkg"]
    assert isinstance(module, types.ModuleType) and "COUNT" not in vars(module)
    with pytest.raises(KeyError, match="DEFERRED_COUNT"):
        module.COUNT  # noqa: B018 (the read runs the __init__, which fails here)
    monkeypatch.setenv("DEFERRED_COUNT", "3")
    assert module.COUNT == 3  # tried again, as a re-import would
    monkeypatch.setenv("DEFERRED_COUNT", "4")
    assert module.COUNT == 3 and "__getattr__" not in vars(module)  # ran once
    with pytest.raises(AttributeError):
        module.missing  # noqa: B018
    assert module.sub is sys.modules["deferred_pkg.sub"]


def test_deferring_a_module_that_is_no_package_says_so(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.decoder")
    with pytest.raises(ImportError, match="json.decoder is not an installed package"):
        defer_package_init("json.decoder")


def test_the_startup_bench_prints_both_variants_side_by_side():
    """``bench.speed.startup`` (its import half): DiffSynth whole loads more modules than the default."""
    cmd = [sys.executable, "-m", "bench.speed.startup", "--repeats", "1", "--launches", "0"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    modules = summary["import_modules"]
    assert modules["whole"]["median"] > modules["deferred"]["median"] > 0
    assert summary["launch_wall_s"] == {}
