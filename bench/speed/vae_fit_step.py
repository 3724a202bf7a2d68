"""The tiny VAE fit's step time under its levers, side by side in one process (docs/benchmarks.md).

The `small` preset's picture is capped by its tiny VAE, and the VAE gains with fit steps
(docs/picture_study.md), so a faster step is more picture per device call. Each variant is
``fit_tiny_vae`` itself with the preset's fit settings (batch, frames, crop, lr, widths) on clips of
the preset's frame size, run ``--steps`` steps; variants alternate for ``--rounds`` rounds so drift of
the machine lands on all of them. A step's content does not change its time, so the clips are noise.
Prints one JSON line per fit and a summary line: each variant's median step (the first
``--warmup`` steps left out: cuDNN's autotuning, the allocator), its speed-up over the plain fit,
and the first and last losses (the variants are the same math with other rounding).

Usage (the device machine): python -m bench.speed.vae_fit_step --preset small --device cuda
    [--variants plain,fast_ops,bf16,fast_ops+bf16] [--steps 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from bench.common import emit

LEVERS = ("fast_ops", "bf16")


def levers_of(variant: str) -> dict[str, bool]:
    """``plain`` or ``+``-joined lever names: fit_tiny_vae's keyword arguments."""
    names = set() if variant == "plain" else set(variant.split("+"))
    if not names <= set(LEVERS):
        raise ValueError(f"--variants: {variant!r}: levers are {', '.join(LEVERS)} (or plain)")
    return {k: k in names for k in LEVERS}


def time_fit(clips: list[np.ndarray], fit: Any, device: str, steps: int, **levers: bool) -> dict[str, Any]:
    import torch

    from gc25d_core.models.vae_fit import fit_tiny_vae

    torch.backends.cudnn.benchmark = False  # fast_ops turns it on process-wide; each variant its own
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ends: list[float] = []
    losses: list[float] = []

    def log(step: int, loss: float) -> None:
        ends.append(time.perf_counter())
        losses.append(loss)

    t0 = time.perf_counter()
    fit_tiny_vae(
        clips, steps=steps, batch=fit.batch, frames=fit.frames, lr=fit.lr, crop=fit.crop, seed=fit.seed,
        norm_frames=fit.frames, device=device, dim=fit.dim, dec_dim=fit.dec_dim, log=log, **levers,
    )  # fmt: skip
    return {
        "gaps": np.diff([t0, *ends]).tolist(),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="plain,fast_ops,bf16,fast_ops+bf16")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clips", type=int, default=4, help="noise clips of the preset's frame size")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps}: must be more than --warmup {args.warmup}")
    import torch

    from gc25d_core.config import load_config

    cfg = load_config(args.preset)
    fit = cfg.vae.fit
    g = cfg.geometry
    variants = args.variants.split(",")
    levers = {v: levers_of(v) for v in variants}
    rng = np.random.default_rng(0)
    clips = [
        rng.integers(0, 256, (2 * fit.frames, g.dst_height, g.dst_width, 3), np.uint8)
        for _ in range(args.clips)
    ]
    steps_s: dict[str, list[float]] = {v: [] for v in variants}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            run = time_fit(clips, fit, args.device, args.steps, **levers[v])
            steps_s[v] += run["gaps"][args.warmup :]
            runs[v].append(run)
            median = statistics.median(run["gaps"][args.warmup :])
            emit(variant=v, round=r, median_step_s=round(median, 4), first_step_s=round(run["gaps"][0], 2),
                 loss_first=run["loss_first"], loss_last=run["loss_last"], peak_gib=run["peak_gib"])  # fmt: skip
    plain = statistics.median(steps_s[variants[0]])
    emit(
        summary=True,
        preset=args.preset,
        device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        batch=fit.batch,
        crop=fit.crop,
        frames=fit.frames,
        widths=[fit.dim, fit.dec_dim],
        steps=args.steps,
        rounds=args.rounds,
        median_step_s={v: round(statistics.median(s), 4) for v, s in steps_s.items()},
        speedup_vs_first={v: round(plain / statistics.median(s), 3) for v, s in steps_s.items()},
        loss_last={v: [round(r["loss_last"], 5) for r in rs] for v, rs in runs.items()},
    )


if __name__ == "__main__":
    main()
