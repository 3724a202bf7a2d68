"""The distillation stages' learning checks on a finished chain (issues 18 and 19), with the eval's
own cases, samplers and metrics (gc25d_core.eval) on the clip28 sweep:

  stage 2   its EMA sampled in 4 steps (the deploy axis) against stage 1's export sampled with many
            Euler steps (--many, default 40) on the same KV rollout: latent MSE over cells 1..20
            (goal: the 4-step student within 1.5x)
  stage 3   its EMA's 4-step rollouts against stage 2's EMA's: latent MSE on cells 22..27 (where
            stage 2 never trained; goal lower) and on 1..21 (goal no worse)

Prints one JSON object. After `make run`:  python -m bench.quality.distill_checks [--snapshot v000001]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any


def cells_mean(curve: list[float | None], first: int, last: int) -> float:
    vals = [v for v in curve[first : last + 1] if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--snapshot", default="v000001")
    ap.add_argument("--many", type=int, default=40, help="Euler steps of stage 1's reference rollout")
    ap.add_argument("--clips", type=int, default=4, help="clip28 cases")
    args = ap.parse_args(argv)

    import torch

    from gc25d_core.config import load_config
    from gc25d_core.distributed import pick_device
    from gc25d_core.eval.evaluate import (
        EvalConfig,
        Reference,
        build_sampler,
        evaluate_export,
        exports_of_handoff,
        load_cases,
    )
    from gc25d_core.eval.samplers import CausalSampler, euler_points
    from gc25d_core.flow import WAN_SCHEDULE
    from gc25d_core.handoff import FINAL

    cfg = load_config(args.preset)
    runs = Path(cfg.paths.runs_root)
    exports = {}
    for stage in ("stage1_tf", "stage2_cd", "stage3_dmd"):
        for e in exports_of_handoff(stage, runs / stage / args.snapshot / FINAL, runs):
            exports[e.label] = e
    ecfg = EvalConfig(clip28_clips=args.clips, chain241_chains=0, decode=False)
    version = int(args.snapshot.lstrip("v"))
    cases, clips = load_cases(cfg, ecfg, version)
    ref = Reference(clips, None)
    device = pick_device(cfg)

    def curve(label: str, sampler: Any = None) -> tuple[list[float | None], float]:
        t0 = time.perf_counter()
        res = evaluate_export(exports[label], cfg, ecfg, cases, ref, sampler=sampler, keep_rollouts=0)
        return res["sweeps"]["clip28"]["curves"]["latent_mse"], time.perf_counter() - t0

    base = build_sampler(exports["stage1_tf"], cfg, ecfg, device)
    many = CausalSampler(base.model, base.text, base.spec, euler_points(WAN_SCHEDULE, args.many))
    s1_many, s1_s = curve("stage1_tf", many)
    s2_ema, s2_s = curve("stage2_cd_ema")
    s3_ema, s3_s = curve("stage3_dmd_ema")
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    s1, s2, s3 = (cells_mean(c, 1, 20) for c in (s1_many, s2_ema, s3_ema))
    ext2, ext3 = cells_mean(s2_ema, 22, 27), cells_mean(s3_ema, 22, 27)
    in2, in3 = cells_mean(s2_ema, 1, 21), cells_mean(s3_ema, 1, 21)
    out = {
        "bench": "distill_checks",
        "snapshot": args.snapshot,
        "clip28_cases": len(cases["clip28"]),
        "stage2": {
            "stage1_many_steps": args.many,
            "stage1_many_latent_mse_1_20": s1,
            "stage2_ema_4step_latent_mse_1_20": s2,
            "ratio": s2 / s1,
            "goal_within_1.5x": s2 <= 1.5 * s1,
        },
        "stage3": {
            "stage2_ema_latent_mse_22_27": ext2,
            "stage3_ema_latent_mse_22_27": ext3,
            "lower_on_22_27": ext3 < ext2,
            "stage2_ema_latent_mse_1_21": in2,
            "stage3_ema_latent_mse_1_21": in3,
            "no_worse_on_1_21": in3 <= in2,
            "stage3_ema_latent_mse_1_20": s3,
        },
        "seconds": {"stage1_many": s1_s, "stage2_ema": s2_s, "stage3_ema": s3_s},
    }
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
