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
