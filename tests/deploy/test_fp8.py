"""FP8 GEMMs in deploy (gc25d_core.models.fp8): which layers convert (with the per-layer opt-out), a
clean refusal where FP8 cannot run (CPU, no torchao), and on a GPU the session's error against the
bf16 path under CUDA graphs."""

from __future__ import annotations

import sys

import pytest
import torch

from gc25d_core.deploy.cli import main
from gc25d_core.deploy.runtime import RuntimeOptions
from gc25d_core.models import fp8
from gc25d_core.models.fp8 import AUTO_MIN_DIM, Fp8Unavailable, auto_fp8, check_fp8, fp8_layer_names
from tests.models.tiny import make_model


def test_the_blocks_linear_layers_convert_and_skip_patterns_opt_out():
    model = make_model()
    names = fp8_layer_names(model)
    n = len(model.blocks)
    assert len(names) == 8 * n  # self q k v o, cross q o, ffn.0 ffn.2 per block
    assert "blocks.0.self_attn.q" in names and "blocks.0.ffn.2" in names
    assert not any(x.endswith(("cross_attn.k", "cross_attn.v")) for x in names)  # once per session
    assert not any(x.startswith(("head", "time_", "text_")) for x in names)  # first / last layers stay
    kept = fp8_layer_names(model, skip=["blocks.0.*", "*.ffn.2"])
    assert not any(x.startswith("blocks.0.") or x.endswith("ffn.2") for x in kept)
    assert len(kept) == 8 * n - 8 - (n - 1)


def test_fp8_refuses_on_a_cpu_naming_why():
    with pytest.raises(Fp8Unavailable, match="CUDA device"):
        check_fp8("cpu")


def test_fp8_refuses_without_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # what an install without the extra looks like
    with pytest.raises(Fp8Unavailable, match=r"torchao package \(pip install 'gc25d\[fp8\]'"):
        check_fp8("cpu")


def test_a_cpu_session_with_fp8_refuses_before_it_runs(tiny_export, deploy_cfg):
    from gc25d_core.deploy.session import open_session

    with pytest.raises(Fp8Unavailable, match="fp8 needs a CUDA device"):
        open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(fp8=True))


def test_the_cli_reports_fp8_on_a_cpu_as_an_error(tiny_export, deploy_cfg, tmp_path, capsys):
    argv = ["play", "--export", str(tiny_export), "--actions", "fwd", "--out", str(tmp_path / "p.mp4")]
    argv += ["--set", f"paths.runs_root={deploy_cfg.paths.runs_root}", "--set", "vae.fit.enabled=false"]
    assert main([*argv, "--device", "cpu", "--fp8"]) == 2
    assert "error: fp8 needs a CUDA device" in capsys.readouterr().err
    assert main([*argv, "--device", "cpu", "--fp8-skip", "blocks.0.*"]) == 2
    assert "--fp8-skip needs FP8 (--fp8, or the default on CUDA)" in capsys.readouterr().err


def test_auto_takes_fp8_where_it_can_run_and_the_dit_is_wide_enough(monkeypatch):
    on, why = auto_fp8(3072, "cpu")  # the 5B's width, but no FP8 tensor cores
    assert not on and "fp8 off: it needs a CUDA device" in why
    monkeypatch.setattr(fp8, "fp8_problems", lambda device: [])  # as on an H200 with torchao
    assert AUTO_MIN_DIM == 3072
    on, why = auto_fp8(AUTO_MIN_DIM, "cpu")
    assert on and why.startswith("fp8 on: dim 3072 >= 3072")
    on, why = auto_fp8(1024, "cpu")  # the small preset's DiT: measured no faster
    assert not on and "dim 1024 < 3072" in why


def test_a_cpu_session_on_auto_runs_bf16_and_says_why(tiny_export, deploy_cfg):
    from gc25d_core.deploy.session import open_session

    session = open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(fp8="auto"))
    rt = session.runtime
    assert rt.options.fp8 is False and rt.fp8_layers == []
    assert rt.fp8_choice.startswith("fp8 off: it needs a CUDA device")


@pytest.mark.gpu
def test_fp8_session_under_cuda_graphs_stays_near_the_bf16_path(tiny_export, deploy_cfg):
    """26 cells (past a full window and the RoPE cap) with FP8 blocks and CUDA graphs against the
    bf16 graphed path: every forward replayed, the latents within 10 % relative RMSE per cell."""
    import numpy as np

    from gc25d_core.deploy.session import open_session

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("torchao")
    rng = np.random.default_rng(0)
    blocks = [np.array([rng.integers(0, 9), rng.integers(0, 2), 0, 0, 0], np.uint8) for _ in range(26)]

    def run(**opts):
        options = RuntimeOptions(decode=False, cuda_graphs=True, **opts)
        s = open_session(tiny_export, deploy_cfg, device="cuda", options=options)
        s.start()
        before = s.runtime.graphed.replays
        lat = [s.step(b).out.latent.float().cpu() for b in blocks]
        return lat, s.runtime, before

    ref, _, _ = run()
    got, rt, before = run(fp8=True, fp8_skip=("blocks.0.*",))
    assert rt.fp8_layers and not any(x.startswith("blocks.0.") for x in rt.fp8_layers)
    weight = rt.model.get_submodule(rt.fp8_layers[0]).weight
    assert "Float8" in type(weight).__name__, type(weight)
    assert rt.graphed.disabled is None and rt.graphed.replays - before == 5 * len(blocks)
    rel = [
        float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()) for a, b in zip(got, ref, strict=True)
    ]
    print(f"fp8 vs bf16 relative latent RMSE per cell: max {max(rel):.4f}, mean {np.mean(rel):.4f}")
    assert max(rel) < 0.10, rel
    assert max(rel) > 0  # FP8 did change the arithmetic
