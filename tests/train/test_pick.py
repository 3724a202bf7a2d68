"""SPEC §10 pick_sft: lowest mean cond val MSE among steps >= min_step, then the latest within 0.5 %."""

from __future__ import annotations

import json
import math

import pytest

from gc25d_core.train.pick import PickError, export_steps, pick_sft, pick_sft_run, read_val_scores


def test_lowest_wins_when_nothing_else_is_close():
    p = pick_sft({6000: 0.30, 7000: 0.20, 8000: 0.25})
    assert (p.step, p.best_step, p.score) == (7000, 7000, 0.20)
    assert p.candidates == ((7000, 0.20),)


def test_latest_within_half_a_percent_wins():
    scores = {6000: 0.2000, 7000: 0.2009, 8000: 0.2011, 9000: 0.2300}
    p = pick_sft(scores)
    assert p.best_step == 6000 and p.step == 7000  # 0.2009 <= 0.2 * 1.005 = 0.201 < 0.2011
    assert [s for s, _ in p.candidates] == [6000, 7000]
    assert p.threshold == pytest.approx(0.201)


def test_boundary_is_inclusive_and_rel_tol_configurable():
    assert pick_sft({6000: 1.0, 7000: 1.005}).step == 7000
    assert pick_sft({6000: 1.0, 7000: 1.005}, rel_tol=0.004).step == 6000
    assert pick_sft({6000: 1.0, 7000: 1.02}, rel_tol=0.05).step == 7000


def test_min_step_filters_and_is_configurable():
    scores = {1000: 0.01, 5500: 0.02, 6000: 0.50, 20000: 0.40}
    assert pick_sft(scores).step == 20000  # the very low early steps do not count
    assert pick_sft(scores, min_step=1000).step == 1000
    with pytest.raises(PickError, match="no step >= 30000"):
        pick_sft(scores, min_step=30000)


def test_nan_scores_and_unavailable_steps_are_skipped():
    scores = {6000: math.nan, 6500: 0.1, 7000: 0.3, 8000: math.inf}
    assert pick_sft(scores).step == 6500
    assert pick_sft(scores, available=[7000, 8000]).step == 7000  # 6500 has no export
    with pytest.raises(PickError, match="export"):
        pick_sft(scores, available=[5000])


def test_ties_pick_the_latest():
    assert pick_sft({6000: 0.2, 7000: 0.2, 8000: 0.2}).step == 8000


def test_run_folder_uses_val_log_and_exports(tmp_path):
    (tmp_path / "exports").mkdir()
    for s in (6000, 7000, 8000):
        (tmp_path / "exports" / f"step-{s:06d}.safetensors").write_bytes(b"x")
    records = [
        {"step": 6000, "cond_mse": 0.30},
        {"step": 6500, "cond_mse": 0.10},  # validated, never exported
        {"step": 7000, "cond_mse": 0.25},
        {"step": 8000, "cond_mse": 0.2505},
        {"step": 7000, "cond_mse": 0.24},  # a later record of the same step wins
    ]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_val_scores(tmp_path)[7000] == 0.24
    assert sorted(export_steps(tmp_path)) == [6000, 7000, 8000]
    p = pick_sft_run(tmp_path)
    assert p.step == 7000 and p.path == tmp_path / "exports" / "step-007000.safetensors"
    assert p.metadata()["path"].endswith("step-007000.safetensors")
