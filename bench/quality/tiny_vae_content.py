"""How much of the picture do the tiny preset's latents keep? (issue 7, learning-signal diagnosis)

Encodes code-world clips of the embedded default with the tiny random VAE exactly as the latents job
does (``build_vae_for``: seeded random weights), then fits, per latent pixel of cells 1..20, a
linear map from (a) the 16x16-pooled RGB mean and std of the cell's 4 frames and (b) the pooled
one-hot of the parts ids, to the per-channel standardised latent. Fit on the first half of the clips,
R^2 on the other half. Prints one JSON line.

Usage: make run && python -m bench.quality.tiny_vae_content [--clips 8] [--vae fitted.safetensors --sha256 HEX]
(``--vae``: a tiny VAE fitted by gc25d_core.models.vae_fit instead of the preset's random one)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def r2_out_of_sample(x: np.ndarray, z: np.ndarray, n_fit: int) -> float:
    z = (z - z[:n_fit].mean(0)) / z[:n_fit].std(0)
    a = np.c_[x[:n_fit], np.ones(n_fit)]
    w, *_ = np.linalg.lstsq(a, z[:n_fit], rcond=None)
    pred = np.c_[x[n_fit:], np.ones(len(x) - n_fit)] @ w
    return float(1 - ((z[n_fit:] - pred) ** 2).mean() / z[n_fit:].var(0).mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--vae", type=Path, default=None)
    ap.add_argument("--sha256", default=None)
    args = ap.parse_args(argv)

    import torch

    from gc25d_core.config import load_config
    from gc25d_core.index import read_index
    from gc25d_core.layout import Layout, Shapes, read_cond
    from gc25d_core.models.vae import build_vae_for, encode_frames
    from gc25d_core.preprocess.latents import load_clip_frames
    from gc25d_core.preprocess.tasks import RunCache
    from gc25d_core.vocab import valid_raw_ids

    cfg = load_config("tiny", {"vae": {"path": str(args.vae), "sha256": args.sha256}} if args.vae else None)
    layout = Layout(Path(cfg.paths.data_root))
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)[: args.clips]
    runs = RunCache(Path(cfg.raw.root))
    vae = build_vae_for(cfg, torch.device("cpu"))
    classes = list(valid_raw_ids("parts"))  # UNKNOWN (255) included
    lut = np.zeros(256, np.int64)
    lut[classes] = np.arange(len(classes))
    rgb_x, ids_x, lat = [], [], []
    for row in rows:
        frames = load_clip_frames(runs(row), row.start, cfg)  # [81, H, W, 3] uint8
        ids = read_cond(layout, row.clip_id, Shapes.of(cfg))  # [81, H, W]
        z = encode_frames(vae, frames).numpy()  # [48, 21, h, w]
        c, t, h, w = z.shape
        hh, ww = frames.shape[1:3]
        for j in range(1, t):
            sl = slice(4 * j - 3, 4 * j + 1)
            f = frames[sl].astype(np.float32).mean(0).reshape(h, hh // h, w, ww // w, 3) / 255
            rgb_x.append(np.concatenate([f.mean((1, 3)), f.std((1, 3))], -1).reshape(h * w, -1))
            oh = np.eye(len(classes), dtype=np.float32)[lut[ids[sl]]].mean(0)
            ids_x.append(oh.reshape(h, hh // h, w, ww // w, -1).mean((1, 3)).reshape(h * w, -1))
            lat.append(z[:, j].transpose(1, 2, 0).reshape(h * w, c))
    z_all = np.concatenate(lat)
    n_fit = len(z_all) // 2
    print(
        json.dumps(
            {
                "probe": "tiny_vae_content",
                "clips": len(rows),
                "vae": str(args.vae) if args.vae else "random (preset)",
                "latent_var_per_channel": float(z_all.var(0).mean()),
                "latent_mean_abs": float(np.abs(z_all.mean(0)).mean()),
                "r2_from_pooled_rgb": r2_out_of_sample(np.concatenate(rgb_x), z_all, n_fit),
                "r2_from_pooled_ids": r2_out_of_sample(np.concatenate(ids_x), z_all, n_fit),
            }
        )
    )


if __name__ == "__main__":
    main()
