"""Flow-matching 'Wan' shift-5 schedule numbers (research/diffsynth_wan22.md §4) and the denoise axis."""

from __future__ import annotations

import math

import pytest
import torch

from gc25d_core.flow import (
    DEPLOY_AXIS,
    WAN_SCHEDULE,
    DenoiseAxis,
    FlowSchedule,
    axis_sigma,
    noise_at_sigma,
    shift_sigma,
    x0_at_sigma,
)


def test_grid_and_sigma_values():
    s = WAN_SCHEDULE
    assert s.sigmas.shape == (1000,) and s.timesteps.shape == (1000,)
    assert bool((s.timesteps[1:] < s.timesteps[:-1]).all())  # strictly decreasing
    got = s.sigmas[[0, 250, 500, 750, 999]].tolist()
    want = [1.0, 0.9375, 5 / 6, 0.625, 0.005 / 1.004]
    assert got == pytest.approx(want, abs=1e-12)
    assert s.timesteps[0].item() == 1000.0
    assert s.timesteps[1].item() == pytest.approx(999.79984, abs=1e-5)
    assert s.timesteps[999].item() == pytest.approx(4.98008, abs=1e-5)
    assert shift_sigma(0.5).item() == pytest.approx(5 / 6)


def test_training_weight_values():
    s = WAN_SCHEDULE
    w = s.weights
    assert w.sum().item() == pytest.approx(1000.0, abs=1e-9)  # mean 1 over the grid
    assert w[[0, 250, 500, 750, 999]].tolist() == pytest.approx(
        [0.0, 0.39795, 1.02486, 1.91404, 0.03188], abs=1e-5
    )
    assert w[0].item() == 0.0  # the pure-noise step contributes nothing
    assert w.max().item() == pytest.approx(2.0764, abs=1e-4)
    assert abs(s.timesteps[w.argmax()].item() - 500) < 1.0
    assert s.training_weight(1000.0).item() == 0.0
    assert s.training_weight(torch.tensor([500.0, 250.0, 50.0])).tolist() == pytest.approx(
        [2.0764, 1.4637, 0.3068], abs=1e-4
    )


def test_nearest_lookup_and_sampling():
    s = WAN_SCHEDULE
    assert s.index_of(1000.0).item() == 0
    assert s.index_of(s.timesteps[123].item() + 0.01).item() == 123
    assert s.sigma(625.0).item() == pytest.approx(0.625)
    g = torch.Generator().manual_seed(0)
    idx = s.sample_index(g, 20000)
    assert idx.min().item() >= 0 and idx.max().item() <= 999
    assert abs(idx.float().mean().item() - 499.5) < 6.0  # uniform over the 1000 grid points


def test_add_noise_target_and_conversions():
    s = WAN_SCHEDULE
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 3, 4, generator=g)
    eps = torch.randn(2, 3, 4, generator=g)
    t = torch.tensor([1000.0, 625.0])
    x_t = s.add_noise(x0, eps, t)
    assert torch.allclose(x_t[0], eps[0])  # sigma 1: pure noise
    assert torch.allclose(x_t[1], 0.375 * x0[1] + 0.625 * eps[1])
    v = s.velocity_target(x0, eps)
    assert torch.allclose(v, eps - x0)
    assert torch.allclose(s.x0_from_velocity(x_t, v, t), x0, atol=1e-6)
    # one Euler step with the true velocity lands on the straight path; t_next = 0 gives x0
    assert torch.allclose(
        s.euler_step(x_t, v, t, torch.tensor([625.0, 0.0])),
        torch.stack([s.add_noise(x0, eps, 625.0)[0], x0[1]]),
        atol=1e-6,
    )


def test_other_grid_sizes_keep_the_template_correction():
    s = FlowSchedule(num_steps=48)
    assert s.timesteps[0].item() == 1000.0 and len(s.weights) == 48
    base = (lambda y: (y - y.min()) * 48 / (y - y.min()).sum())(
        torch.exp(-2 * ((s.timesteps - 500) / 1000) ** 2)
    )
    assert torch.allclose(s.weights, base * 48 / 1000 + base[1])


def test_denoise_axis_definition_and_metadata():
    assert DEPLOY_AXIS.warp
    assert DEPLOY_AXIS.timesteps == pytest.approx((1000.0, 937.5, 2500 / 3, 625.0))
    assert DEPLOY_AXIS.sigmas == pytest.approx((1.0, 0.9375, 5 / 6, 0.625))
    plain = DenoiseAxis(warp=False)
    assert plain.timesteps == (1000.0, 750.0, 500.0, 250.0)
    meta = DEPLOY_AXIS.to_metadata()
    assert meta["denoise_axis_warp"] == "true"
    assert DenoiseAxis.from_metadata(meta) == DEPLOY_AXIS
    bad = {**meta, "denoise_axis": "[1000, 750, 500, 250]"}
    with pytest.raises(ValueError, match="differs"):
        DenoiseAxis.from_metadata(bad)
    with pytest.raises(ValueError):
        DenoiseAxis(nominal=(500.0, 750.0))
    assert math.isclose(DEPLOY_AXIS.timesteps[1], WAN_SCHEDULE.timesteps[250].item())


def test_the_formulas_at_a_given_sigma_are_the_schedules_per_cell_and_on_the_axis():
    """noise_at_sigma / x0_at_sigma: the schedule's add_noise / x0_from_velocity at a σ given
    directly (bit for bit with a per-clip σ), per cell through broadcasting, exact inverses, and the
    axis's σ = t / 1000."""
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(2, 4, 5, 3, 3, generator=g), torch.randn(2, 4, 5, 3, 3, generator=g)
    t = torch.tensor([300.0, 800.0])
    sigma = WAN_SCHEDULE.sigma(t).float().view(2, 1, 1, 1, 1)
    assert torch.equal(noise_at_sigma(x0, eps, sigma), WAN_SCHEDULE.add_noise(x0, eps, t))
    v = WAN_SCHEDULE.velocity_target(x0, eps)
    x_t = WAN_SCHEDULE.add_noise(x0, eps, t)
    assert torch.equal(x0_at_sigma(x_t, v, sigma), WAN_SCHEDULE.x0_from_velocity(x_t, v, t))
    per_cell = torch.linspace(0.0, 1.0, 5).view(1, 1, 5, 1, 1)
    mixed = noise_at_sigma(x0, eps, per_cell)
    assert torch.equal(mixed[:, :, 0], x0[:, :, 0]) and torch.equal(mixed[:, :, -1], eps[:, :, -1])
    torch.testing.assert_close(x0_at_sigma(mixed, eps - x0, per_cell), x0)
    assert noise_at_sigma(x0, eps, 0.25).equal((1.0 - 0.25) * x0 + 0.25 * eps)  # a float stays a float
    assert [axis_sigma(t) for t in DEPLOY_AXIS.timesteps] == list(DEPLOY_AXIS.sigmas)
    assert axis_sigma(625.0) == 0.625


def test_no_noising_or_x0_formula_is_written_outside_flow_py():
    """Every x_t = (1 − σ)·x0 + σ·ε and x0 = x_t − σ·v of the library goes through gc25d_core.flow
    (the schedule's methods or the helpers at a given σ), so one definition serves training, eval
    and deploy."""
    import io
    import re
    import tokenize
    from pathlib import Path

    import gc25d_core

    def code_lines(path: Path) -> dict[int, str]:
        """The file's code without its strings and comments (docstrings may write the formulas)."""
        lines: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type not in (tokenize.STRING, tokenize.COMMENT):
                lines[tok.start[0]] = lines.get(tok.start[0], "") + " " + tok.string
        return lines

    root = Path(gc25d_core.__file__).parent
    hand_written = re.compile(
        r"\(\s*1(\.0)?\s*-\s*(sigma|s_next|s|σ)\w*\s*\)\s*\*"  # (1 − σ)·x
        r"|-\s*(float\s*\()?[\w.\s]*sigma\w*\s*(\([^()]*\))?\s*\)?\s*\*"  # x − σ·v
    )
    found = [
        f"{path.relative_to(root)}:{n}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "flow.py"
        for n, line in code_lines(path).items()
        if hand_written.search(line)
    ]
    assert not found, "\n".join(found)
