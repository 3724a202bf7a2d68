"""bench/quality/small_chain.py's choice of lever checks (the GPU chain's `--levers`)."""

from __future__ import annotations

import pytest

from bench.quality.small_chain import lever_checks


def test_the_lever_checks_are_the_named_ones_in_order_and_unknown_names_are_refused():
    assert lever_checks(None, smoke=False) == ["--decoder fast", "--fp8"]
    assert lever_checks(None, smoke=True) == ["--decoder fast"]  # no FP8 on a CPU
    assert lever_checks("fp8", smoke=False) == ["--fp8"]
    assert lever_checks("", smoke=False) == []
    with pytest.raises(SystemExit, match=r"\['int4'\] are not among"):
        lever_checks("fp8,int4", smoke=False)


def test_without_this_runs_fit_the_default_checks_leave_the_fast_decoder_out():
    assert lever_checks(None, smoke=False, fitted=False) == ["--fp8"]
    assert lever_checks(None, smoke=True, fitted=False) == []
    assert lever_checks("fast", smoke=False, fitted=False) == ["--decoder fast"]  # asked: it runs
