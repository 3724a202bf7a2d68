"""The shared PNG plots (gc25d_core.plots) and a run's curves (gc25d_core.train.metrics.curves_png)."""

import math

import numpy as np

from gc25d_core.plots import decode_png, line_plot_png, nice_ticks, stack_png
from gc25d_core.train.metrics import curves_png


def test_line_plot_draws_each_series_over_its_own_x():
    png = line_plot_png(
        {"a": [1.0, None, 3.0, math.nan], "b": [2.0, 2.5]},
        "title Δ",
        "y",
        x={"a": [0, 10, 20, 30], "b": [5, 25]},
        log_y=True,
        xlabel="step",
        size=(400, 200),
    )
    rgb = decode_png(png)
    assert rgb.shape == (200, 400, 3)
    assert (rgb != 255).any(axis=2).sum() > 500  # axes, ticks, lines, legend


def test_ten_series_get_ten_colours():
    # the legend's swatch of series i sits 18 px below the one before, right of the plot
    names = [f"s{i}" for i in range(10)]
    rgb = decode_png(line_plot_png({n: [float(i), float(i) + 1] for i, n in enumerate(names)}, "t", "y"))
    swatches = {tuple(int(c) for c in rgb[30 + 18 * i + 14 - 4, 760 - 170 + 20]) for i in range(10)}
    assert len(swatches) == 10 and (255, 255, 255) not in swatches


def test_curves_png_has_a_panel_per_logged_quantity():
    train = [
        {"step": s, "loss": 1.0 / s, "lr": 1e-4, "grad_norm": 2.0, "samples_per_s": 3.0} for s in (1, 2, 3)
    ]
    val = [{"step": s, "cond_mse": 0.2, "uncond_mse": 0.3, "cond_mse_t500": 0.25} for s in (0, 3)]
    rgb = decode_png(curves_png(train, val) or b"")
    assert rgb.shape[0] == 6 * 260  # loss, lr, grad norm, samples/s, val per mode, val cond per t
    assert decode_png(curves_png(train[:1], []) or b"").shape[0] == 4 * 260
    assert curves_png([], []) is None


def test_stack_pads_to_the_widest_panel():
    a = line_plot_png({"x": [1, 2]}, "a", "y", size=(300, 100))
    b = line_plot_png({"x": [1, 2]}, "b", "y", size=(200, 120))
    rgb = decode_png(stack_png([a, b]))
    assert rgb.shape == (220, 300, 3) and np.all(rgb[150, 250] == 255)


def test_axis_ticks_fall_on_round_values_inside_the_range():
    assert nice_ticks(30, 570) == [100, 200, 300, 400, 500]  # a live sweep's segment middles, in s
    assert nice_ticks(0, 27) == [0, 5, 10, 15, 20, 25]  # cells
    assert nice_ticks(13.91, 16.52, 5) == [14.0, 15.0, 16.0]  # PSNR in dB
    assert nice_ticks(0.0012, 0.0031, 4) == [0.0015, 0.002, 0.0025, 0.003]
    assert nice_ticks(2.0, 2.0) == [2.0]
