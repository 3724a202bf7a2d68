"""Stage 3's FLOP split (bench/speed/stages.py): the parts add up, and each part counts the forwards
the step makes (issue 33's rollout share is read against it)."""

import pytest

from bench.speed.stages import stage3_flop_split

DRAWS = "27/3,21/3,27/2,27/2,22/2,21/1"  # the 2026-12-03 report's step 3


def test_the_parts_add_up_and_the_rollouts_are_above_half_of_the_step():
    res = stage3_flop_split(DRAWS, 10)
    t = res["tflop"]
    parts = t["rollouts"] + t["critic_updates"] + t["generator_exits"] + t["generator_scores"]
    assert parts == pytest.approx(t["total"], abs=0.3)  # rounded to 0.1 TFLOP each
    # the 6 rollouts' forwards outweigh the 5 critic updates' forward + backward: the floor of the
    # rollouts' share of the step where both run equally efficiently
    assert 0.5 < res["rollout_flop_share"] < 0.6


def test_more_exit_steps_cost_more_rollout_and_depth_scales_the_blocks():
    early = stage3_flop_split("27/0,27/0,27/0,27/0,27/0,21/1", 10)["tflop"]
    late = stage3_flop_split("27/3,27/3,27/3,27/3,27/3,21/1", 10)["tflop"]
    # exit step e: e + 1 denoise forwards + the commit per cell; 2 vs 5 forwards a cell
    assert late["rollouts"] > 2 * early["rollouts"]
    assert late["critic_updates"] == early["critic_updates"]
    deep = stage3_flop_split(DRAWS, 20)["tflop"]
    assert deep["critic_updates"] == pytest.approx(
        2 * stage3_flop_split(DRAWS, 10)["tflop"]["critic_updates"], rel=0.01
    )


def test_bad_draws_are_refused():
    with pytest.raises(SystemExit, match="critic draws"):
        stage3_flop_split("27/3,21/1", 10)
