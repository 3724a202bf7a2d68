"""One export played twice through the live session the deploy CLI opens (``python -m
gc25d_core.deploy``): with its default options, then with extra CLI flags (``--fp8``, ``--decoder
fast``, ...), over the same action stream and world. Per cell: the latent RMSE relative to the
first path's latent RMS, and the PSNR of its decoded frames against the first path's; for both, a
session step's wall time (code world included) over every cell from the first, and after the
window fills. Prints one JSON line (issue 34: FP8's and the fast decoder's error on a trained
student, where the deploy bench has random weights only).

Usage (GPU; the small preset's chain in /tmp/small):
    python -m bench.quality.lever_error --preset small --set paths.data_root=/tmp/small/data \\
        --set paths.runs_root=/tmp/small/runs --export <deploy.safetensors> --against=--fp8
CPU (tiny): python -m bench.quality.lever_error --export <causal export> --against=--fold-commit --cells 8
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import print_result
from gc25d_core.deploy import cli
from gc25d_core.deploy.world import varied_blocks
from gc25d_core.models.configs import DEPLOY_CAUSAL


def play_path(args: argparse.Namespace, blocks: list[np.ndarray]) -> dict[str, Any]:
    """Every cell's latent (CPU fp32), every frame (uint8), and the wall time of each step."""
    session, _, what = cli.open_from_args(args)
    frames = list(session.start())
    latents, wall = [], []
    for block in blocks:
        t0 = time.perf_counter()
        s = session.step(block)
        wall.append(time.perf_counter() - t0)
        frames += s.out.frames
        latents.append(s.out.latent.detach().float().cpu())
    frames += session.runtime.flush()
    del session
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"what": what, "latents": latents, "frames": frames, "wall": wall}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float(10 * np.log10(255**2 / mse)) if mse > 0 else float("inf")


def summary(xs: list[float]) -> dict[str, float]:
    q = np.percentile(xs, [50, 99]) if xs else [float("nan")] * 2
    return {
        "mean": statistics.fmean(xs),
        "p50": float(q[0]),
        "p99": float(q[1]),
        "max": max(xs),
        "min": min(xs),
    }


def compare(base: dict[str, Any], other: dict[str, Any], window: int) -> dict[str, Any]:
    if len(base["frames"]) != len(other["frames"]):
        raise RuntimeError(f"frame counts differ: {len(base['frames'])} vs {len(other['frames'])}")
    rel = [
        float((x - y).pow(2).mean().sqrt() / x.pow(2).mean().sqrt().clamp_min(1e-12))
        for x, y in zip(base["latents"], other["latents"], strict=True)
    ]
    frame_db = [psnr(a, b) for a, b in zip(base["frames"], other["frames"], strict=True)]
    finite = [d for d in frame_db if np.isfinite(d)]
    return {
        "latent_rel_rmse": summary(rel),
        "frame_psnr_db": {**summary(finite), "identical_frames": len(frame_db) - len(finite)}
        if finite
        else {"identical_frames": len(frame_db)},
        # a session step's wall (code world, denoise, commit, decode) of every cell from the first
        "cell_s": {"base": summary(base["wall"]), "against": summary(other["wall"])},
        "cell_s_after_window": {
            "base": summary(base["wall"][window:]) if len(base["wall"]) > window else None,
            "against": summary(other["wall"][window:]) if len(other["wall"]) > window else None,
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_session_options(p)
    p.add_argument("--against", required=True, help="the CLI flags of the second path, one string")
    p.add_argument("--cells", type=int, default=240, help="cells played after the anchor (default 240)")
    p.add_argument("--action-seed", type=int, default=0, help="seed of the action stream")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    other = p.parse_args([*(argv if argv is not None else sys.argv[1:]), *shlex.split(args.against)])
    if args.export is None:
        p.error("--export is required: the two paths must play the same file")
    blocks = varied_blocks(args.cells, seed=args.action_seed)
    window = DEPLOY_CAUSAL.sink + (DEPLOY_CAUSAL.window or 0)  # cells until the deploy window is full
    base = play_path(args, blocks)
    against = play_path(other, blocks)
    result = {
        "bench": "lever_error",
        "export": str(args.export),
        "preset": args.preset,
        "against": args.against,
        "cells": args.cells,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "base_path": base["what"],
        **compare(base, against, window),
    }
    return print_result(result, args.out)


if __name__ == "__main__":
    main()
