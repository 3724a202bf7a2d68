"""Does the ids probe's own accuracy hold the picture's score down? Fit probes of other sizes on
the same train pairs and read the same frames with each: the truth, and the pictures of
``picture_sheet --frames-out`` files (a VAE's reconstruction, a student's session).

    python -m bench.quality.probe_capacity --preset small --raw /tmp/smallworld/raw \\
        --frames ceiling=ceil.npz --frames stage2_cd_ema=stage2_cd_ema.npz \\
        --variant default={} --variant wide='{"hidden": 256, "steps": 6000, "batch": 4096, "per_class": 50000}' \\
        --variant blur='{"blur": 2.0}'

One JSON line per variant: its settings, the fit's seconds and last loss, ids mIoU on every 8th
train frame, the "ids" IoU per class on the first frames file's truth, and per frames file
``[mIoU, player IoU]`` of the truth, of the picture and of a blank (mid-grey) frame: a reader that
finds the scene in a blank frame reads the ids, not the picture. ``"blur": S`` in a variant fits it
on the train pairs plus a copy of each frame blurred by a Gaussian of σ drawn in [0, S] px (the
same ids): a reader that has to find the scene where the texture is gone, as in a VAE's
reconstruction. A probe that reads the truth better but
the pictures no better says the pictures, not the reader, are what is missing
(docs/picture_study.md)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cpu_threads

Frames = tuple[np.ndarray, np.ndarray, np.ndarray]  # truth, picture, ids (picture_sheet's file)


def _pair(s: dict[str, Any]) -> list[float]:
    return [round(s["miou"], 3), round(s["player_iou"], 3)]


def with_blurred_copy(
    train: tuple[np.ndarray, np.ndarray], max_sigma: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The (RGB, ids) pairs and after them each frame again, blurred by a Gaussian of σ drawn
    uniformly in [0, ``max_sigma``] px (below 0.3 px: left sharp), with the same ids; seeded."""
    import cv2

    rgb, ids = train
    sigmas = np.random.default_rng(seed).uniform(0.0, max_sigma, len(rgb))
    blurred = np.stack(
        [cv2.GaussianBlur(f, (0, 0), s) if s >= 0.3 else f for f, s in zip(rgb, sigmas, strict=True)]
    )
    return np.concatenate([rgb, blurred]), np.concatenate([ids, ids])


def probe_fields(variant: dict[str, Any]) -> dict[str, Any]:
    """A variant's ``ProbeSettings`` fields: all of it but ``blur``, which shapes the train pairs."""
    return {k: v for k, v in variant.items() if k != "blur"}


def capacity_row(
    name: str, settings: dict[str, Any], train: tuple[np.ndarray, np.ndarray], sets: dict[str, Frames]
) -> dict[str, Any]:
    """Fit one probe variant (``ProbeSettings`` fields, and ``blur``: see the module's docstring) on
    ``train`` (RGB, ids) and read ``sets``."""
    from gc25d_core.eval.ids_probe import ProbeSettings, fit_probe, scores_from_ids
    from gc25d_core.vocab import STATIC_IDS

    t0 = time.perf_counter()
    pairs = with_blurred_copy(train, settings["blur"]) if settings.get("blur") else train
    probe, summary = fit_probe(*pairs, ProbeSettings(**probe_fields(settings)))
    row: dict[str, Any] = {
        "variant": name,
        "settings": settings,
        "fit_s": round(time.perf_counter() - t0, 1),
        "loss_last": round(summary["loss_last"], 3),
        "train_miou": round(scores_from_ids(probe.predict(train[0][::8]), train[1][::8])["miou"], 3),
    }
    for i, (label, (truth, picture, ids)) in enumerate(sets.items()):
        t = scores_from_ids(probe.predict(truth), ids)
        # one grey frame read: the probe reads each pixel from its neighbourhood, so every grey frame alike
        grey = np.repeat(probe.predict(np.full_like(truth[:1], 128)), len(ids), axis=0)
        row[label] = {
            "truth": _pair(t),
            "picture": _pair(scores_from_ids(probe.predict(picture), ids)),
            "blank": _pair(scores_from_ids(grey, ids)),
        }
        if i == 0:  # the static classes' IoU on the truth (per_class holds the present ones)
            row["truth_per_class"] = {
                n: round(t["per_class"][n], 2) for n in STATIC_IDS.values() if n in t["per_class"]
            }
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, required=True, help="the preset's code world (the train pairs)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--frames", action="append", default=[], metavar="LABEL=NPZ", required=True)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON", required=True)
    args = ap.parse_args(argv)

    from bench.quality.picture_sheet import read_frames
    from gc25d_core.config import load_config
    from gc25d_core.eval.ids_probe import ProbeSettings, probe_pairs

    def split(spec: str, flag: str) -> tuple[str, str]:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            ap.error(f"{flag} {spec!r}: NAME=VALUE")
        return name, value

    variants = {}
    for spec in args.variant:
        name, text = split(spec, "--variant")
        try:
            variants[name] = dict(json.loads(text))
            ProbeSettings(**probe_fields(variants[name]))
        except (ValueError, TypeError) as e:
            ap.error(f"--variant {name}: not a JSON object of ProbeSettings fields ({e})")
    sets = {label: read_frames(Path(p)) for label, p in (split(s, "--frames") for s in args.frames)}
    cpu_threads(2)
    cfg = load_config(args.preset, {"raw": {"root": str(args.raw)}})
    train = probe_pairs(cfg, "train", ProbeSettings().every)
    for name, settings in variants.items():
        print(json.dumps(capacity_row(name, settings, train, sets)), flush=True)


if __name__ == "__main__":
    main()
