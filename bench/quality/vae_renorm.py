"""A fitted tiny VAE's latent normalisation measured again on a preset's train clips, by the
tiny_vae job's rule (``vae.fit.norm_frames``: whole clips), written as a new file.

For a VAE whose normalisation was measured on other frames (picture_study fitted on the first 9
frames of each clip until 2026-12-05): over whole clips its latents then have a variance far from
one, and the chain's flow matching trains at a signal-to-noise it was not set for. The weights are
kept; only ``norm.mean`` / ``norm.std`` change, so the file gets a new SHA256.

    python -m bench.quality.vae_renorm --preset small --raw /tmp/smallworld/raw \\
        --vae IN.safetensors --sha256 <IN's> --out OUT.safetensors [--device cuda]

Prints one JSON line: the new file's SHA256 and the latents' RMS over the clips under the old
normalisation (under the new one it is 1 by construction)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import cpu_threads


def rms_under(mean_old, std_old, mean_new, std_new) -> float:
    """RMS of latents standardised by (mean_old, std_old) whose per-channel moments are (mean_new,
    std_new): sqrt of the channels' mean of ((m_new - m_old) / s_old)^2 + (s_new / s_old)^2."""
    return float((((mean_new - mean_old) / std_old) ** 2 + (std_new / std_old) ** 2).mean().sqrt())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", help="the code world's preset (its train clips)")
    ap.add_argument("--raw", type=Path, required=True, help="the preset's code world (made here if missing)")
    ap.add_argument("--vae", type=Path, required=True, help="the fitted tiny VAE (.safetensors)")
    ap.add_argument("--sha256", required=True, help="its SHA256 (checked before it is read)")
    ap.add_argument("--out", type=Path, required=True, help="the renormalised VAE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.out.resolve() == args.vae.resolve():
        raise SystemExit(f"--out {args.out}: the same file as --vae (its SHA256 would change under it)")

    from bench.quality.picture_study import code_world_config, train_clips
    from gc25d_core.models.loading import WeightsError
    from gc25d_core.models.vae_fit import load_tiny_vae, renormalise_tiny_vae, save_tiny_vae

    cpu_threads(args.threads)
    cfg = code_world_config(args.preset, args.raw)
    try:
        vae = load_tiny_vae(args.vae, expected_sha256=args.sha256, field="--sha256")
    except WeightsError as e:
        raise SystemExit(f"--vae: {e}") from None
    old = vae.mean.clone(), vae.std.clone()
    clips, _ = train_clips(cfg)
    renormalise_tiny_vae(vae, clips, cfg.vae.fit.norm_frames, args.device)
    digest = save_tiny_vae(vae, args.out)
    rec = {
        "out": str(args.out),
        "sha256": digest,
        "train_clips": len(clips),
        "norm_frames": cfg.vae.fit.norm_frames,
        # under the new normalisation the RMS is 1 by construction (its own moments)
        "rms_before": round(rms_under(*old, vae.mean, vae.std), 4),
    }
    print(json.dumps(rec), flush=True)
    return rec


if __name__ == "__main__":
    main()
