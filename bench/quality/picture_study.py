"""What makes the embedded default's picture recognisable? (issue 35, item 5)

Everything the students decode passes through the tiny VAE, so what the VAE's reconstruction of the
true frames shows is the ceiling of any model's picture. This study reads frames back into ids with
the ids probe (gc25d_core/eval/ids_probe.py) and reports, on the held-out (val) runs' frames:

* the probe on the true frames (how well it reads the code world at all);
* the tiny VAE's reconstruction, for a random VAE and fits of growing length / width (``--fits``:
  ``STEPS@DIM`` or ``STEPS@DIM/DEC_DIM`` each, the encoder's and the decoder's widths; the tiny
  preset's fit is 160@16), with PSNR and seconds per fit;
* the best linear code of the VAE's shape (``--linear``: PCA of the train frames' 16×16 squares of
  4 frames, K numbers each; the VAE has 48): a reference any fitted VAE of that size ought to beat,
  and what more numbers a latent would buy;
* latents degraded as an MMSE predictor with a given error would degrade them (``--latent-mse``):
  per channel, z' = mean + (z - mean + σ·std·ε) / (1 + σ²), with σ² = m / (1 - m), so that the
  standardised latent error is m and the picture is the blur-plus-noise of a model of that error.
  The students' EMA latent MSE on the embedded default is about 0.91 (docs/learning_signal.md).

Prints one JSON line per row and a markdown table at the end (docs/picture_study.md).

Usage: python -m bench.quality.picture_study --raw /tmp/picture/raw --work /tmp/picture/study \
    [--fits 160@16,480@16,160@32/64] [--latent-mse 0,0.25,0.5,0.75,0.9] [--linear 48,192] [--frames 17]
    [--threads 2]
GPU, the small preset: ... --preset small --device cuda --fits 600@16,600@32,600@32/64 --latent-mse ''
A fit for a time budget, kept: --fits 100000@16 --fit-seconds 400 --save-dir DIR (each row then
gives the steps run, the first step's seconds, a compile's included, and the median step's); with
--state FILE it continues from that file and leaves its progress there for the next run.
``--raw``: the preset's code world (generated there when missing: a minute for tiny, ~3 for small).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cpu_threads


def ids_vocab_scores(probe: Any, frames: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    from gc25d_core.eval.ids_probe import score_frames

    s = score_frames(frames, ids, probe)
    return {k: s[k] for k in ("miou", "miou_parts", "player_iou", "player_parts_miou", "pixel_acc")}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 10 * math.log10(255.0**2 / mse) if mse > 0 else math.inf


def held_out(cfg: Any, frames: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every val clip's first ``frames`` frames (RGB) and their conditioning ids."""
    from gc25d_core.geometry import resample_rgb
    from gc25d_core.index import split_of_runs
    from gc25d_core.preprocess.clips import cond_frame
    from gc25d_core.raw_frames import read_rgb
    from gc25d_core.raw_layout import RawSource

    raw = RawSource(Path(cfg.raw.root))
    splits = split_of_runs([r.run for r in raw.runs()], cfg.index)
    rgb, ids = [], []
    for c in raw.clips:
        if splits[c.run] != "val":
            continue
        run = raw.run(c.subset, c.scene, c.run)
        fr = range(c.start, c.start + frames)
        rgb.append(np.stack([resample_rgb(read_rgb(run, f), cfg.geometry) for f in fr]))
        ids.append(np.stack([cond_frame(run, f, cfg) for f in fr]))
    return rgb, ids


def train_clips(cfg: Any, classes: bool = False) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The train split's clips as the tiny_vae job reads them (81 frames each) and, with ``classes``,
    their pixels' ids as its class-weighted loss takes them."""
    from gc25d_core.index import split_of_runs
    from gc25d_core.preprocess.latents import load_clip_frames
    from gc25d_core.preprocess.tiny_vae import loss_classes
    from gc25d_core.raw_layout import RawSource

    raw = RawSource(Path(cfg.raw.root))
    splits = split_of_runs([r.run for r in raw.runs()], cfg.index)
    runs = [(raw.run(c.subset, c.scene, c.run), c.start) for c in raw.clips if splits[c.run] == "train"]
    frames = [load_clip_frames(run, start, cfg) for run, start in runs]
    return frames, [loss_classes(run, start, cfg) for run, start in runs] if classes else None


def recon(vae: Any, clips: list[np.ndarray], latent_mse: float = 0.0, seed: int = 0) -> list[np.ndarray]:
    """decode(encode(clip)) as uint8 frames, the latents degraded to standardised error
    ``latent_mse`` first (see the module's docstring)."""
    import torch

    from gc25d_core.models.vae import decode_frames, encode_frames

    zs = [encode_frames(vae, c) for c in clips]  # [48, T, h, w] each
    if latent_mse > 0:
        allz = torch.cat([z.flatten(1) for z in zs], 1)
        mean, std = allz.mean(1), allz.std(1)
        s2 = latent_mse / (1 - latent_mse)
        g = torch.Generator().manual_seed(seed)
        out = []
        for z in zs:
            m, sd = mean.view(-1, 1, 1, 1), std.view(-1, 1, 1, 1)
            eps = torch.randn(z.shape, generator=g)
            out.append(m + (z - m + math.sqrt(s2) * sd * eps) / (1 + s2))
        zs = out
    return [decode_frames(vae, z) for z in zs]


def patch_groups(clip: np.ndarray, patch: int = 16, group: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A clip's frames (uint8 [1 + group·n, H, W, 3]) cut as the VAE's latents see them: frame 0 alone
    and then ``group`` frames a latent, each into ``patch``×``patch`` squares; float rows in [0, 1]:
    (first [H/p·W/p, p·p·3], rest [n·H/p·W/p, group·p·p·3])."""
    t, h, w, _ = clip.shape
    if (t - 1) % group or h % patch or w % patch:
        raise ValueError(f"frames {clip.shape}: need 1 + {group}·n frames of sides divisible by {patch}")
    x = clip.astype(np.float32) / 255.0

    def cut(v: np.ndarray) -> np.ndarray:  # [g, T', H, W, 3] -> [g·H/p·W/p, T'·p·p·3]
        g, tt = v.shape[:2]
        v = v.reshape(g, tt, h // patch, patch, w // patch, patch, 3).transpose(0, 2, 4, 1, 3, 5, 6)
        return v.reshape(g * (h // patch) * (w // patch), tt * patch * patch * 3)

    return cut(x[None, :1]), cut(x[1:].reshape(-1, group, h, w, 3))


def linear_code_recon(
    train: list[np.ndarray], held: list[np.ndarray], k: int, max_rows: int = 60_000, seed: int = 0
) -> list[np.ndarray]:
    """``held`` through the best linear code of the VAE's shape: ``k`` numbers for each 16×16 square
    of frame 0 and of each later 4 frames (PCA fitted on ``train``'s squares, at most ``max_rows`` of
    them); a reference a fitted VAE of ``k`` channels ought to beat, needing no fit of its own."""
    rng = np.random.default_rng(seed)
    cuts = [patch_groups(c) for c in train]
    bases = []
    for part in (0, 1):  # frame 0's squares, then the 4-frame ones
        x = np.concatenate([c[part] for c in cuts])
        if len(x) > max_rows:
            x = x[rng.choice(len(x), max_rows, replace=False)]
        mean = x.mean(0)
        xc = (x - mean).astype(np.float64)
        _, vecs = np.linalg.eigh(xc.T @ xc)  # ascending: the last k span the best k-dim code
        bases.append((mean, vecs[:, -k:].astype(np.float32)))
    out = []
    for clip in held:
        _, h, w, _ = clip.shape
        rows = []
        for part, rows_in in enumerate(patch_groups(clip)):
            mean, v = bases[part]
            rows.append(mean + ((rows_in - mean) @ v) @ v.T)
        frames = [  # the squares back in place: [g, H/p, W/p, T', p, p, 3] -> [g·T', H, W, 3]
            r.reshape(-1, h // 16, w // 16, tt, 16, 16, 3).transpose(0, 3, 1, 4, 2, 5, 6).reshape(-1, h, w, 3)
            for r, tt in zip(rows, (1, 4), strict=True)
        ]
        out.append((np.clip(np.concatenate(frames), 0, 1) * 255 + 0.5).astype(np.uint8))
    return out


def code_world_config(preset: str, raw: Path, work: Path | None = None) -> Any:
    """The preset's config on the code world at ``raw`` (``work``: its data root), the code world
    made there first when it is missing (seeded: the preset's own)."""
    from gc25d_core import raw_prepare
    from gc25d_core.config import load_config

    over: dict[str, Any] = {"raw": {"root": str(raw)}}
    if work is not None:
        over["paths"] = {"data_root": str(work)}
    cfg = load_config(preset, over)
    if not (raw / "codeworld.json").is_file():
        raw_prepare.prepare_raw(cfg, log=lambda m: None, workers=os.cpu_count() or 1)
    return cfg


def fit_vae(
    clips: list[np.ndarray],
    steps: int,
    dim: int,
    cfg: Any,
    seed: int = 0,
    dec_dim: int | None = None,
    device: str = "cpu",
    lr: float | None = None,
    batch: int | None = None,
    compile: bool | None = None,
    seconds: float | None = None,
    state: Path | None = None,
    fast_ops: bool | None = None,
    bf16: bool | None = None,
    frames: int | None = None,
    init: tuple[Path, str] | None = None,
    warm: int | None = None,
    classes: list[np.ndarray] | None = None,
    class_weight: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The tiny_vae job's fit (gc25d_core.models.vae_fit.fit_tiny_vae with cfg.vae.fit), its
    encoder of width ``dim`` and decoder of ``dec_dim`` (default ``dim``; the presets: 16 / 16);
    ``lr`` / ``batch`` / ``compile`` / ``fast_ops`` / ``bf16`` / ``frames`` (the windows' length) /
    ``warm`` (the windows' latent frames without gradient) / ``class_weight`` (with the train clips' pixel ids,
    ``classes``) / ``seconds`` (a time budget) in place of the preset's; ``init``: (file, SHA256) of a fitted VAE
    the fit starts from (fit_tiny_vae's). Returns
    the VAE and its timing: ``fit_s`` (all of it, the normalisation pass included), ``steps`` the
    weights have had, ``first_step_s`` (a compiled fit's compile is in it) and ``step_s`` (the median
    of the rest). ``state``: the fit continues from that state file (fit_tiny_vae's; it must be this
    fit's) and keeps its progress there, ``resumed_from`` then says from which step."""
    from gc25d_core.models.vae_fit import fit_tiny_vae

    f = cfg.vae.fit
    ends: list[float] = []
    t0 = time.perf_counter()
    vae, summary = fit_tiny_vae(
        clips,
        steps=steps,
        batch=batch or f.batch,
        frames=frames or f.frames,
        lr=lr or f.lr,
        seed=seed,
        crop=f.crop,
        norm_frames=f.norm_frames,  # the job's rule: a VAE saved here can feed the chain (small_chain --vae)
        device=device,
        dim=dim,
        dec_dim=dec_dim or dim,
        compile=f.compile if compile is None else compile,
        fast_ops=f.fast_ops if fast_ops is None else fast_ops,
        bf16=f.bf16 if bf16 is None else bf16,
        seconds=seconds,
        log=lambda step, loss: ends.append(time.perf_counter()),
        state=state,
        state_must_match=True,
        note=print,
        init=init,
        warm=f.warm if warm is None else warm,
        classes=classes,
        class_weight=f.class_weight if class_weight is None else class_weight,
    )
    fit_s = time.perf_counter() - t0
    gaps = np.diff(ends)
    return vae, {
        "fit_s": round(fit_s, 1),
        "steps": summary["steps"],
        "resumed_from": summary["resumed_from"],
        "loss_last": summary["loss_last"],
        "first_step_s": round(ends[0] - t0, 2) if ends else None,
        "step_s": round(float(np.median(gaps)), 4) if len(gaps) else None,
    }


def parse_fit(spec: str) -> tuple[int, int, int]:
    """``STEPS@DIM`` or ``STEPS@DIM/DEC_DIM`` -> (steps, dim, dec_dim)."""
    from bench.quality.small_preset import split_widths

    try:
        steps, _, widths = spec.partition("@")
        return (int(steps), *split_widths(widths))
    except ValueError:
        raise SystemExit(f"--fits: {spec!r} is not STEPS@DIM or STEPS@DIM/DEC_DIM") from None


def screenshot_panels(path: Path, width: int = 128, height: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 [1, H, W, 3], raw ids uint8 [1, H, W]) read off a play-page screenshot whose two
    panels, picture | ids, sit side by side at the top left on a flat background (the page of
    docs/images/deploy_play_tiny_chromium.png): the picture area-resized back to the model's size,
    the ids sampled at pixel centres and mapped to the nearest colour of the ids palette."""
    import cv2

    from gc25d_core.preview import colorize_ids
    from gc25d_core.vocab import valid_raw_ids

    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"screenshot {path} cannot be read (missing or not an image)")
    img = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    bg = img[-1, -1].astype(int)
    rows = np.flatnonzero((np.abs(img.astype(int) - bg).sum(-1) > 0).any(1))
    cols = np.flatnonzero((np.abs(img.astype(int) - bg).sum(-1) > 0).any(0))
    y1, x1 = rows.max() + 1, cols.max() + 1
    pw = x1 // 2
    pic = cv2.resize(np.ascontiguousarray(img[:y1, :pw]), (width, height), interpolation=cv2.INTER_AREA)
    ys = ((np.arange(height) + 0.5) * y1 / height).astype(int)
    xs = pw + ((np.arange(width) + 0.5) * pw / width).astype(int)
    ids_rgb = img[ys][:, xs].astype(int)  # [H, W, 3]
    raw = np.array(valid_raw_ids("parts"), np.uint8)
    pal = colorize_ids(raw).astype(int)  # [K, 3]
    nearest = np.abs(ids_rgb[:, :, None, :] - pal[None, None]).sum(-1).argmin(-1)
    return pic[None], raw[nearest][None]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument(
        "--preset", default="tiny", help="the code world's and the VAE fit's preset (tiny, small)"
    )
    ap.add_argument("--device", default="cpu", help="where the fits run (the small preset's: cuda)")
    ap.add_argument("--fits", default="160@16,480@16", help="STEPS@DIM or STEPS@DIM/DEC_DIM, comma-separated")
    ap.add_argument("--lr", type=float, default=None, help="the fits' learning rate (default the preset's)")
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="the fits' windows a step (default the preset's; on a GPU a tiny-VAE step is launch-bound, "
        "so a larger batch costs little time: docs/picture_study.md)",
    )
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the fits' step through torch.compile (CUDA graphs on a GPU; default the preset's vae.fit.compile)",
    )
    ap.add_argument(
        "--fit-frames",
        type=int,
        default=None,
        help="the fits' windows, frames long (1 + 4k; default the preset's vae.fit.frames): the encoder and "
        "decoder learn their time cache's steady state only on windows longer than its start",
    )
    ap.add_argument(
        "--fit-warm",
        type=int,
        default=None,
        help="the windows' first latent frames encoded and decoded without gradients and out of the loss "
        "(default the preset's vae.fit.warm, 0): the rest train on filled time caches, a whole clip's "
        "steady state, for a forward pass of the warm ones; --fit-frames counts them",
    )
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="a fitted tiny VAE (.safetensors) the fits start from (with --init-sha256): another fit's "
        "weights under other settings, e.g. --fit-frames",
    )
    ap.add_argument("--init-sha256", default=None, help="--init's SHA256 (checked before it is read)")
    ap.add_argument(
        "--class-weight",
        type=float,
        default=None,
        help="the fits' loss weighted by class, p^-W for a class of pixel share p (default the preset's "
        "vae.fit.class_weight, 0: the plain loss)",
    )
    ap.add_argument(
        "--fast-ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the fits with the encode path's speed-ups (lean ops; channels-last-3d on a GPU; default the "
        "preset's vae.fit.fast_ops)",
    )
    ap.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the fits' encode and decode under bfloat16 autocast (default the preset's vae.fit.bf16)",
    )
    ap.add_argument(
        "--fit-seconds",
        type=float,
        default=None,
        help="a time budget for each fit: it stops after the step that passes it (STEPS is then the most)",
    )
    ap.add_argument(
        "--save-dir",
        type=Path,
        default=None,
        help="write each fitted VAE there as tiny_vae_<STEPS>steps_<DIM>[_<DEC_DIM>][_compiled][_fastops].safetensors "
        "(its SHA256 in the row)",
    )
    ap.add_argument(
        "--state",
        type=Path,
        default=None,
        help="with one fit in --fits: its progress file (weights, Adam, the step): the fit continues from "
        "it and keeps writing it, so a long fit adds up across runs (a time budget each, --fit-seconds)",
    )
    ap.add_argument(
        "--prepare-only",
        action="store_true",
        help="the code world and the probe (each made once where missing), then stop: no rows",
    )
    ap.add_argument(
        "--baselines",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the truth's and a random VAE's rows first (--no-baselines: a fit continued across device "
        "calls prints them in its first call only)",
    )
    ap.add_argument("--latent-mse", default="0.25,0.5,0.75,0.9")
    ap.add_argument(
        "--linear",
        default="",
        help="K,K,...: rows of the best linear code of the VAE's shape, K numbers a latent (48: the VAE's)",
    )
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--screenshot", type=Path, action="append", default=[], help="a play-page PNG to score")
    ap.add_argument("--sheet-dir", type=Path, default=None, help="write probe_<screenshot>.png there")
    args = ap.parse_args(argv)
    if (args.init is None) != (args.init_sha256 is None):
        ap.error("--init and --init-sha256 go together (the weights are checked before they are used)")
    if args.fit_frames is not None and (args.fit_frames < 1 or (args.fit_frames - 1) % 4):
        ap.error(f"--fit-frames {args.fit_frames}: 1 + 4k frames")
    if args.fit_warm is not None and args.fit_warm < 0:
        ap.error(f"--fit-warm {args.fit_warm}: latent frames, 0 or more")

    import torch

    from gc25d_core.eval.ids_probe import ensure_probe
    from gc25d_core.models.vae import build_vae

    cpu_threads(args.threads)
    fits = [parse_fit(f) for f in args.fits.split(",") if f.strip()]
    if args.state is not None and len(fits) != 1:
        raise SystemExit(f"--state {args.state}: one fit's progress; --fits names {len(fits)}")
    cfg = code_world_config(args.preset, args.raw, args.work)
    rows: list[dict[str, Any]] = []

    def row(name: str, frames: list[np.ndarray], truth: list[np.ndarray], ids: list[np.ndarray], **extra):
        f, t, i = np.concatenate(frames), np.concatenate(truth), np.concatenate(ids)
        r: dict[str, Any] = {"row": name, **ids_vocab_scores(probe, f, i), "psnr_db": psnr(f, t), **extra}
        rows.append(r)
        print(json.dumps(r), flush=True)

    t0 = time.perf_counter()
    probe, rec = ensure_probe(cfg)
    print(
        json.dumps(
            {"probe": {k: rec[k] for k in ("fitted", "train_miou", "frames")}, "s": time.perf_counter() - t0}
        )
    )
    if args.prepare_only:
        return
    for shot in args.screenshot:  # the students' frames as make play showed them
        pic, sids = screenshot_panels(shot)
        if args.sheet_dir is not None:  # picture | ids | the probe's reading of the picture
            from gc25d_core.atomic import atomic_write_bytes
            from gc25d_core.preview import colorize_ids, png_bytes, side_by_side

            panels = [pic, colorize_ids(sids), colorize_ids(probe.predict(pic))]
            img = side_by_side(panels, ["picture", "ids", "probe"], scale=3)[0]
            atomic_write_bytes(args.sheet_dir / f"probe_{shot.stem}.png", png_bytes(img))
        r: dict[str, Any] = {"row": f"screenshot {shot.name}", **ids_vocab_scores(probe, pic, sids)}
        r["psnr_db"] = math.nan
        rows.append(r)
        print(json.dumps(r), flush=True)
    truth, ids = held_out(cfg, args.frames)
    if args.baselines:
        row("truth (probe's own accuracy)", truth, truth, ids)
        torch.manual_seed(0)  # the random VAE of the row below: the same one every run
        row("tiny VAE, random (no fit)", recon(build_vae(tiny=True), truth), truth, ids)
    linear = [int(k) for k in args.linear.split(",") if k.strip()]
    class_weight = cfg.vae.fit.class_weight if args.class_weight is None else args.class_weight
    train, train_ids = train_clips(cfg, classes=bool(fits and class_weight)) if fits or linear else ([], None)
    for k in linear:
        t1 = time.perf_counter()
        name = f"linear code, {k} numbers a latent (PCA of 16×16 px × 4 frames)"
        row(name, linear_code_recon(train, truth, k), truth, ids, fit_s=round(time.perf_counter() - t1, 1))
    degrade = [float(m) for m in args.latent_mse.split(",") if m.strip()]
    for i, (steps, dim, dec_dim) in enumerate(fits):
        vae, timing = fit_vae(
            train,
            steps,
            dim,
            cfg,
            dec_dim=dec_dim,
            device=args.device,
            lr=args.lr,
            batch=args.batch,
            compile=args.compile,
            fast_ops=args.fast_ops,
            bf16=args.bf16,
            seconds=args.fit_seconds,
            state=args.state,
            frames=args.fit_frames,
            warm=args.fit_warm,
            init=None if args.init is None else (args.init, args.init_sha256),
            classes=train_ids,
            class_weight=class_weight,
        )
        extra: dict[str, Any] = dict(timing)
        if args.save_dir is not None:
            from gc25d_core.models.vae_fit import save_tiny_vae

            # no '@' in the name: the device tool brings back no file named with one
            stem = f"tiny_vae_{timing['steps']}steps_{dim}" + (f"_{dec_dim}" if dec_dim != dim else "")
            stem += ("_compiled" if args.compile else "") + ("_fastops" if args.fast_ops else "")
            stem += "_bf16" if args.bf16 else ""
            stem += f"_f{args.fit_frames}" if args.fit_frames else ""
            stem += f"_w{args.fit_warm}" if args.fit_warm else ""
            stem += f"_init{args.init_sha256[:8]}" if args.init is not None else ""
            stem += f"_cw{class_weight:g}" if class_weight else ""
            args.save_dir.mkdir(parents=True, exist_ok=True)
            extra["file"] = str(args.save_dir / f"{stem}.safetensors")
            extra["sha256"] = save_tiny_vae(vae, extra["file"])
        steps = timing["steps"]
        name = f"tiny VAE fit {steps} steps, dim {dim}" + (f" / decoder {dec_dim}" if dec_dim != dim else "")
        name += f", lr {args.lr:g}" if args.lr else ""
        name += f", batch {args.batch}" if args.batch else ""
        name += {True: ", compiled", False: ", eager", None: ""}[args.compile]
        name += {True: ", fast ops", False: ", plain ops", None: ""}[args.fast_ops]
        name += {True: ", bf16", False: ", fp32", None: ""}[args.bf16]
        name += f", {args.fit_frames}-frame windows" if args.fit_frames else ""
        name += f", {args.fit_warm} warm latent frames" if args.fit_warm else ""
        name += f", from {args.init.name}" if args.init is not None else ""
        name += f", loss weighted by class (p^-{class_weight:g})" if class_weight else ""
        name += f" (continued from step {timing['resumed_from']})" if timing["resumed_from"] else ""
        row(name, recon(vae, truth), truth, ids, **extra)
        if i == 0:
            spec = f"{steps}@{dim}/{dec_dim}"
            for m in degrade:
                row(f"  latents at MSE {m} (fit {spec})", recon(vae, truth, m), truth, ids)
    print(
        "\n| frames | ids mIoU | parts mIoU | player IoU | player parts mIoU | pixel acc | PSNR dB | fit s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ps = "∞" if math.isinf(r["psnr_db"]) else "–" if math.isnan(r["psnr_db"]) else f"{r['psnr_db']:.1f}"
        print(
            f"| {r['row']} | {r['miou']:.3f} | {r['miou_parts']:.3f} | {r['player_iou']:.3f} | "
            f"{r['player_parts_miou']:.3f} | {r['pixel_acc']:.3f} | {ps} | {r.get('fit_s', '')} |"
        )


if __name__ == "__main__":
    main()
