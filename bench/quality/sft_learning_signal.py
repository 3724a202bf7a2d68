"""Does the SFT teacher learn to use the semantic ids? (issue 7, learning signal)

Trains the tiny GcDiT through the real entry point (torchrun, 2 gloo ranks, DeepSpeed ZeRO-2 on CPU),
validating every ``--val-every`` steps on every val clip, and prints per validation step the cond /
uncond (ids all UNKNOWN) / null-text MSE at t = 200, 500, 800, then a summary: cond vs uncond at
t=500, absolute and relative gap, and whether cond is below uncond at every validation from
``--from-step`` on. Worlds:

  codeworld  the embedded default's training cache (``make run`` builds data/tiny/cache): code-world
             ids, latents from the tiny *random* VAE
  codeworld_fitted
             the same clips (cond, meta, index, text table copied from data/tiny/gc25d), latents
             re-encoded with a tiny VAE of the same class fitted to the train clips' frames
             (gc25d_core.models.vae_fit, --vae-steps), packed into a cache of its own
  synthetic  gc25d_core/train/synthetic.py with latents the ids determine (a fixed vector per id, pooled per
             latent pixel, + noise): what a VAE that keeps the picture would give

Usage: make run && python -m bench.quality.sft_learning_signal --world codeworld --steps 600 --val-every 50
       make run && python -m bench.quality.sft_learning_signal --world codeworld_fitted --steps 1000
       python -m bench.quality.sft_learning_signal --world synthetic --steps 600 --val-every 50
Options: --run-dir DIR (default outputs/learning_signal_<world>)  --lr / --cond-lr (default: the tiny preset)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, bench_env, torchrun


def fitted_vae_world(run_dir: Path, vae_steps: int):
    """The embedded default's clips with latents from a tiny VAE fitted to their train frames."""
    import torch

    from gc25d_core.cache.from_layout import pack_and_publish
    from gc25d_core.config import load_config
    from gc25d_core.index import read_index
    from gc25d_core.layout import Layout
    from gc25d_core.models.vae_fit import fit_tiny_vae, save_tiny_vae
    from gc25d_core.preprocess.latents import load_clip_frames, run_latents
    from gc25d_core.preprocess.tasks import RunCache

    base = load_config("tiny")
    rows = sorted(read_index(Layout(Path(base.paths.data_root))), key=lambda r: r.clip_id)
    runs = RunCache(Path(base.raw.root))
    train = [load_clip_frames(runs(r), r.start, base) for r in rows if r.split == "train"]
    t0 = time.perf_counter()
    vae, fit = fit_tiny_vae(train, steps=vae_steps)
    vae_path = run_dir / "tiny_vae.safetensors"
    digest = save_tiny_vae(vae, vae_path)
    print(
        json.dumps({"probe": "tiny_vae_fit", "train_clips": len(train), "s": time.perf_counter() - t0, **fit})
    )
    data = run_dir / "data"
    for p in (data, run_dir / "cache"):
        if p.exists():
            shutil.rmtree(p)
    shutil.copytree(base.paths.data_root, data, ignore=shutil.ignore_patterns("latents"))
    cfg = load_config(
        "tiny",
        {
            "paths": {"data_root": str(data), "runs_root": str(run_dir / "runs")},
            "cache": {"store": str(run_dir / "cache")},
            "vae": {"path": str(vae_path), "sha256": digest, "num_workers": 0},
        },
    )
    errors: list[str] = []
    run_latents(
        cfg, rows, torch.device("cpu"), lambda r, n: None, lambda r, e: errors.append(f"{r.clip_id}: {e}")
    )
    if errors:
        raise SystemExit("latents failed: " + "; ".join(errors))
    pack_and_publish(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--val-every", type=int, default=50)
    ap.add_argument("--val-clips", type=int, default=16)
    ap.add_argument("--from-step", type=int, default=None, help="(default: half of --steps)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--cond-lr", type=float, default=None)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument(
        "--dit",
        type=json.loads,
        default=None,
        help='model.overrides as JSON, e.g. {"dim": 192, "num_layers": 4}',
    )
    ap.add_argument("--world", choices=("codeworld", "codeworld_fitted", "synthetic"), default="codeworld")
    ap.add_argument("--vae-steps", type=int, default=300, help="codeworld_fitted: tiny VAE fit steps")
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args(argv)

    from gc25d_core.config import load_config, write_resolved
    from gc25d_core.train.sft import iter_val_records, with_sft

    optim: dict[str, Any] = {}
    if args.lr is not None:
        optim["lr"] = args.lr
    if args.cond_lr is not None:
        optim["cond_lr"] = args.cond_lr
    sft = {
        "max_steps": args.steps,
        "save_every": args.steps,
        "state_every": max(args.steps // 4, 1),
        "deterministic": False,
        "val": {"every": args.val_every, "num_clips": args.val_clips},
        "optim": optim,
    }
    if args.dit:
        sft["model"] = {"overrides": args.dit}
    args.run_dir = args.run_dir or ROOT / "outputs" / f"learning_signal_{args.world}"
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.world == "codeworld":
        cfg = with_sft(load_config("tiny"), "tiny", sft)
    elif args.world == "codeworld_fitted":
        cfg = with_sft(fitted_vae_world(args.run_dir, args.vae_steps), "tiny", sft)
    else:
        from gc25d_core.train.synthetic import sft_world

        world = args.run_dir / "world"
        if world.exists():
            shutil.rmtree(world)
        cfg = sft_world(world, sft, starts=(0, 96, 192, 288), latents="from_ids")
    config = write_resolved(cfg, args.run_dir, "config.yaml")
    job = ["-m", "gc25d_core.jobs.sft", "--config", str(config), "--run-dir", str(args.run_dir)]
    rc, wall = torchrun(
        args.nproc, job + (["--fresh"] if args.fresh else []), args.run_dir / "train.log", bench_env()
    )
    if rc != 0:
        print((args.run_dir / "train.log").read_text()[-3000:], file=sys.stderr)
        raise SystemExit(f"training failed (rc {rc}); log: {args.run_dir / 'train.log'}")

    records = list(iter_val_records(args.run_dir))
    keys = [f"{m}_mse_t{t}" for m in ("cond", "uncond", "null_text") for t in (200, 500, 800)]
    for r in records:
        print(json.dumps({"step": r["step"], **{k: round(r[k], 5) for k in keys}}))
    from_step = args.from_step if args.from_step is not None else args.steps // 2
    late = [r for r in records if r["step"] >= from_step]
    last = records[-1]
    gap = last["uncond_mse_t500"] - last["cond_mse_t500"]
    print(
        json.dumps(
            {
                "summary": "learning_signal",
                "world": args.world,
                "steps": last["step"],
                "val_clips": int(last["num_clips"]),
                "wall_s": round(wall, 1),
                "cond_mse_t500": last["cond_mse_t500"],
                "uncond_mse_t500": last["uncond_mse_t500"],
                "null_text_mse_t500": last["null_text_mse_t500"],
                "gap_t500": gap,
                "rel_gap_t500": gap / last["uncond_mse_t500"],
                "cond_below_uncond_at_every_val_from_step": from_step,
                "cond_below_uncond": all(r["cond_mse_t500"] < r["uncond_mse_t500"] for r in late),
                "first_val": {k: records[0][k] for k in ("step", "cond_mse_t500", "uncond_mse_t500")},
            }
        )
    )


if __name__ == "__main__":
    main()
