"""The play page's picture as a PNG: what a player sees beside the truth and the ids (issue 35, item 5).

Columns, one row per picked moment (upscaled ×``--scale``, nearest, labelled):

    truth (the code world's RGB) | picture | ids (the condition) | probe (the picture read back)

``--export PATH``: the picture is a live session's frame (gc25d_core.deploy.session, the same code
``make play`` serves) under a scripted walk (forward, a turn, a run, an attack), on the preset's
VAE (``--preset``; ``--data-root`` where its fitted tiny VAE is); the ids are the condition the model
was given. Without ``--export``: the picture is the tiny VAE's reconstruction of the truth
(``--vae`` + ``--sha256``, or a fit of ``--fit-steps`` on the code world's train split): the
ceiling any model decoded by that VAE can show (``--linear K``: of the best linear code of K numbers a
latent, picture_study's reference). The ids probe's scores of the picture are printed
as JSON and written beside the PNG (``.json``).

``--frames-out NPZ`` keeps the frames (truth, picture, ids) and stops before the probe; ``--frames-in
NPZ`` scores such a file: the GPU machine plays the `small` student (bench/quality/small_chain.py)
and the probe, fitted on the same code world (``--preset small``, deterministic from its seed),
reads its frames on any machine.

Usage:
  python -m bench.quality.picture_sheet --raw /tmp/picture/raw --work /tmp/picture/study \
      --out docs/images/picture_tiny_ceiling.png [--fit-steps 160]
  python -m bench.quality.picture_sheet --raw RAW --work WORK --export outputs/tiny/.../export.safetensors \
      --data-root data/tiny/gc25d --out docs/images/play_tiny.png
  python -m bench.quality.picture_sheet --preset small --raw /tmp/smallworld/raw --work /tmp/smallworld/gc25d \
      --frames-in stage3_dmd_ema.npz --out docs/images/play_small_stage3.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cpu_threads

# the scripted walk: (cells, block), a block being (move, run, attack, dodge, stance) as
# gc25d_core.text.FIELD_RANGES reads it: walk forward, forward-left, run forward, a light attack
SCRIPT: tuple[tuple[int, tuple[int, ...]], ...] = (
    (6, (1, 0, 0, 0, 0)),
    (4, (5, 0, 0, 0, 0)),
    (4, (1, 1, 0, 0, 0)),
    (2, (0, 0, 1, 0, 0)),
)


def sheet(
    truth: np.ndarray, picture: np.ndarray, ids: np.ndarray, read: np.ndarray, scale: int
) -> np.ndarray:
    """Rows of truth | picture | ids | read-back (all [N, H, W, ...] uint8) as one RGB image."""
    from gc25d_core.preview import colorize_ids, side_by_side

    panels = [truth, picture, colorize_ids(ids), colorize_ids(read)]
    rows = side_by_side(panels, ["truth", "picture", "ids", "probe"], scale=scale)  # [N, h, 4w, 3]
    gap = np.full((rows.shape[0], 2, rows.shape[2], 3), 255, np.uint8)
    return np.concatenate(list(np.concatenate([rows, gap], axis=1)), axis=0)


def session_frames(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truth, picture, ids) at the last frame of every cell of the scripted walk."""
    from gc25d_core.config import load_config
    from gc25d_core.deploy.runtime import RuntimeOptions
    from gc25d_core.deploy.session import open_session
    from gc25d_core.deploy.world import WorldConfig

    cfg = load_config(args.preset, {"paths": {"data_root": str(args.data_root)}})
    session = open_session(
        args.export,
        cfg,
        world=WorldConfig(renderer="numpy"),
        options=RuntimeOptions(seed=0, decoder="vae"),
        device=args.device,
    )
    # the session hands out decoded video in chunks ([T, H, W, 3]: the anchor, then 4 frames a cell)
    chunks = list(session.start())
    truth, ids, at = [], [], []
    for cells, block in SCRIPT * args.repeat:
        for _ in range(cells):
            out = session.step(np.asarray(block, np.uint8))
            chunks.extend(out.out.frames)
            state = session.world.last_state
            assert state is not None
            truth.append(session.world.render_rgb(state))
            ids.append(np.asarray(out.ids)[-1])
            at.append(4 * out.cell)  # the cell's last frame in the decoded video
    chunks.extend(session.runtime.flush())
    frames = [f for c in chunks for f in (c if c.ndim == 4 else c[None])]
    keep = [i for i, f in enumerate(at) if f < len(frames)]  # a decode still pending is left out
    pics = np.stack([frames[at[i]] for i in keep])
    return np.stack([truth[i] for i in keep]), pics, np.stack([ids[i] for i in keep])


def ceiling_frames(args: argparse.Namespace, cfg: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truth, the tiny VAE's reconstruction, ids) of the val clips' first ``--ceiling-frames``
    frames (17; 81: whole clips, where a VAE fitted on short windows reconstructs its later latent
    frames worse than its first); with ``--linear K`` the reconstruction is the best linear code of
    K numbers a latent instead."""
    from bench.quality.picture_study import fit_vae, held_out, linear_code_recon, recon, train_clips
    from gc25d_core.models.vae_fit import load_tiny_vae

    truth, ids = held_out(cfg, args.ceiling_frames)
    if args.linear is not None:  # the best linear code of the VAE's shape (picture_study --linear)
        return (
            np.concatenate(truth),
            np.concatenate(linear_code_recon(train_clips(cfg)[0], truth, args.linear)),
            np.concatenate(ids),
        )
    if args.vae is not None:
        vae = load_tiny_vae(args.vae, expected_sha256=args.sha256)
    else:
        clips, classes = train_clips(cfg, classes=bool(cfg.vae.fit.class_weight))
        vae, _ = fit_vae(clips, args.fit_steps, 16, cfg, classes=classes)
    return np.concatenate(truth), np.concatenate(recon(vae, truth)), np.concatenate(ids)


FRAMES = ("truth", "picture", "ids")


def check_frames(
    where: Path | str, truth: np.ndarray, picture: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 frames [N, H, W, 3] twice and ids [N, H, W] of one size, else a ValueError naming
    ``where`` and the array."""
    n = len(ids)
    for name, a, ndim in (("truth", truth, 4), ("picture", picture, 4), ("ids", ids, 3)):
        if a.dtype != np.uint8 or a.ndim != ndim or len(a) != n or a.shape[1:3] != ids.shape[1:3]:
            raise ValueError(
                f"{where}: {name} is {a.dtype} {a.shape}, expected uint8 with the ids' {ids.shape}"
            )
    return truth, picture, ids


def write_frames(path: Path, truth: np.ndarray, picture: np.ndarray, ids: np.ndarray) -> None:
    """The frames a sheet is made of, checked, compressed, written atomically."""
    import io

    from gc25d_core.atomic import atomic_write_bytes

    check_frames(path, truth, picture, ids)
    buf = io.BytesIO()
    np.savez_compressed(buf, truth=truth, picture=picture, ids=ids)
    atomic_write_bytes(path, buf.getvalue())


def read_frames(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``write_frames``' arrays, checked: uint8 frames [N, H, W, 3] twice and ids [N, H, W] (no
    pickled objects are loaded)."""
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in FRAMES if k not in z.files]
        if missing:
            raise ValueError(f"{path}: no {missing} arrays (a picture_sheet --frames-out file has {FRAMES})")
        truth, picture, ids = (z[k] for k in FRAMES)
    return check_frames(path, truth, picture, ids)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, required=True, help="the preset's code world (the probe's data)")
    ap.add_argument("--work", type=Path, required=True, help="where the probe's fit is kept")
    ap.add_argument("--out", type=Path, default=None, help="the sheet's PNG (its scores beside it, .json)")
    ap.add_argument("--export", type=Path, default=None)
    ap.add_argument("--preset", default="tiny", help="a preset name or a run's config.yaml")
    ap.add_argument("--device", default="cpu", help="where the session plays (--export)")
    ap.add_argument("--repeat", type=int, default=1, help="times the scripted walk is played in turn")
    ap.add_argument("--frames-out", type=Path, default=None, help="keep the frames here (.npz) and stop")
    ap.add_argument("--frames-in", type=Path, default=None, help="score these frames (.npz) instead")
    ap.add_argument("--data-root", type=Path, default=None)
    ap.add_argument("--vae", type=Path, default=None)
    ap.add_argument("--sha256", default=None)
    ap.add_argument("--fit-steps", type=int, default=160)
    ap.add_argument(
        "--ceiling-frames",
        type=int,
        default=17,
        help="the ceiling's frames from the start of each val clip (1 + 4k, at most 81: whole clips)",
    )
    ap.add_argument(
        "--linear",
        type=int,
        default=None,
        metavar="K",
        help="the ceiling of a linear code of K numbers a latent",
    )
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--scale", type=int, default=3)
    args = ap.parse_args(argv)
    if args.out is None and args.frames_out is None:
        ap.error("--out (the sheet) or --frames-out (the frames only) is needed")
    if not 1 <= args.ceiling_frames <= 81 or (args.ceiling_frames - 1) % 4:
        ap.error(f"--ceiling-frames {args.ceiling_frames}: 1 + 4k frames, at most a clip's 81")

    from gc25d_core.atomic import atomic_write_bytes, atomic_write_text
    from gc25d_core.config import load_config
    from gc25d_core.eval.ids_probe import ensure_probe, scores_from_ids
    from gc25d_core.preview import png_bytes

    cpu_threads(2)
    cfg = load_config(args.preset, {"raw": {"root": str(args.raw)}, "paths": {"data_root": str(args.work)}})
    if args.frames_in is not None:
        truth, picture, ids = read_frames(args.frames_in)
    elif args.export is not None:
        truth, picture, ids = session_frames(args)
    else:
        truth, picture, ids = ceiling_frames(args, cfg)
    if args.frames_out is not None:
        write_frames(args.frames_out, truth, picture, ids)
        print(json.dumps({"frames": str(args.frames_out), "count": len(ids)}))
        return
    probe, _ = ensure_probe(cfg)
    read = probe.predict(picture)
    scores = {k: v for k, v in scores_from_ids(read, ids).items() if k != "per_class"}
    scores["truth"] = {
        k: v for k, v in scores_from_ids(probe.predict(truth), ids).items() if k != "per_class"
    }
    picks = np.linspace(0, len(ids) - 1, args.rows).round().astype(int)
    img = sheet(truth[picks], picture[picks], ids[picks], read[picks], args.scale)
    atomic_write_bytes(args.out, png_bytes(img))
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(scores, indent=1))
    print(json.dumps({"png": str(args.out), **scores}))


if __name__ == "__main__":
    main()
