"""Does a frame show the scene its ids describe? A per-pixel ids probe (issue 35, item 5).

PSNR against truth cannot tell a blur from a picture of the wrong scene, and the learned scores
(LPIPS, FVD) need weights this project cannot fetch. The code world renders, for every frame, the
RGB *and* the "parts" ids that produced it, so a small per-pixel classifier (an MLP on each
pixel's colour and the colour statistics of its neighbourhood) fitted on the train split's
(RGB, ids) pairs reads any frame back into ids; its agreement with the ids that conditioned
a generated frame says whether the frame shows that scene (the sky line, the pillars, the player).

    probe = ensure_probe(cfg)                    # fit on the train split, or load the recorded fit
    scores = score_frames(frames_uint8, ids, probe)   # {"miou", "player_iou", ...}

The probe's own ceiling is reported beside every use: on the true frames (how well the probe reads
the code world) and on the VAE's reconstruction of them (how much of the scene any latent can
carry). The fit is seeded and runs with a fixed number of threads (the reduction order), so the
same inputs give the same weights; ``save_probe`` writes safetensors and returns its SHA256, and
``ensure_probe`` keeps a record (``<file>.json``: SHA256, the inputs' key, the fit's summary) like
the tiny VAE's, so an unchanged rerun loads instead of fitting.

Scores (``score_frames``), over all the frames given, each IoU accumulated over frames:
* ``miou``: mean IoU over the classes of the "ids" vocabulary (the seven static classes, the player,
  the boss) present in the conditioning ids: is the scene there? (Pixels whose conditioning id is
  UNKNOWN, the live world's unseen places, are not scored.)
* ``miou_parts``: the same over the "parts" classes (each arm, leg and weapon its own class);
* ``player_iou``: IoU of the player's pixels (its six parts as one class), NaN when the ids show no
  player; ``player_parts_miou``: mean IoU over the player's parts present in the ids;
* ``pixel_acc``: the fraction of pixels whose class the probe reads back as conditioned;
* ``per_class``: IoU per present class, by name.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from gc25d_core.vocab import (
    BOSS_PART_IDS,
    PART_NAMES,
    PLAYER_CORE,
    PLAYER_PART_IDS,
    STATIC_IDS,
    UNKNOWN,
    Vocab,
    collapse_parts,
    num_classes,
    raw_to_class,
    valid_raw_ids,
)

if TYPE_CHECKING:
    from gc25d_core.config import Gc25dConfig

PROBE_FORMAT = "gc25d_ids_probe"
PROBE_VERSION = 2  # part of the inputs key: bump it when the fit's code changes what it produces
PROBE_FILE = "ids_probe.safetensors"  # under cfg.paths.data_root, beside the tiny VAE's fit
VOCAB: Vocab = "parts"  # what the probe reads
IDS_VOCAB: Vocab = "ids"  # what "miou" scores: the static classes, the player, the boss
CLASSES: tuple[int, ...] = valid_raw_ids(VOCAB)  # raw id per class index (UNKNOWN last)


def class_names() -> list[str]:
    names = {**STATIC_IDS, UNKNOWN: "unknown"}
    names.update({r: f"player_{p}" for r, p in zip(PLAYER_PART_IDS, PART_NAMES, strict=True)})
    names.update({r: f"boss_{p}" for r, p in zip(BOSS_PART_IDS, PART_NAMES, strict=True)})
    return [names[r] for r in CLASSES]


@dataclass(frozen=True)
class ProbeSettings:
    """The fit's settings (all part of the inputs key)."""

    hidden: int = 64
    steps: int = 900  # val truth mIoU 0.50 at 300 steps, 0.60 at 900 (docs/picture_study.md)
    batch: int = 2048  # pixels a step
    per_class: int = 10000  # pixels drawn per class (fewer where a class has fewer)
    prior: float = 0.5  # the log class frequency added to the logits, times this (see IdsProbeNet)
    lr: float = 3e-3
    seed: int = 0
    threads: int = 2
    every: int = 2  # every n-th frame of the train runs (neighbours are nearly the same picture)


_POOLS = (3, 7, 15, 31)  # box sides of the local means; the std at the first three


def pixel_features(x: torch.Tensor) -> torch.Tensor:
    """RGB [B, 3, H, W] in [-1, 1] → per-pixel features [B, 24, H, W]: the colour, its local means
    over boxes of 3..31 px and its local standard deviations over 3..15 px (texture). Local only:
    no coordinates, so the probe reads the picture, and a blank frame reads as blank, not as a
    sky above a ground."""
    out, both = [x], torch.cat([x, x * x], 1)
    for k in _POOLS:
        if k < _POOLS[-1]:
            m, m2 = _box_mean(both, k).split(3, 1)
            out += [m, (m2 - m * m).clamp_min(0).sqrt()]
        else:
            out.append(_box_mean(x, k))
    return torch.cat(out, 1)


def _box_mean(x: torch.Tensor, k: int) -> torch.Tensor:
    """The mean over the k × k box around each pixel, the box cut at the frame's edges. Two 1-D
    passes: the cut box is a rectangle, so its mean is the mean of the row means; a k × k pool costs
    k² adds a pixel on the CPU (most of the probe's fit and reading time at k = 31), two passes 2k."""
    pool = nn.functional.avg_pool2d
    x = pool(x, (k, 1), 1, (k // 2, 0), count_include_pad=False)
    return pool(x, (1, k), 1, (0, k // 2), count_include_pad=False)


NUM_FEATURES = 3 + 3 * len(_POOLS) + 3 * (len(_POOLS) - 1)


class IdsProbeNet(nn.Module):
    """Per-pixel MLP on ``pixel_features``: features [N, F] → class logits [N, K]. It is fitted on
    pixels drawn evenly per class (the player's small parts count beside the sky), so the class
    frequencies of the train frames (``log_prior``, times ``prior``) are added back when reading a
    frame: fewer small classes guessed where the picture is unclear."""

    def __init__(self, hidden: int = 64, classes: int = num_classes(VOCAB), prior: float = 0.5):
        super().__init__()
        self.prior = prior
        self.mlp = nn.Sequential(
            nn.Linear(NUM_FEATURES, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )
        self.log_prior: torch.Tensor
        self.register_buffer("log_prior", torch.zeros(classes))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.mlp(feats)

    def frame_logits(self, x: torch.Tensor) -> torch.Tensor:
        """RGB [B, 3, H, W] in [-1, 1] → logits [B, K, H, W], the prior added."""
        f = pixel_features(x).permute(0, 2, 3, 1)
        return (self.mlp(f) + self.prior * self.log_prior).permute(0, 3, 1, 2)


def _to_input(frames: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    return x / 127.5 - 1.0


def _check_frames(frames: np.ndarray, where: str) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{where}: expected uint8 [F, H, W, 3] frames, got {frames.dtype} {frames.shape}")
    return frames


class IdsProbe:
    """A fitted probe: ``predict`` reads uint8 RGB frames into "parts" raw ids."""

    def __init__(self, net: IdsProbeNet, settings: ProbeSettings):
        self.net = net.eval().requires_grad_(False)
        self.settings = settings

    @torch.no_grad()
    def predict(self, frames: np.ndarray, chunk: int = 16) -> np.ndarray:
        """uint8 [F, H, W, 3] (or one [H, W, 3]) → raw "parts" ids uint8 [F, H, W]."""
        frames = _check_frames(frames, "IdsProbe.predict")
        lut = torch.tensor(CLASSES, dtype=torch.uint8)
        out = [
            lut[self.net.frame_logits(_to_input(frames[i : i + chunk])).argmax(1)].numpy()
            for i in range(0, len(frames), chunk)
        ]
        return np.concatenate(out)


# -- data: the code world's (RGB, ids) pairs at the preset's destination resolution --------------


def probe_pairs(cfg: Gc25dConfig, split: str = "train", every: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 [N, H, W, 3], "parts" raw ids uint8 [N, H, W]) of every ``every``-th frame of the
    raw dataset's runs of ``split`` (the index's run-level rule: ``index.val_runs`` are "val"),
    resampled exactly as the latents job (RGB) and the cond job (ids) resample them."""
    from gc25d_core.capsules import label_parts
    from gc25d_core.geometry import resample_ids, resample_rgb
    from gc25d_core.index import split_of_runs
    from gc25d_core.raw_frames import read_frame_json, read_ids, read_rgb
    from gc25d_core.raw_layout import RawSource

    raw = RawSource(Path(cfg.raw.root))
    runs = raw.runs()
    splits = split_of_runs([r.run for r in runs], cfg.index)
    rgb: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    for run in runs:
        if splits[run.run] != split:
            continue
        for f in range(0, run.info.num_frames, every):
            rgb.append(resample_rgb(read_rgb(run, f), cfg.geometry))
            fj = read_frame_json(run, f)  # as gc25d_core.preprocess.clips.cond_frame labels the parts
            g = resample_ids(read_ids(run, f), cfg.geometry)
            ids.append(label_parts(g, fj.world_to_clip, fj.world_to_view, fj, cfg.geometry))
    if not rgb:
        raise ValueError(f"{cfg.raw.root}: no {split!r} runs to take (RGB, ids) pairs from")
    return np.stack(rgb), np.stack(ids)


# -- the fit -------------------------------------------------------------------------------------


def _draw_pixels(cls: torch.Tensor, per_class: int, g: torch.Generator) -> torch.Tensor:
    """Flat pixel indices, up to ``per_class`` of every class present (ascending order)."""
    picks = []
    for c in torch.unique(cls):
        idx = torch.nonzero(cls == c).squeeze(1)
        picks.append(idx[torch.randperm(len(idx), generator=g)[:per_class]])
    return torch.sort(torch.cat(picks)).values


def fit_probe(
    rgb: np.ndarray,
    ids: np.ndarray,
    settings: ProbeSettings = ProbeSettings(),
    log: Callable[[int, float], None] | None = None,
) -> tuple[IdsProbe, dict[str, Any]]:
    """Fit the probe on uint8 RGB [N, H, W, 3] and raw "parts" ids [N, H, W]; deterministic for
    the same inputs and settings (seeded, ``settings.threads`` torch threads while it runs)."""
    rgb = _check_frames(rgb, "fit_probe rgb")
    if np.asarray(ids).shape != rgb.shape[:3]:
        raise ValueError(f"fit_probe: ids {np.asarray(ids).shape} do not match the frames {rgb.shape[:3]}")
    s = settings
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        torch.manual_seed(s.seed)
        g = torch.Generator().manual_seed(s.seed)
        k = num_classes(VOCAB)
        y = torch.from_numpy(raw_to_class(ids, VOCAB, "fit_probe ids")).reshape(-1)
        sel = _draw_pixels(y, s.per_class, g)
        per_frame = rgb.shape[1] * rgb.shape[2]
        feats = []
        with torch.no_grad():  # features of the drawn pixels, a few frames at a time
            for f0 in range(0, len(rgb), 16):
                lo, hi = f0 * per_frame, min(f0 + 16, len(rgb)) * per_frame
                part = sel[(sel >= lo) & (sel < hi)] - lo
                f = pixel_features(_to_input(rgb[f0 : f0 + 16])).permute(0, 2, 3, 1).reshape(-1, NUM_FEATURES)
                feats.append(f[part])
        x, yy = torch.cat(feats), y[sel]
        net = IdsProbeNet(s.hidden, k, s.prior)
        counts = torch.bincount(y, minlength=k).double()
        net.log_prior.copy_(torch.log(counts.clamp_min(1) / counts.sum()).float())
        opt = torch.optim.Adam(net.parameters(), lr=s.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(s.steps, 1))
        losses: list[float] = []
        for step in range(s.steps):
            b = torch.randint(len(yy), (s.batch,), generator=g)
            loss = nn.functional.cross_entropy(net(x[b]), yy[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if log is not None:
                log(step + 1, losses[-1])
    finally:
        torch.set_num_threads(threads)
    return IdsProbe(net, s), {
        "steps": s.steps,
        "frames": len(rgb),
        "pixels": len(yy),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


# -- scores --------------------------------------------------------------------------------------


def _iou(
    pred_cls: np.ndarray, true_cls: np.ndarray, k: int, skip: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-class IoU [k] (NaN where a class is in neither), which classes the truth holds and the
    pixel accuracy. Pixels whose true class is ``skip`` (UNKNOWN: the live world's unseen places)
    are left out: nothing says what they should show."""
    keep = true_cls.ravel() != skip
    flat = true_cls.ravel()[keep] * k + pred_cls.ravel()[keep]
    conf = np.bincount(flat, minlength=k * k).reshape(k, k).astype(np.float64)
    inter = np.diag(conf)
    union = conf.sum(0) + conf.sum(1) - inter
    present = conf.sum(1) > 0
    iou = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
    return iou, present, float(inter.sum() / max(conf.sum(), 1))


def scores_from_ids(pred_ids: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
    """Agreement of read-back ids with conditioning ids (both raw "parts" uint8 [F, H, W]); see the
    module's docstring for the fields. Classes are those present in ``ids``; pixels whose
    conditioning id is UNKNOWN are not scored."""
    pred_ids, ids = np.asarray(pred_ids), np.asarray(ids)
    if pred_ids.shape != ids.shape:
        raise ValueError(f"scores: read-back ids {pred_ids.shape} and conditioning ids {ids.shape} differ")
    k = num_classes(VOCAB)
    p = raw_to_class(pred_ids, VOCAB, "read-back ids")
    t = raw_to_class(ids, VOCAB, "conditioning ids")
    iou, present, acc = _iou(p, t, k, CLASSES.index(UNKNOWN))
    ids_classes = valid_raw_ids(IDS_VOCAB)
    iou_ids, present_ids, _ = _iou(
        raw_to_class(collapse_parts(pred_ids), IDS_VOCAB),
        raw_to_class(collapse_parts(ids), IDS_VOCAB),
        len(ids_classes),
        ids_classes.index(UNKNOWN),
    )
    names = class_names()
    player = np.isin(np.arange(k), [CLASSES.index(r) for r in PLAYER_PART_IDS])
    pp = present & player
    pc = ids_classes.index(PLAYER_CORE)
    return {
        "miou": float(iou_ids[present_ids].mean()) if present_ids.any() else math.nan,
        "miou_parts": float(iou[present].mean()) if present.any() else math.nan,
        "player_iou": float(iou_ids[pc]) if present_ids[pc] else math.nan,
        "player_parts_miou": float(iou[pp].mean()) if pp.any() else math.nan,
        "pixel_acc": acc,
        "classes_present": int(present.sum()),
        "frames": int(ids.shape[0]) if ids.ndim == 3 else 1,
        "per_class": {names[c]: float(iou[c]) for c in np.flatnonzero(present)},
    }


def score_frames(frames_uint8: np.ndarray, ids: np.ndarray, probe: IdsProbe) -> dict[str, Any]:
    """Read ``frames_uint8`` (uint8 [F, H, W, 3]) back into ids with ``probe`` and score them against
    the conditioning ``ids`` (raw "parts" uint8 [F, H, W], same F, H, W): ``scores_from_ids``."""
    frames = _check_frames(frames_uint8, "score_frames")
    ids = np.asarray(ids)
    if ids.ndim == 2:
        ids = ids[None]
    if ids.shape != frames.shape[:3]:
        raise ValueError(f"score_frames: ids {ids.shape} do not match the frames {frames.shape[:3]}")
    return scores_from_ids(probe.predict(frames), ids)


# -- file, record and the cached fit -------------------------------------------------------------


def save_probe(probe: IdsProbe, path: Path | str) -> str:
    """Atomic safetensors write of the net (the settings in the metadata); returns the SHA256."""
    from gc25d_core.hashing import sha256_file
    from gc25d_core.models.safetensors_file import save_safetensors

    meta = {PROBE_FORMAT: json.dumps(probe.settings.__dict__, sort_keys=True)}
    tensors = {k: v.contiguous() for k, v in probe.net.state_dict().items()}
    return sha256_file(save_safetensors(tensors, path, meta))


def load_probe(path: Path | str, *, expected_sha256: str) -> IdsProbe:
    """A saved probe, after its SHA256 matches (safetensors only: nothing unverified is parsed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from gc25d_core.hashing import sha256_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ids probe there (fit one with ensure_probe)")
    got = sha256_file(path)
    if got != expected_sha256:
        raise ValueError(f"{path}: sha256 {got} differs from the recorded {expected_sha256}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if PROBE_FORMAT not in meta:
        raise ValueError(f"{path}: not an ids probe (no metadata field {PROBE_FORMAT!r})")
    settings = ProbeSettings(**json.loads(meta[PROBE_FORMAT]))
    net = IdsProbeNet(settings.hidden, prior=settings.prior)
    net.load_state_dict(load_file(str(path)), strict=True)
    return IdsProbe(net, settings)


def probe_file(cfg: Gc25dConfig) -> Path:
    return Path(cfg.paths.data_root) / PROBE_FILE


def inputs_key(settings: ProbeSettings, arrays: Sequence[np.ndarray]) -> str:
    """SHA256 of what the fit depends on: format, version, settings and the pairs' bytes."""
    h = hashlib.sha256()
    head = {"format": PROBE_FORMAT, "version": PROBE_VERSION, "settings": settings.__dict__}
    h.update(json.dumps(head, sort_keys=True).encode())
    for a in arrays:
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def ensure_probe(
    cfg: Gc25dConfig, settings: ProbeSettings = ProbeSettings(), path: Path | str | None = None
) -> tuple[IdsProbe, dict[str, Any]]:
    """The probe fitted on ``cfg``'s train split: loaded when the record beside ``path`` (default
    ``probe_file(cfg)``) has the same inputs' key and the file its SHA256, else fitted and written
    (weights, then the record, both atomic). Returns the probe and the record (``"fitted"``: whether
    this call fitted it)."""
    from gc25d_core.atomic import atomic_write_text
    from gc25d_core.hashing import sha256_file

    path = Path(path) if path is not None else probe_file(cfg)
    record = path.with_suffix(".json")
    rgb, ids = probe_pairs(cfg, "train", settings.every)
    key = inputs_key(settings, [rgb, ids])
    if record.is_file() and path.is_file():
        try:
            rec = json.loads(record.read_text())
        except ValueError as e:
            raise ValueError(f"{record}: not an ids probe record ({e})") from None
        if rec.get("inputs_key") == key and sha256_file(path) == rec.get("sha256"):
            return load_probe(path, expected_sha256=rec["sha256"]), {**rec, "fitted": False}
    probe, summary = fit_probe(rgb, ids, settings)
    digest = save_probe(probe, path)
    truth = scores_from_ids(probe.predict(rgb), ids)  # on its own train pairs: did the fit work?
    rec = {
        "path": path.name,  # the file beside this record, by name: the data root can move
        "sha256": digest,
        "inputs_key": key,
        **summary,
        "train_miou": truth["miou"],
        "train_player_iou": truth["player_iou"],
    }
    atomic_write_text(record, json.dumps(rec, indent=1))
    return probe, {**rec, "fitted": True}
