"""A tiny training cache built in a folder from synthetic processed clips (latents, cond, meta,
index) — no raw data, no VAE — and the configs that train the stages on it: the worlds of the
training tests and of the benchmarks (bench/), which must not import tests/."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from gc25d_core.cache.from_layout import pack_and_publish
from gc25d_core.codeworld.camera import CAMERA_VARIANTS, aimed_pose, camera_matrices
from gc25d_core.config import Gc25dConfig, load_config, write_resolved
from gc25d_core.index import ClipRow, write_index
from gc25d_core.layout import (
    NUM_CAPSULES,
    Layout,
    Shapes,
    clip_id,
    write_cond,
    write_cond_ext,
    write_latents,
    write_meta,
)
from gc25d_core.text import block_to_prompt, text_data
from gc25d_core.timeline import cell_blocks
from gc25d_core.train.sft import with_sft

VAL_RUN = "R10_s1512"
TRAIN_RUNS = ("R10_s2024", "R10_s3036", "R10_s4048", "R10_s5060")
STARTS = (0, 96)  # 2 clips per run; shards of 2 = one run each, all train or all val


def _ids(shapes: Shapes, rng: np.random.Generator) -> np.ndarray:
    """Sky above a horizon, terrain / paving / vegetation below, a player and a boss blob moving."""
    f, h, w = shapes.cond
    ids = np.zeros((f, h, w), np.uint8)
    horizon = int(rng.integers(h // 4, h // 2))
    ids[:, horizon:] = 1
    ids[:, horizon + 6 :, : w // 3] = 2
    ids[:, horizon + 4 :, -w // 4 :] = 5
    x0, x1 = rng.integers(8, w - 24, size=2)
    for k in range(f):
        px = int(x0 + 8 * np.sin(k / 9))
        ids[k, h // 2 : h // 2 + 12, px : px + 8] = 10
        ids[k, h // 2 + 4 : h // 2 + 8, px + 8 : px + 10] = 16
        bx = int(x1 + 6 * np.cos(k / 7))
        ids[k, h // 2 - 6 : h // 2 + 10, bx : bx + 10] = 11
    return ids


def _meta(cfg: Gc25dConfig, shapes: Shapes, start: int, has_ext: bool = False) -> dict[str, np.ndarray]:
    f = shapes.meta_frames(has_ext)
    w2c, w2v, proj = [], [], []
    for k in range(f):
        pose = aimed_pose(
            np.array([3.0 * (start + k), 40.0 * np.sin(k / 20), 0.0]), 0.3, CAMERA_VARIANTS["tp_high"]
        )
        cam = camera_matrices(pose, cfg.geometry.src_width, cfg.geometry.src_height)
        w2c.append(cam.world_to_clip.ravel())
        w2v.append(cam.world_to_view.ravel())
        proj.append(cam.projection.ravel())
    return {
        "world_to_clip": np.array(w2c, np.float64),
        "world_to_view": np.array(w2v, np.float64),
        "projection": np.array(proj, np.float64),
        "orthographic": np.zeros(f, np.bool_),
        "fov_x_deg": np.full(f, 75.0, np.float32),
        "ortho_width_cm": np.full(f, 512.0, np.float32),
        "frame_offset_cm": np.zeros((f, 3), np.float32),
        "capsules": np.zeros((f, 2, NUM_CAPSULES, 7), np.float32),
        "actor_pos": np.zeros((f, 2, 3), np.float32),
        "ground_z": np.zeros(f, np.float32),
        "player_state": np.array(["idle"] * f),
        "boss_state": np.array(["idle"] * f),
        "player_px": np.full(f, -1, np.int32),
        "boss_px": np.full(f, -1, np.int32),
    }


def synthetic_row(run: str, start: int, split: str, scene: str = "arena", has_ext: bool = False) -> ClipRow:
    """An index row for a fabricated clip (no raw data behind it)."""
    return ClipRow(
        clip_id=clip_id(scene, run, start),
        subset="v10_real",
        scene=scene,
        run=run,
        start=start,
        end=start + 81,
        split=split,
        drop=False,
        drop_reason="",
        episode=0,
        camera_variant="tp_high",
        look_name="l",
        centered=True,
        n_events=0,
        dead_frac=0.0,
        has_ext=has_ext,
        ortho=False,
        ext_look_change=False,
    )


def latent_from_ids(ids: np.ndarray, shapes: Shapes, seed: int, noise: float = 0.1) -> torch.Tensor:
    """A latent the ids determine: every raw id has a fixed 48-vector (the same for every clip),
    averaged over each cell's frames (cell 0 = frame 0, cell j = frames 4j-3..4j) and over each
    latent pixel's 16x16 patch, plus ``noise`` (seeded per clip). Stands in for a VAE whose
    latents carry the picture, so a model that reads the ids can predict x0 and one that can't
    cannot."""
    c, t, h, w = shapes.latent
    f, hh, ww = ids.shape
    emb = np.random.default_rng(1234).standard_normal((256, c)).astype(np.float32)
    out = np.zeros((c, t, h, w), np.float32)
    for j in range(t):
        frames = [0] if j == 0 else list(range(4 * j - 3, 4 * j + 1))
        e = emb[ids[frames]].reshape(len(frames), h, hh // h, w, ww // w, c).mean(axis=(0, 2, 4))
        out[:, j] = e.transpose(2, 0, 1)
    out += noise * np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    return torch.from_numpy(out)


def write_synthetic_latents(
    layout: Layout,
    shapes: Shapes,
    row: ClipRow,
    seed: int,
    prompts: list[str],
    cells: np.ndarray,
    latent: torch.Tensor | None = None,
) -> None:
    """latents/<clip_id>.pt with ``latent`` (default: seeded random) and the given prompts / cell actions."""
    if latent is None:
        latent = torch.randn(shapes.latent, generator=torch.Generator().manual_seed(seed))
    write_latents(
        layout,
        {
            "latent": latent.to(torch.bfloat16),
            "prompts": prompts,
            "actions_block": torch.from_numpy(np.ascontiguousarray(cells)).to(torch.uint8),
            "clip_id": row.clip_id,
            "subset": row.subset,
            "scene": row.scene,
            "run": row.run,
            "start": row.start,
        },
        shapes,
    )


def write_clips(
    cfg: Gc25dConfig,
    starts: tuple[int, ...] = STARTS,
    latents: Literal["random", "from_ids"] = "random",
    ext: bool = False,
) -> list[str]:
    """Every clip of the world; with ``ext`` each also has its rollout extension (cond_ext: ids of
    frames s+81..s+108, the 7 extension blocks and prompts), as stage 3 needs."""
    layout, shapes = Layout(cfg.paths.data_root), Shapes.of(cfg)
    data = text_data(cfg.text)
    rows: list[ClipRow] = []
    runs: dict[str, str] = {}
    for run in (VAL_RUN, *TRAIN_RUNS):
        split = "val" if run == VAL_RUN else "train"
        runs[run] = split
        for s in starts:
            cid = clip_id("arena", run, s)
            rng = np.random.default_rng(len(rows) + 7)
            rows.append(synthetic_row(run, s, split, has_ext=ext))
            blocks20 = np.zeros((20, 5), np.uint8)
            blocks20[:, 0] = rng.integers(0, 9, 20)
            blocks20[:, 2] = (rng.random(20) < 0.2).astype(np.uint8)
            cells = cell_blocks(blocks20)
            prompts = [block_to_prompt(b, data) for b in cells]
            ids = _ids(shapes, rng)
            latent = latent_from_ids(ids, shapes, seed=len(rows)) if latents == "from_ids" else None
            write_synthetic_latents(layout, shapes, rows[-1], len(rows), prompts, cells, latent)
            write_cond(layout, cid, ids, shapes)
            write_meta(layout, cid, _meta(cfg, shapes, s, ext), shapes, ext)
            if ext:
                ext_blocks = np.zeros((shapes.timeline.num_ext_cells, 5), np.uint8)
                ext_blocks[:, 0] = rng.integers(0, 9, len(ext_blocks))
                ext_ids = _ids(shapes, rng)[: shapes.cond_ext[0]]
                ext_prompts = np.array([block_to_prompt(b, data) for b in ext_blocks])
                arrays = {"ids": ext_ids, "blocks": ext_blocks, "prompts": ext_prompts}
                write_cond_ext(layout.cond_ext(cid), arrays, shapes)
    write_index(layout, rows, runs)
    return [r.clip_id for r in rows]


def sft_world(
    root: Path,
    sft: dict[str, Any] | None = None,
    *,
    preset: str = "tiny",
    starts: tuple[int, ...] = STARTS,
    overrides: dict[str, Any] | None = None,
    latents: Literal["random", "from_ids"] = "random",
    section: str | dict[str, Any] | None = None,
    ext: bool = False,
) -> Gc25dConfig:
    """Processed layout + published cache under ``root`` (one shard per run); returns the ``preset``
    config with its sft section = configs/sft/<preset>.yaml merged with ``sft``."""
    from gc25d_core.config import deep_merge

    base: dict[str, Any] = {
        # the runs root is ``root``: the run folders and hand-offs callers make under it lie inside it
        "paths": {"data_root": str(root / "data"), "runs_root": str(root)},
        "raw": {"root": str(root / "raw")},
        "index": {"val_runs": [VAL_RUN]},
        "cache": {"store": str(root / "cache"), "samples_per_shard": len(starts)},
    }
    cfg = load_config(preset, deep_merge(base, overrides or {}))
    write_clips(cfg, starts, latents, ext)
    pack_and_publish(cfg)
    return with_sft(cfg, preset if section is None else section, sft)


def write_config(cfg: Gc25dConfig, path: Path) -> Path:
    return write_resolved(cfg, path.parent, path.name)


def random_teacher(
    cfg: Gc25dConfig, root: Path, seed: int = 0, causal: bool = False, stage: str | None = None
) -> Path:
    """A hand-off naming a seeded random tiny GcDiT export: the SFT pick's teacher.json, or with
    ``causal`` stage 1's final.json (a causal export with the deploy attention and axis), in
    ``root/<stage>/``, which must lie inside ``cfg.paths.runs_root``. Stands in where a test needs
    only a valid init, not a trained one."""
    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.handoff import FINAL, TEACHER, handoff_of, write_handoff_file
    from gc25d_core.models.configs import DEPLOY_CAUSAL, build_gcdit, tiny_config
    from gc25d_core.models.export import save_export

    torch.manual_seed(seed)
    model = build_gcdit(tiny_config(vocab=cfg.vocab))
    stage = stage or ("stage1_tf" if causal else "sft")
    folder = root / stage
    kw: dict[str, Any] = {"causal": DEPLOY_CAUSAL, "denoise_axis": DEPLOY_AXIS.timesteps} if causal else {}
    export = save_export(folder / "step-000001.safetensors", model, data="codeworld", **kw)
    # a stage with an EMA (stages 2 and 3) hands off an ema/ export too: the same weights here
    ema = (
        save_export(folder / "ema" / "step-000001.safetensors", model, data="codeworld", **kw)
        if stage in ("stage2_cd", "stage3_dmd")
        else None
    )
    name = FINAL if causal else TEACHER
    handoff = handoff_of(stage, 1, Path(export), ema, runs_root=cfg.paths.runs_root)
    return write_handoff_file(folder / name, handoff)


def stage1_world(
    root: Path, stage1: dict[str, Any] | None = None, *, latents: Literal["random", "from_ids"] = "random"
) -> Gc25dConfig:
    """The SFT world plus a stage-1 section (configs/stage1_tf/tiny.yaml merged with ``stage1``) whose
    init is a random tiny teacher's hand-off."""
    from gc25d_core.config import deep_merge
    from gc25d_core.train.presets import with_stage

    cfg = sft_world(root, latents=latents)
    teacher = random_teacher(cfg, root)
    return with_stage(
        cfg, "stage1_tf", "tiny", deep_merge({"model": {"handoff": str(teacher)}}, stage1 or {})
    )


def stage2_world(
    root: Path, stage2: dict[str, Any] | None = None, *, latents: Literal["random", "from_ids"] = "random"
) -> Gc25dConfig:
    """The SFT world plus a stage-2 section (configs/stage2_cd/tiny.yaml merged with ``stage2``) whose
    init and teacher are a random causal export's final.json."""
    from gc25d_core.config import deep_merge
    from gc25d_core.train.presets import with_stage

    cfg = sft_world(root, latents=latents)
    stage1 = random_teacher(cfg, root, causal=True)
    return with_stage(cfg, "stage2_cd", "tiny", deep_merge({"model": {"handoff": str(stage1)}}, stage2 or {}))


def stage3_world(root: Path, stage3: dict[str, Any] | None = None) -> Gc25dConfig:
    """The SFT world with rollout extensions plus a stage-3 section (configs/stage3_dmd/tiny.yaml
    merged with ``stage3``): the generator a random causal export's EMA (stage 2's final.json), the
    real score and critic a random teacher's teacher.json."""
    from gc25d_core.config import deep_merge
    from gc25d_core.train.presets import with_stage

    cfg = sft_world(root, ext=True)
    generator = random_teacher(cfg, root, seed=1, causal=True, stage="stage2_cd")
    teacher = random_teacher(cfg, root, seed=2)
    base = {"model": {"handoff": str(generator)}, "real": {"handoff": str(teacher)}}
    return with_stage(cfg, "stage3_dmd", "tiny", deep_merge(base, stage3 or {}))
