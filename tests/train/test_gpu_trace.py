"""train.gpu_trace: the GPU's busy time and idle gaps over a profiler window, from a Chrome trace."""

from __future__ import annotations

import pytest

from gc25d_core.train.gpu_trace import busy_summary, device_intervals


def test_overlapping_streams_count_once_and_gaps_are_ranked():
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "ts": 0, "dur": 1000},  # stream 7
            {"ph": "X", "cat": "kernel", "ts": 500, "dur": 1000},  # stream 13, overlaps: 0..1500
            {"ph": "X", "cat": "gpu_memcpy", "ts": 1600, "dur": 400},  # gap of 100 µs: too short to list
            {"ph": "X", "cat": "cpu_op", "ts": 2000, "dur": 5000},  # host work: not device time
            {"ph": "X", "cat": "kernel", "ts": 3000, "dur": 1000},  # gap of 1000 µs
            {"ph": "i", "cat": "kernel", "ts": 4500},  # not a complete event
            {"ph": "X", "cat": "gpu_memset", "ts": 6000, "dur": 2000},  # gap of 2000 µs
        ]
    }
    iv = device_intervals(trace)
    assert iv == [(0, 1000), (500, 1500), (1600, 2000), (3000, 4000), (6000, 8000)]
    out = busy_summary(iv, gap_us=500)
    assert out["window_s"] == pytest.approx(8000e-6)
    assert out["busy_s"] == pytest.approx((1500 + 400 + 1000 + 2000) * 1e-6)
    assert out["idle_s"] == pytest.approx(3100e-6)
    assert out["busy_frac"] == pytest.approx(4900 / 8000)
    assert out["gaps"] == 2 and out["gaps_s"] == pytest.approx(3000e-6)
    assert out["longest_gaps"] == [{"ms": 2.0, "at_s": 0.004}, {"ms": 1.0, "at_s": 0.002}]


def test_an_empty_window_is_all_zero():
    out = busy_summary([])
    assert out["window_s"] == 0 and out["busy_frac"] == 0 and out["longest_gaps"] == []


def test_device_time_by_kind_names_the_work_per_step():
    from gc25d_core.train.gpu_trace import device_time_by_kind, kernel_kind

    names = {
        "nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT": "gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64": "gemm",
        "triton_tem_fused_flex_attention_backward_0": "attention_flex",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>": "attention_fused",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention_fused",
        "triton_per_fused_add_mul_native_layer_norm_3": "triton_fused",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "collective",
        "multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>": "optimizer",
        "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>": "aten_elementwise",
        "something_new": "other",
    }
    assert {n: kernel_kind(n) for n in names} == names
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "nvjet_a", "dur": 3000},
            {"ph": "X", "cat": "kernel", "name": "nvjet_b", "dur": 1000},
            {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_mul_0", "dur": 500},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "dur": 200},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9000},  # host: not counted
        ]
    }
    out = device_time_by_kind(trace, per=2)  # two profiled steps
    assert list(out) == ["gemm", "triton_fused", "gpu_memcpy"]
    assert out["gemm"] == {"s": 0.002, "n": 1.0}
    assert out["triton_fused"] == {"s": 0.00025, "n": 0.5}
    assert out["gpu_memcpy"]["s"] == pytest.approx(1e-4)


def test_phase_summary_splits_device_work_by_labelled_host_range():
    from gc25d_core.train.gpu_trace import phase_summary

    def ann(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    def kern(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    trace = {
        "traceEvents": [
            ann("phase:rollout", 0, 1000),
            kern("nvjet_gemm_a", 100, 300),
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 50, "dur": 20},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 2050, "dur": 30},
            {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 3500, "dur": 10},  # no phase
            kern("flash_fwd", 200, 300),  # overlaps the gemm: busy 100..500
            kern("nvjet_gemm_a", 600, 100),
            ann("phase:rollout", 2000, 1000),
            kern("nvjet_gemm_a", 2100, 200),
            kern("Memcpy HtoD", 2900, 50, cat="gpu_memcpy"),
            ann("phase:update", 4000, 500),
            kern("adam_kernel", 4100, 400),
            ann("other", 5000, 100),  # not a phase
            kern("nvjet_gemm_a", 5000, 50),  # outside every phase
        ]
    }
    out = phase_summary(trace)
    assert set(out) == {"rollout", "update"}
    r = out["rollout"]
    assert r["n"] == 2 and r["wall_s"] == pytest.approx(2000e-6)
    assert r["busy_s"] == pytest.approx((400 + 100 + 200 + 50) * 1e-6)
    assert r["busy_frac"] == pytest.approx(750 / 2000, abs=1e-4)
    assert r["by_kind_s"] == {
        "gemm": pytest.approx(600e-6),
        "attention_fused": pytest.approx(300e-6),
        "gpu_memcpy": pytest.approx(50e-6),
    }
    assert r["top_kernels"][0] == {"name": "nvjet_gemm_a", "s": pytest.approx(600e-6), "n": 3}
    assert r["top_host"] == [{"name": "cudaGraphLaunch", "s": pytest.approx(50e-6), "n": 2}]
    assert out["update"]["by_kind_s"] == {"optimizer": pytest.approx(400e-6)}
    assert out["update"]["top_host"] == []
