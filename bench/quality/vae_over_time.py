"""A tiny VAE along whole clips: per latent frame, the normalised latents' variance and the
reconstruction's PSNR, over the val clips' 81 frames (21 latent frames).

A fit sees windows of ``vae.fit.frames`` from a cold time cache (9 frames: 3 latent frames), while
the latents job encodes whole clips and a live session decodes cell after cell, so what matters to
the chain and the picture is the VAE's steady state, which the first 17 frames do not show.

    python -m bench.quality.vae_over_time --preset small --raw /tmp/smallworld/raw \\
        --vae A.safetensors@<sha256> [--vae B.safetensors@<sha256> ...]

One JSON line per VAE: ``var`` and ``psnr_db`` per latent frame (0: the first image frame alone;
k: frames 4k-3..4k), ``psnr_whole_db``, ``psnr_first17_db`` and ``psnr_steady_db`` (latent frames
8..20, past the start-up). ``--sheet PNG``: one val clip at frames 0, 16, 32 and its last, top to
bottom: the truth beside each VAE's reconstruction."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from bench.common import cpu_threads

STEADY_FROM = 8  # latent frames before this are the time cache's start-up (docs/picture_study.md)


def psnr_of(err: float) -> float:
    return 10 * math.log10(255.0**2 / err) if err > 0 else math.inf


SHEET_FRAMES = (0, 16, 32, -1)


def over_time(vae, clips: list[np.ndarray], keep: int | None = None) -> tuple[dict, np.ndarray | None]:
    """Per latent frame variance of ``encode`` (all channels, averaged over clips) and PSNR of
    ``decode(encode(clip))`` against each uint8 ``[81, H, W, 3]`` clip; and the reconstruction of
    clip ``keep`` (None: none kept)."""
    from gc25d_core.models.vae import decode_frames, encode_frames

    n = len(clips)
    var, err, kept = None, np.zeros(clips[0].shape[0]), None
    for i, c in enumerate(clips):
        z = encode_frames(vae, c)  # [48, T, h, w]
        v = z.numpy().var(axis=(0, 2, 3))
        var = v / n if var is None else var + v / n
        r = decode_frames(vae, z)
        kept = r if i == keep else kept
        err += ((r.astype(np.float64) - c.astype(np.float64)) ** 2).mean(axis=(1, 2, 3)) / n
    groups = [err[:1]] + [err[1 + 4 * k : 5 + 4 * k] for k in range((len(err) - 1) // 4)]
    steady = np.concatenate(groups[STEADY_FROM:]) if len(groups) > STEADY_FROM else np.array([])
    rec = {
        "var": [round(float(v), 3) for v in var],
        "psnr_db": [round(psnr_of(float(g.mean())), 2) for g in groups],
        "psnr_whole_db": round(psnr_of(float(err.mean())), 2),
        "psnr_first17_db": round(psnr_of(float(err[:17].mean())), 2),
        "psnr_steady_db": round(psnr_of(float(steady.mean())), 2) if steady.size else None,
    }
    return rec, kept


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", help="the code world's preset (its val clips)")
    ap.add_argument("--raw", type=Path, required=True, help="the preset's code world (made here if missing)")
    ap.add_argument(
        "--vae", action="append", required=True, metavar="FILE@SHA256", help="a fitted tiny VAE (repeatable)"
    )
    ap.add_argument("--frames", type=int, default=81, help="frames from each val clip's start (1 + 4k)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sheet", type=Path, default=None, help="a PNG of one val clip along its length")
    ap.add_argument("--sheet-clip", type=int, default=0, help="which val clip the sheet shows")
    args = ap.parse_args(argv)
    specs = []
    for spec in args.vae:
        path, sep, sha = spec.rpartition("@")
        if not sep or len(sha) != 64:
            raise SystemExit(f"--vae {spec!r}: FILE@SHA256 (the file's 64-hex SHA256 after the @)")
        specs.append((Path(path), sha))

    from bench.quality.picture_study import code_world_config, held_out
    from gc25d_core.models.loading import WeightsError
    from gc25d_core.models.vae_fit import load_tiny_vae

    cpu_threads(args.threads)
    cfg = code_world_config(args.preset, args.raw)
    clips, _ = held_out(cfg, args.frames)
    if args.sheet is not None and not 0 <= args.sheet_clip < len(clips):
        raise SystemExit(f"--sheet-clip {args.sheet_clip}: the preset has {len(clips)} val clips")
    out, panels = [], []
    for path, sha in specs:
        try:
            vae = load_tiny_vae(path, expected_sha256=sha, field="--vae")
        except WeightsError as e:
            raise SystemExit(f"--vae: {e}") from None
        scores, kept = over_time(vae, clips, args.sheet_clip if args.sheet is not None else None)
        rec = {"vae": path.name, "sha256": sha, "clips": len(clips), **scores}
        print(json.dumps(rec), flush=True)
        out.append(rec)
        if kept is not None:
            panels.append(kept[list(SHEET_FRAMES)])
    if args.sheet is not None:
        from gc25d_core.atomic import atomic_write_bytes
        from gc25d_core.preview import png_bytes, side_by_side

        truth = clips[args.sheet_clip][list(SHEET_FRAMES)]
        labels = ["truth"] + [p.stem[:40] for p, _ in specs]
        rows = side_by_side([truth, *panels], labels, scale=1)  # [4, H, W * (1 + VAEs), 3]
        atomic_write_bytes(args.sheet, png_bytes(np.concatenate(list(rows), axis=0)))
    return out


if __name__ == "__main__":
    main()
