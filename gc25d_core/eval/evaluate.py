"""The evaluation of exports on the two sweeps (gc25d_core.eval.sweeps) of one snapshot's val split.

    clips, cases = load_cases(cfg, ecfg, manifest_version)      # the same cases for every export
    result = evaluate_export(export, cfg, ecfg, cases, clips, decode)   # one JSON-able dict
    write_reports(out_dir, [result, ...])                         # eval.report

Every export answers the same cases with the same seeds: noise per (seed, sweep, case), the own and
the swapped conditioning from the same anchor and noise. ``decode(latents [B, 48, N, H, W]) ->
frames [B, 3, F, h, w]`` in [−1, 1] is any VAE decoder (``vae_decoder``); pixel metrics compare the
rollout's frames with the decode of the ground-truth latents (each clip decoded on its own, as it
was encoded), so they leave out the VAE's own reconstruction error. Without a decoder only the
latent metrics are written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.eval import metrics as M
from gc25d_core.eval.spec import EvalConfig, EvalExport
from gc25d_core.eval.spec import exports_of_handoff as exports_of_handoff  # its home is eval.spec
from gc25d_core.eval.sweeps import (
    REGIONS,
    Case,
    ClipInfo,
    EvalClip,
    chain241_cases,
    clip28_cases,
    needed_clips,
    select_chain241,
    select_clip28,
)

Decode = Callable[[torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------------------------
# the val clips of the snapshot


def _val_dataset(cfg: Gc25dConfig, manifest_version: int | None) -> Any:
    from gc25d_core.cache.consumer import ConsumerConfig, StreamingCache
    from gc25d_core.cache.stores import open_store

    return StreamingCache(
        open_store(cfg.cache.store),
        ConsumerConfig(split="val", seed=0, batch_size=1),
        manifest=manifest_version,
        rank=0,
        world_size=1,
        collate_fn=None,
    )


def _samples(ds: Any):
    if ds.num_eligible() == 0:
        return
    for batch in ds.iter_batches():
        yield from batch.samples


def load_cases(
    cfg: Gc25dConfig, ecfg: EvalConfig, manifest_version: int | None
) -> tuple[dict[str, list[Case]], dict[str, EvalClip]]:
    """The sweeps' cases and the clips they read. Two passes over the val split: the first reads
    only each sample's JSON to select, the second keeps the tensors of the selected clips."""
    from gc25d_core.text import NULL_KEY, prompt_keys
    from gc25d_core.vocab import check_ids

    ds = _val_dataset(cfg, manifest_version)
    infos = [
        ClipInfo(
            s.key.sample_id,
            str(s.meta["run"]),
            int(s.meta["start"]),
            bool(s.meta.get("has_ext", False)),
            s.meta.get("ext_source"),
        )
        for s in _samples(ds)
    ]
    tl = cfg.timeline
    picked = select_clip28(infos, ecfg.clip28_clips)
    chains = select_chain241(infos, ecfg.chain241_chains, tl, ecfg.chain241_cells)
    need = needed_clips(infos, tl, picked, chains, ecfg.chain241_cells)
    to_key = prompt_keys(cfg)

    def keys(prompts: Sequence[str], where: str) -> list[str]:
        try:
            return [to_key[p] for p in prompts]
        except KeyError as e:
            raise ValueError(
                f"val sample {where}: prompt {e} is not in the text table (configs/text)"
            ) from None

    clips: dict[str, EvalClip] = {}
    for s in _samples(_val_dataset(cfg, manifest_version)):
        sid = s.key.sample_id
        if sid not in need:
            continue
        t = s.tensors
        if "cond_ids" not in t:
            raise ValueError(f"val sample {sid}: no cond_ids (evaluation conditions on the ids)")
        check_ids(t["cond_ids"].numpy(), cfg.vocab, f"val {sid}: cond_ids")
        has_ext = bool(s.meta.get("has_ext", False)) and "cond_ext_ids" in t
        if has_ext:
            check_ids(t["cond_ext_ids"].numpy(), cfg.vocab, f"val {sid}: cond_ext_ids")
        clips[sid] = EvalClip(
            sample_id=sid,
            run=str(s.meta["run"]),
            start=int(s.meta["start"]),
            latent=t["latent"],
            ids=t["cond_ids"],
            keys=keys(s.meta["prompts"], f"{sid} prompts"),
            ext_ids=t["cond_ext_ids"] if has_ext else None,
            ext_keys=keys(s.meta["ext_prompts"], f"{sid} ext_prompts") if has_ext else None,
            ext_source=s.meta.get("ext_source") if has_ext else None,
        )
    missing = need - set(clips)
    if missing:
        raise ValueError(f"val clips {sorted(missing)} vanished between two reads of the same snapshot")
    listed = list(clips.values())
    cases = {
        "clip28": clip28_cases(listed, picked, tl, NULL_KEY, ecfg.clip28_cells),
        "chain241": chain241_cases(listed, chains, tl, NULL_KEY, ecfg.chain241_cells),
    }
    return cases, clips


# ------------------------------------------------------------------------------------------------
# decoding


def vae_decoder(vae: Any) -> Decode:
    """``decode`` through the VAE interface's whole-clip decode (gc25d_core.models.vae.decode_video:
    fp32, non-tiled, batched, on the VAE's device), clamped to [−1, 1]."""
    from gc25d_core.models.vae import decode_video

    def decode(latents: torch.Tensor) -> torch.Tensor:
        return decode_video(vae, latents).clamp_(-1, 1)

    return decode


class Reference:
    """Ground truth of a case, assembled per cell from its clips: latents [48, N, H, W] (zeros where
    none) and decoded frames uint8 [F, h, w, 3]; each clip is decoded once and kept."""

    def __init__(self, clips: dict[str, EvalClip], decode: Decode | None):
        self.clips, self.decode = clips, decode
        self._frames: dict[str, np.ndarray] = {}

    def clip_frames(self, sid: str) -> np.ndarray:
        if sid not in self._frames:
            assert self.decode is not None
            latent = self.clips[sid].latent.float()[None]
            self._frames[sid] = M.to_uint8_frames(self.decode(latent))
        return self._frames[sid]

    def latents(self, case: Case) -> torch.Tensor:
        c, _, h, w = case.anchor.shape
        out = torch.zeros(c, case.num_cells, h, w)
        for g, src in enumerate(case.gt_from):
            if src is not None:
                out[:, g] = self.clips[src[0]].latent[:, src[1]].float()
        return out

    def frames(self, case: Case, like: np.ndarray) -> np.ndarray:
        out = np.zeros_like(like)
        for g, src in enumerate(case.gt_from):
            if src is not None:
                fr, sr = M.cell_frames(g), M.cell_frames(src[1])
                out[fr.start : fr.stop] = self.clip_frames(src[0])[sr.start : sr.stop]
        return out


# ------------------------------------------------------------------------------------------------
# scoring


def _cells(region: tuple[int, int], n: int) -> list[int]:
    return [k for k in range(region[0], region[1] + 1) if k < n]


def score_case(
    case: Case,
    own: torch.Tensor,
    other: torch.Tensor,
    ref: Reference,
    cap: float,
    frames: tuple[np.ndarray, np.ndarray] | None,
) -> dict[str, Any]:
    """Per-cell curves and region means of one case: latents [48, N, H, W] of the own / swapped
    rollouts, their decoded uint8 frames (or None: latent metrics only)."""
    n, has_gt = case.num_cells, case.has_gt
    gt = ref.latents(case)
    gt_cells = [k for k in range(1, n) if has_gt[k]]
    ref_rms = M.nan_mean(M.latent_rms_per_cell(gt)[k] for k in gt_cells)
    curves: dict[str, list[float]] = {
        "latent_mse": M.latent_mse_per_cell(own, gt, has_gt),
        "latent_mse_other": M.latent_mse_per_cell(other, gt, has_gt),
        "latent_rms_ratio": [r / ref_rms if ref_rms > 0 else math.nan for r in M.latent_rms_per_cell(own)],
        "cond_sensitivity": M.latent_mse_per_cell(own, other, [True] * n),
    }
    gt_frames = None
    if frames is not None:
        own_f, other_f = frames
        gt_frames = ref.frames(case, own_f)
        curves["psnr"] = M.psnr_per_cell(own_f, gt_frames, has_gt, cap)
        curves["psnr_other"] = M.psnr_per_cell(other_f, gt_frames, has_gt, cap)
        curves["delta_psnr"] = [a - b for a, b in zip(curves["psnr"], curves["psnr_other"], strict=True)]
    regions: dict[str, dict[str, float]] = {}
    for name, rng in {**REGIONS[case.sweep], "all": (1, n - 1)}.items():
        cells = _cells(rng, n)
        r = {key: M.nan_mean(vals[k] for k in cells) for key, vals in curves.items()}
        r["gt_cells"] = float(sum(has_gt[k] for k in cells))
        if frames is not None and gt_frames is not None:
            for key, value in M.flicker(frames[0], cells).items():
                r[f"flicker_{key}"] = value
            # the ground truth's own flicker, over cells whose frames and predecessor come from one clip
            same = [
                k
                for k in cells
                if has_gt[k] and has_gt[k - 1] and case.gt_from[k][0] == case.gt_from[k - 1][0]  # type: ignore[index]
            ]
            for key, value in M.flicker(gt_frames, same).items():
                r[f"gt_flicker_{key}"] = value
        regions[name] = r
    return {
        "case_id": case.case_id,
        "run": case.run,
        "start": case.start,
        "num_cells": n,
        "gt_cells": [k for k in range(n) if has_gt[k]],
        "filled_cells": [k for k in range(n) if case.filled[k]],
        "swapped_with": case.other_from,
        "info": case.info,
        "curves": curves,
        "regions": regions,
    }


def aggregate(scored: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over cases of every per-cell curve (cells where a case has no value are skipped) and of
    every region value."""
    if not scored:
        return {"num_cases": 0, "curves": {}, "regions": {}}
    n = scored[0]["num_cells"]
    curves = {
        key: [M.nan_mean(s["curves"][key][k] for s in scored) for k in range(n)]
        for key in scored[0]["curves"]
    }
    regions = {
        name: {key: M.nan_mean(s["regions"][name][key] for s in scored) for key in r}
        for name, r in scored[0]["regions"].items()
    }
    return {"num_cases": len(scored), "num_cells": n, "curves": curves, "regions": regions}


# ------------------------------------------------------------------------------------------------
# one export


def build_sampler(export: EvalExport, cfg: Gc25dConfig, ecfg: EvalConfig, device: torch.device) -> Any:
    from gc25d_core.eval.samplers import CausalSampler, TeacherSampler
    from gc25d_core.flow import WAN_SCHEDULE
    from gc25d_core.models.loading import load_gc_weights
    from gc25d_core.text import TextBank, load_text_table

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, meta = load_gc_weights(export.path, device=device, dtype=dtype, expected_sha256=export.sha256)
    model.eval().requires_grad_(False)
    if meta.vocab != cfg.vocab:
        raise ValueError(f"export {export.path}: vocab {meta.vocab!r}, the snapshot's ids are {cfg.vocab!r}")
    text = TextBank(load_text_table(cfg), device)
    if meta.causal is not None:
        assert meta.denoise_axis is not None  # parse_metadata requires it for a causal export
        return CausalSampler(model, text, meta.causal, meta.denoise_axis)
    return TeacherSampler(
        model,
        text,
        WAN_SCHEDULE,
        steps=ecfg.teacher_steps,
        window=min(ecfg.teacher_window, cfg.timeline.num_cells),
        context_cells=ecfg.teacher_context_cells,
        frames_per_cell=cfg.timeline.frames_per_cell,
    )


def evaluate_export(
    export: EvalExport,
    cfg: Gc25dConfig,
    ecfg: EvalConfig,
    cases: dict[str, list[Case]],
    ref: Reference,
    *,
    sampler: Any = None,
    log: Callable[[str], None] = lambda _: None,
    keep_rollouts: int = 1,
) -> dict[str, Any]:
    """Roll out every case with ``export`` (or a given ``sampler``) and score it. The first
    ``keep_rollouts`` cases of each sweep keep their frames under ``rollouts`` (for the report's
    strips; not JSON). ``gc25d_core.eval.run`` does the same over several ranks: ``roll_cases`` on
    each rank's share, ``assemble`` on rank 0."""
    from gc25d_core.distributed import pick_device

    sampler = sampler if sampler is not None else build_sampler(export, cfg, ecfg, pick_device(cfg))
    done = roll_cases(export.label, sampler, cfg, ecfg, cases, ref, log=log, keep_rollouts=keep_rollouts)
    return assemble(export, sampler.describe(), ecfg, cases, done)


# (sweep, index of the case in its sweep) -> (its scores, its rollout or None)
CaseResults = dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any] | None]]


def roll_cases(
    label: str,
    sampler: Any,
    cfg: Gc25dConfig,
    ecfg: EvalConfig,
    cases: dict[str, list[Case]],
    ref: Reference,
    *,
    log: Callable[[str], None] = lambda _: None,
    keep_rollouts: int = 1,
    rank: int = 0,
    world_size: int = 1,
) -> CaseResults:
    """Roll out and score this rank's share of the cases: the n-th case of all sweeps in order on
    rank n % world_size. A case's noise depends on (seed, sweep, case id) alone, so a case scores
    the same on any rank."""
    from gc25d_core.distributed import pick_device
    from gc25d_core.hashing import seed_int

    device = pick_device(cfg)
    decode = ref.decode if ecfg.decode else None
    every = [(sweep, i) for sweep, sweep_cases in cases.items() for i in range(len(sweep_cases))]
    out: CaseResults = {}
    for sweep, i in every[rank::world_size]:
        case = cases[sweep][i]
        assert case.other_ids is not None and case.other_keys is not None
        # the own and the swapped conditioning as one batch, each row with the same noise as alone
        seed = seed_int(ecfg.seed, sweep, case.case_id)
        gens = [torch.Generator(device).manual_seed(seed) for _ in range(2)]
        both = sampler(
            case.anchor[None].repeat(2, *([1] * case.anchor.ndim)),
            torch.stack([case.ids, case.other_ids]),
            [case.keys, case.other_keys],
            case.num_cells,
            gens,
        ).cpu()
        rolls = [both[0], both[1]]
        frames = None
        if decode is not None:
            decoded = decode(both)
            frames = (M.to_uint8_frames(decoded[:1]), M.to_uint8_frames(decoded[1:]))
        scored = score_case(case, rolls[0], rolls[1], ref, ecfg.psnr_cap_db, frames)
        rollout = None
        if i < keep_rollouts:
            rollout = {
                "case": case,
                "latents": rolls[0],
                "frames": None if frames is None else frames[0],
                "gt_frames": None if frames is None else ref.frames(case, frames[0]),
            }
        out[sweep, i] = (scored, rollout)
        log(f"{label} {sweep} {case.case_id}: latent mse {scored['regions']['all']['latent_mse']:.4g}")
    return out


def export_doc(export: EvalExport) -> dict[str, Any]:
    """An export as the results name it."""
    return {
        "label": export.label,
        "path": export.recorded or str(export.path),
        "sha256": export.sha256,
        "stage": export.stage,
        "step": export.step,
    }


def assemble(
    export: EvalExport,
    sampler: dict[str, Any],
    ecfg: EvalConfig,
    cases: dict[str, list[Case]],
    done: CaseResults,
) -> dict[str, Any]:
    """One export's result from the scores of all its cases (``roll_cases`` of every rank), each
    sweep aggregated over its cases in their order; ``sampler`` is the sampler's ``describe()``."""
    out: dict[str, Any] = {
        "export": export_doc(export),
        "sampler": sampler,
        "eval": ecfg.model_dump(),
        "sweeps": {},
        "rollouts": {},
    }
    for sweep, sweep_cases in cases.items():
        missing = [sweep_cases[i].case_id for i in range(len(sweep_cases)) if (sweep, i) not in done]
        if missing:
            raise ValueError(f"{export.label} {sweep}: no result for cases {missing}")
        scored = [done[sweep, i][0] for i in range(len(sweep_cases))]
        for i in range(len(sweep_cases)):
            if (rollout := done[sweep, i][1]) is not None:
                out["rollouts"][sweep] = rollout
        out["sweeps"][sweep] = {**aggregate(scored), "cases": scored}
    return out
