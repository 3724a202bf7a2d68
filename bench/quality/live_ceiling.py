"""The truth of a live sweep through a VAE, per segment: what a model with perfect latents would show
over the eval's scripted session, for a VAE alone (no export).

The eval scores it beside the exports where ``EvalConfig.live_ceiling`` is on (the GPU presets);
this reads it for any fitted VAE, on a CPU, to tell a segment the VAE draws badly from a model's
drift. The same script, world and truth renderer as the eval (``gc25d_core.eval.live``); the decode
is the whole session in one go, within 0.05 dB of the session's streamed one
(tests/eval/test_live.py).

    python -m bench.quality.live_ceiling --preset small --vae tiny_vae.safetensors --sha256 HEX \
        [--sweep live240] [--workers 2]

Prints one JSON line: the sweep, the VAE, per segment PSNR of the truth through the VAE, the drift
slope (dB per minute) and the seconds of each part.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="a preset name or a run's config.yaml (its geometry)")
    ap.add_argument("--vae", type=Path, required=True, help="a fitted tiny VAE (.safetensors)")
    ap.add_argument("--sha256", required=True, help="the VAE file's SHA256 (checked before it is read)")
    ap.add_argument("--sweep", default="live240", help="live240 (60 s) or live2400 (10 min)")
    ap.add_argument("--cells", type=int, default=None, help="a shorter session (a quick look)")
    ap.add_argument("--workers", type=int, default=1, help="processes that draw the truth")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from gc25d_core.config import load_config
    from gc25d_core.eval import live as L
    from gc25d_core.eval import metrics as M
    from gc25d_core.eval.live_score import drift_slope, per_segment
    from gc25d_core.jobs.eval_live import DeployBackend
    from gc25d_core.models.vae import decode_frames
    from gc25d_core.models.vae_fit import load_tiny_vae

    cfg = load_config(args.preset, {"vae": {"path": str(args.vae), "sha256": args.sha256}})
    sweep = L.live_sweep(args.sweep, args.cells)
    vae = load_tiny_vae(args.vae, expected_sha256=args.sha256, device=torch.device("cpu"), field="--sha256")
    t0 = time.perf_counter()
    truth = L.render_truth(
        DeployBackend(cfg, vae, torch.device("cpu")),
        L.session_script(sweep.script_seed, sweep.cells),
        workers=args.workers,
    )
    t1 = time.perf_counter()
    decoded = decode_frames(vae, L.truth_latents(vae, np.array(truth.frames)))
    t2 = time.perf_counter()
    psnr = M.psnr_per_frame(decoded, truth.frames)
    means = per_segment(sweep, psnr)
    segments = [
        {"t0_s": (lo - 1) / L.CELLS_PER_SECOND, "t1_s": hi / L.CELLS_PER_SECOND, "psnr": v}
        for (lo, hi), v in zip(sweep.segments(), means, strict=True)
    ]
    out = {
        "sweep": sweep.name,
        "cells": sweep.cells,
        "vae": str(args.vae),
        "sha256": args.sha256,
        "psnr_cell0": float(np.mean(psnr[:1])),
        "segments": segments,
        "drift_slope_db_per_min": drift_slope(sweep, means),
        "truth_s": round(t1 - t0, 1),
        "encode_decode_s": round(t2 - t1, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
