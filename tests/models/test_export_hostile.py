"""Hostile export files: a header whose metadata claims far more than the file holds is refused before
anything is built from it, and a file that is no safetensors export (a pickle renamed, truncated,
empty, a 1 TiB header length) gives one ExportError naming the file from every loader of exports;
the hash is checked before the header is parsed."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gc25d_core.hashing import sha256_file
from gc25d_core.models.export import ExportError, expected_shapes, read_export, read_export_meta, save_export

from .tiny import make_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return save_export(tmp_path_factory.mktemp("hostile") / "good.safetensors", make_model(seed=0))


def _with_config(good: Path, out: Path, **changes) -> Path:
    """``good`` with its dit_config metadata changed (the tensors as they are)."""
    with safe_open(str(good), framework="pt") as f:
        meta = dict(f.metadata())
        sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    cfg = json.loads(meta["dit_config"])
    cfg.update(changes)
    save_file(sd, str(out), metadata={**meta, "dit_config": json.dumps(cfg)})
    return out


@pytest.mark.parametrize("layers", [2000, 200_000])
def test_inflated_layer_count_is_refused_before_any_build(good, tmp_path, layers):
    bad = _with_config(good, tmp_path / "inflated.safetensors", num_layers=layers)
    built = expected_shapes.cache_info().misses
    with pytest.raises(
        ExportError, match=rf"inflated.safetensors: .*num_layers={layers} but the tensors hold 2"
    ):
        read_export(bad)
    assert expected_shapes.cache_info().misses == built  # no model was built from the metadata


def test_dims_the_shapes_contradict_are_refused(good, tmp_path):
    bad = _with_config(good, tmp_path / "wide.safetensors", dim=96 * 512, ffn_dim=10**6, num_heads=2)
    with pytest.raises(ExportError, match=r"wide.safetensors: .*dim=49152 but patch_embedding.weight"):
        read_export_meta(bad)


def test_inflated_metadata_stays_small_in_memory(good, tmp_path):
    """The 200,000-layer header in a fresh process: refused, and its peak memory stays that of the
    imports (it reached 13 GiB when the loader built the claimed model)."""
    bad = _with_config(good, tmp_path / "inflated.safetensors", num_layers=200_000)
    code = textwrap.dedent(
        f"""
        import resource, sys
        from gc25d_core.models.export import ExportError, read_export
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            read_export({str(bad)!r})
        except ExportError:
            print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
            sys.exit(0)
        sys.exit(1)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    grown_mib = int(out.stdout.strip().splitlines()[-1])
    assert grown_mib < 200, grown_mib  # (Linux reports ru_maxrss in KiB)


def _unreadable(good: Path, folder: Path) -> dict[str, Path]:
    data = good.read_bytes()
    files = {
        "pickle": pickle.dumps({"weight": torch.zeros(3)}),
        "empty": b"",
        "header_cut": data[:200],
        "tensors_cut": data[:-100],
        "huge_header": (1 << 40).to_bytes(8, "little") + b"{}",
    }
    out = {}
    for name, body in files.items():
        out[name] = folder / f"{name}.safetensors"
        out[name].write_bytes(body)
    return out


def test_unreadable_files_raise_one_error_naming_the_file(good, tmp_path):
    from gc25d_core.deploy.export import write_deploy_export
    from gc25d_core.deploy.runtime import load_deploy_model
    from gc25d_core.models.export import deployed_from
    from gc25d_core.models.loading import load_gc_weights

    for name, path in _unreadable(good, tmp_path).items():
        loaders = {
            "read_export": lambda p=path: read_export(p),
            "load_gc_weights": lambda p=path: load_gc_weights(p),  # train init, eval
            "load_deploy_model": lambda p=path: load_deploy_model(p),  # deploy play / serve
            "deployed_from": lambda p=path: deployed_from(p),  # eval's deploy-copy check
            "write_deploy_export": lambda p=path: write_deploy_export(p, tmp_path / "out.safetensors"),
        }
        for loader, call in loaders.items():
            with pytest.raises(ExportError, match=rf"{path}: not a readable safetensors file") as e:
                call()
            assert isinstance(e.value, ValueError), (name, loader)
    assert not (tmp_path / "out.safetensors").exists()


def test_the_hash_is_checked_before_the_header_is_parsed(good, tmp_path):
    """A wrong file under an expected hash is reported as the wrong file, not as a parse error."""
    from gc25d_core.models.export import deployed_from

    bad = _unreadable(good, tmp_path)["pickle"]
    with pytest.raises(ExportError, match=rf"{bad}: sha256 .* != expected {'0' * 64}"):
        deployed_from(bad, "0" * 64)
    with pytest.raises(ExportError, match=rf"{bad}: sha256 .* != expected"):
        read_export(bad, expected_sha256=sha256_file(good))
    assert deployed_from(good, sha256_file(good)) is None


def test_deploy_play_names_an_unreadable_export(good, tmp_path, capsys):
    from gc25d_core.deploy.cli import main

    bad = _unreadable(good, tmp_path)["pickle"]
    argv = ["play", "--export", str(bad), "--actions", "fwd", "--out", str(tmp_path / "p.mp4")]
    argv += ["--set", f"paths.runs_root={tmp_path}", "--set", "vae.fit.enabled=false", "--device", "cpu"]
    assert main(argv) == 2
    assert f"error: export {bad}: not a readable safetensors file" in capsys.readouterr().err


def test_causal_metadata_is_bounded(tmp_path):
    """A causal header may not ask for a huge window (the KV cache a session allocates follows it)
    or carry a huge denoise axis."""
    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.models.configs import DEPLOY_CAUSAL

    causal = save_export(
        tmp_path / "causal.safetensors",
        make_model(seed=0),
        causal=DEPLOY_CAUSAL,
        denoise_axis=DEPLOY_AXIS.timesteps,
    )
    with safe_open(str(causal), framework="pt") as f:
        meta = dict(f.metadata())
        sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    cases = {
        "window": ({"window": "1000000", "rope_cap": "1000002"}, r"out of bounds .*window=1000000"),
        "axis": ({"denoise_axis": json.dumps([500.0] * 2000)}, r"out of bounds .*denoise_axis of 2000 steps"),
        "long": ({"denoise_axis": "[" + "1," * 40000 + "1]"}, r"denoise_axis metadata of 80003 characters"),
        "nan": ({"denoise_axis": "[1000.0, NaN]"}, r"non-finite"),
    }
    for name, (changes, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(sd, str(path), metadata={**meta, **changes})
        with pytest.raises(ExportError, match=rf"{name}.safetensors: .*{message}"):
            read_export_meta(path)
    assert read_export_meta(causal).causal == DEPLOY_CAUSAL
