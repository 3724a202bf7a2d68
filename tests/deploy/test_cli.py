"""The CLI: a scripted play writes an MP4 (RGB | ids) that decodes back to 1 + 4 * cells frames,
with its per-cell timings; the default export is the newest causal hand-off; errors name the cause."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gc25d_core.deploy.actions import keys_to_block, parse_script
from gc25d_core.deploy.cli import main
from gc25d_core.deploy.locate import NoExportError, newest_causal_export
from gc25d_core.preview import video_info


def test_play_writes_an_mp4_of_the_expected_frames(tiny_export, deploy_cfg, tmp_path, capsys):
    out = tmp_path / "play.mp4"
    runs = str(deploy_cfg.paths.runs_root)
    argv = ["play", "--export", str(tiny_export), "--actions", "fwd*2,run_right,light", "--out", str(out)]
    argv += ["--set", f"paths.runs_root={runs}", "--set", "vae.fit.enabled=false", "--device", "cpu"]
    assert main(argv) == 0
    info = video_info(out)
    g = deploy_cfg.geometry
    assert info["frames"] == 1 + 4 * 4
    assert (info["width"], info["height"]) == (2 * 2 * g.dst_width, 2 * g.dst_height)  # rgb | ids, x2
    summary = json.loads((tmp_path / "play.mp4.json").read_text())
    assert [c["key"] for c in summary["cells"]] == [
        "walk_forward",
        "walk_forward",
        "run_right",
        "light_attack",
    ]
    assert all(c["denoise"] > 0 and c["decode"] > 0 and c["total"] > 0 for c in summary["cells"])
    # the commit forward is timed on its own (it was 0.0 in every cell while forwards went untimed)
    assert all(c["commit"] > 0 for c in summary["cells"])
    assert summary["timing"] == "per forward, device-synchronised; commit timed apart"
    printed = capsys.readouterr()
    assert json.loads(printed.out.strip().splitlines()[-1])["frames"] == 17
    # the session's line names the CUDA-only choices (a CPU runs the exact path: neither FP8 nor FA4)
    assert "fp8 off, kv attention sdpa" in printed.err


def test_a_folded_commit_has_no_time_of_its_own(tiny_export, deploy_cfg, tmp_path):
    out = tmp_path / "fold.mp4"
    argv = ["play", "--export", str(tiny_export), "--actions", "fwd*2", "--out", str(out), "--fold-commit"]
    argv += ["--set", f"paths.runs_root={deploy_cfg.paths.runs_root}", "--set", "vae.fit.enabled=false"]
    assert main([*argv, "--device", "cpu"]) == 0
    summary = json.loads((tmp_path / "fold.mp4.json").read_text())
    assert [c["commit"] for c in summary["cells"]] == [None, None]
    assert all(c["denoise"] > 0 for c in summary["cells"])
    assert "commit folded into the next cell's first forward" in summary["timing"]


def test_cli_errors_name_the_cause(tmp_path, capsys):
    argv = ["play", "--set", f"paths.runs_root={tmp_path / 'runs'}", "--device", "cpu"]
    assert main(argv) == 2
    assert "no causal export under" in capsys.readouterr().err
    assert main([*argv, "--actions", "fwd*2,moonwalk"]) == 2
    assert "unknown action 'moonwalk'" in capsys.readouterr().err
    assert main([*argv, "--actions", "9.0.0.0.0"]) == 2
    assert "field move=9" in capsys.readouterr().err


def test_newest_causal_export_prefers_later_stages(tmp_path, tiny_export):
    import shutil

    from gc25d_core.handoff import handoff_of, write_handoff_file

    with pytest.raises(NoExportError, match="stage1_tf"):
        newest_causal_export(tmp_path)
    export = tmp_path / "exports" / tiny_export.name  # hand-offs name exports inside their runs root
    export.parent.mkdir()
    shutil.copy(tiny_export, export)
    (tmp_path / "stage1_tf" / "v000001").mkdir(parents=True)
    write_handoff_file(
        tmp_path / "stage1_tf/v000001/final.json", handoff_of("stage1_tf", 5, export, runs_root=tmp_path)
    )
    assert newest_causal_export(tmp_path).source == "stage1_tf/v000001 (export)"
    (tmp_path / "stage3_dmd" / "v000001").mkdir(parents=True)
    write_handoff_file(
        tmp_path / "stage3_dmd/v000001/final.json",
        handoff_of("stage3_dmd", 5, export, export, runs_root=tmp_path),
    )
    found = newest_causal_export(tmp_path)
    assert found.source == "stage3_dmd/v000001 (ema)" and found.path == export.resolve()


def test_scripts_and_keys_to_blocks():
    assert [b.tolist() for b in parse_script("fwd*2,run_left,0.0.2.0.0")] == [
        [1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [3, 1, 0, 0, 0],
        [0, 0, 2, 0, 0],
    ]
    assert keys_to_block(["w", "d", "shift"]).tolist() == [6, 1, 0, 0, 0]
    assert keys_to_block(["s", "a"]).tolist() == [7, 0, 0, 0, 0]
    assert keys_to_block(["j", " ", "x"]).tolist() == [0, 0, 1, 0, 1]
    assert keys_to_block([]).dtype == np.uint8


def test_the_fast_path_is_the_default_on_cuda_and_exact_selects_the_oracle():
    from gc25d_core.deploy.cli import build_parser, runtime_options

    def opts(*flags: str, cuda: bool):
        return runtime_options(build_parser().parse_args(["play", *flags]), cuda=cuda)

    fast = opts(cuda=True)
    assert fast.cuda_graphs and fast.decode_fast and fast.decode_dtype == "bf16" and not fast.decode_stream
    assert fast.decode_graph  # bench lever graphs_all_cstream_compile: the fastest measured
    assert fast.defer_commit and fast.commit_stream and not fast.fold_commit
    assert fast.compile and fast.rotate_compile and fast.rope_compile
    uncompiled = opts("--no-compile", cuda=True)  # graphs_all_cstream: the exact path's latents
    assert not uncompiled.compile and not uncompiled.rotate_compile and not uncompiled.rope_compile
    assert uncompiled.cuda_graphs
    with pytest.raises(ValueError, match="--exact contradicts --compile"):
        opts("--exact", "--compile", cuda=True)
    exact = opts("--exact", cuda=True)
    assert not exact.compile and not exact.rotate_compile and not exact.rope_compile
    assert not exact.cuda_graphs and not exact.decode_fast and exact.decode_dtype == "fp32"
    assert not exact.decode_graph and not exact.defer_commit and not exact.commit_stream
    assert opts(cuda=False) == exact  # a CPU runs the exact path
    assert fast.fp8 == "auto" and exact.fp8 is False  # the runtime decides by the GPU and the width
    assert opts("--no-fp8", cuda=True).fp8 is False and opts("--fp8", cuda=False).fp8 is True
    assert opts("--fp8-skip", "blocks.0.*", cuda=True).fp8_skip == ("blocks.0.*",)
    with pytest.raises(ValueError, match="--fp8-skip needs FP8"):
        opts("--no-fp8", "--fp8-skip", "blocks.0.*", cuda=True)
    with pytest.raises(ValueError, match="--exact contradicts --fp8"):
        opts("--exact", "--fp8", cuda=True)
    assert fast.kv_attention == "auto" and exact.kv_attention == "sdpa"  # the runtime decides on CUDA
    assert opts("--kv-attention", "sdpa", cuda=True).kv_attention == "sdpa"
    assert opts("--kv-attention", "fa4", cuda=True).kv_attention == "fa4"
    with pytest.raises(ValueError, match="--kv-attention fa4 contradicts --exact"):
        opts("--exact", "--kv-attention", "fa4", cuda=True)
    stream = opts("--decode-stream", cuda=True)
    assert stream.decode_stream and not stream.decode_graph  # the pair is not measured
    assert stream.defer_commit and not stream.commit_stream  # nor the two side streams together
    assert not opts("--no-commit-stream", cuda=True).commit_stream
    assert opts("--decode-stream", "--commit-stream", cuda=True).commit_stream
    with pytest.raises(ValueError, match="--commit-stream needs the deferred commit"):
        opts("--fold-commit", "--commit-stream", cuda=True)
    assert opts("--decode-graph", cuda=False).decode_graph
    folded = opts("--fold-commit", cuda=True)
    assert folded.cuda_graphs and not folded.defer_commit  # the fold graphed per fill level
    assert opts("--defer-commit", cuda=False).defer_commit
    with pytest.raises(ValueError, match="--fold-commit contradicts --defer-commit"):
        opts("--fold-commit", "--defer-commit", cuda=True)
    with pytest.raises(ValueError, match="--exact contradicts"):
        opts("--exact", "--defer-commit", cuda=True)
    with pytest.raises(ValueError, match="--exact contradicts"):
        opts("--exact", "--cuda-graphs", cuda=True)
    with pytest.raises(ValueError, match="--exact contradicts"):
        opts("--exact", "--decode-graph", cuda=True)
