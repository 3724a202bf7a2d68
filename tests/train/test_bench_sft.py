"""bench/speed/sft.py's pieces that decide what a GPU run reports: variant composition and the
step-time statistics (the GPU run itself is recorded in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.common import ROOT
from bench.speed import sft as bench


def test_variant_modifiers_merge_on_top_of_the_base():
    v = bench.variant("nockpt_fused_compile_ctas8+fa4+percell")
    assert v["model"]["attn_backend"] == "fa4"
    assert v["model"]["overrides"] == {"fused_rmsnorm": True, "per_cell_time": True}
    assert v["zero"] == {"overlap_comm": True, "reduce_bucket_size": 200_000_000}
    assert v[bench.ENV] == {"NCCL_MAX_CTAS": "8", "NCCL_MAX_NCHANNELS": "8"}
    assert "attn_backend" not in bench.VARIANTS["nockpt_fused_compile_ctas8"]["model"]  # base untouched
    for bad in ("no_such_variant", "nockpt_fused+no_such_modifier"):
        with pytest.raises(SystemExit, match="unknown variant"):
            bench.variant(bad)


def test_v10_variant_is_the_preset_and_named_variants_keep_their_measured_settings():
    """``v10`` runs configs/sft/v10.yaml untouched; the other names mean what they were measured as
    before the preset turned per-cell modulation on and the overlapped reduction off."""
    import yaml

    preset = yaml.safe_load((ROOT / "configs/sft/v10.yaml").read_text())
    assert preset["model"]["overrides"]["per_cell_time"] is True
    assert preset["zero"]["overlap_comm"] is False
    assert bench.variant("v10") == {}
    assert bench.variant("v10+fa4") == {"model": {"attn_backend": "fa4"}}
    assert bench.variant("v10+nanfill") == {bench.ENTRY: "bench.probes.with_nan_fill"}
    plain = bench.variant("nockpt_fused_compile")
    assert plain["model"]["overrides"]["per_cell_time"] is False
    assert plain["zero"]["overlap_comm"] is True
    assert bench.variant("nockpt_fused_compile_nooverlap+percell")["zero"]["overlap_comm"] is False
    assert bench.variant("nockpt_fused_compile_nooverlap+percell")["model"]["overrides"]["per_cell_time"]


def test_summary_leaves_out_warmup_epoch_restarts_and_loader_waits():
    steps = [  # (step_s, epoch, data_wait_s)
        (10.0, 0, 0.9),  # warm-up
        (2.0, 0, 0.0),  # warm-up
        (1.5, 0, 0.0),
        (1.6, 0, 0.2),  # the loader was late
        (1.4, 0, 0.001),
        (3.0, 1, 0.9),  # the first step of an epoch
        (1.42, 1, 0.0006),
    ]
    records = [{"step_s": s, "epoch": e, "data_wait_s": w} for s, e, w in steps]
    out = bench.summarize(records, 2, 1e15, "step_s")
    assert out["steps_measured"] == 5
    assert out["step_s_median"] == 1.5
    assert out["step_s_median_in_epoch"] == pytest.approx(1.46)  # 1.5, 1.6, 1.4, 1.42
    assert out["step_s_median_loader_ready"] == 1.42  # 1.5, 1.4, 1.42
    assert out["data_wait_s_max"] == 0.9
    assert out["mfu_median"] == pytest.approx(1e15 / 1.5 / 989e12)
