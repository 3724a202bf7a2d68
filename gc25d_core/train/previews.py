"""What a training run looks like, for the dashboard: validation curves as a PNG, and a validation
sample as a video (ground truth | the model's prediction at t=500 | ids), decoded by the VAE.

``sft_preview(run_dir, cfg)`` reads a finished (or running) SFT folder: ``val.jsonl`` and the export
of the last validation step. The prediction is the validation's own: the same val clip, the same
noise (seeded by clip and t, gc25d_core.train.validation), cond mode; x̂0 = x_t − σ·v̂ on cells 1..,
cell 0 is the clean anchor. One process, CPU by default; tiny VAEs only (see latents_preview).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.hashing import file_identities
from gc25d_core.numerics import numerics_line
from gc25d_core.train.loop import DONE_FILE

GAP_MODES = ("cond", "uncond", "null_text")


def val_records(run_dir: Path) -> list[dict[str, Any]]:
    from gc25d_core.train.sft import iter_val_records

    return list(iter_val_records(run_dir)) if (run_dir / "val.jsonl").is_file() else []


def curves_png(records: list[dict[str, Any]], timesteps: tuple[int, ...] = (200, 500, 800)) -> bytes:
    """One panel per t: validation MSE against step for cond / uncond / null text, the panels
    stacked (gc25d_core.plots; the stage asset's ``curves`` shows the mean over t)."""
    from gc25d_core.plots import line_plot_png, stack_png

    panels = []
    for t in timesteps:
        keys = {mode: f"{mode}_mse_t{t}" for mode in GAP_MODES}
        rows = [r for r in records if keys["cond"] in r]
        series = {mode: [r.get(key) for r in rows] for mode, key in keys.items()}
        steps = [float(r["step"]) for r in rows]
        panels.append(
            line_plot_png(
                series,
                f"val MSE at t={t}: cond / uncond / null text",
                "MSE",
                x={mode: steps for mode in series},
                xlabel="step",
                size=(760, 260),
            )
        )
    return stack_png(panels)


def gap_table(
    records: list[dict[str, Any]], timesteps: tuple[int, ...] = (200, 500, 800)
) -> list[dict[str, Any]]:
    """Per validation: cond / uncond / null text MSE per t and uncond's excess over cond (relative)."""
    rows = []
    for r in records:
        row: dict[str, Any] = {"step": r["step"]}
        for t in timesteps:
            c, u, n = (r.get(f"{mode}_mse_t{t}") for mode in ("cond", "uncond", "null_text"))
            if c is None or u is None:
                continue
            row[f"t{t}"] = {"cond": c, "uncond": u, "null_text": n, "cond_below_uncond": (u - c) / u}
        rows.append(row)
    return rows


# what a teacher on the code world must show (issue 16): cond below uncond by these fractions
GAP_TARGETS = {500: 0.10, 800: 0.20}


def run_numerics(run_dir: Path) -> dict[str, Any] | None:
    """The numerics record of a finished run's done.json; None before it finished (or from a
    done.json written before runs kept one)."""
    try:
        done = json.loads((run_dir / DONE_FILE).read_text())
    except (OSError, ValueError):
        return None
    numerics = done.get("numerics") if isinstance(done, dict) else None
    return numerics if isinstance(numerics, dict) else None


def learning_signal_report(run_dir: Path, targets: dict[int, float] | None = None) -> str | None:
    """The run's validations as a table (step × t × cond / uncond / null text, gap = (uncond −
    cond) / uncond) and whether the last one meets ``targets``; None before the first validation."""
    targets = GAP_TARGETS if targets is None else targets
    rows = gap_table(val_records(run_dir))
    if not rows:
        return None
    lines = [f"SFT validation, {run_dir} (mean MSE over the val clips; gap = (uncond - cond) / uncond)"]
    if (numerics := run_numerics(run_dir)) is not None:
        lines.append(numerics_line(numerics))
    lines.append(f"{'step':>6} {'t':>4} {'cond':>8} {'uncond':>8} {'null txt':>8} {'gap':>7}")
    for row in rows:
        for t in (200, 500, 800):
            if (g := row.get(f"t{t}")) is not None:
                lines.append(
                    f"{row['step']:>6} {t:>4} {g['cond']:>8.4f} {g['uncond']:>8.4f} "
                    f"{g['null_text']:>8.4f} {100 * g['cond_below_uncond']:>6.1f}%"
                )
    last, verdicts = rows[-1], []
    for t, want in targets.items():
        if (g := last.get(f"t{t}")) is not None:
            ok = g["cond_below_uncond"] >= want
            verdicts.append(
                f"t={t}: cond {100 * g['cond_below_uncond']:.1f}% below uncond "
                f"(target {100 * want:.0f}%: {'met' if ok else 'NOT met'})"
            )
    lines.append(f"last validation (step {last['step']}): " + "; ".join(verdicts))
    return "\n".join(lines)


def _export_for(run_dir: Path, step: int) -> tuple[Path, int] | None:
    """The export of ``step``, or the newest one before it."""
    from gc25d_core.checkpoint import step_name

    exact = run_dir / "exports" / f"{step_name(step)}.safetensors"
    if exact.is_file():
        return exact, step
    older = sorted(
        (int(p.stem.split("-")[1]), p)
        for p in (run_dir / "exports").glob("step-*.safetensors")
        if p.stem.split("-")[1].isdigit() and int(p.stem.split("-")[1]) <= step
    )
    return (older[-1][1], older[-1][0]) if older else None


@torch.no_grad()
def predict_x0(run_dir: Path, cfg: Gc25dConfig, step: int, t_req: float = 500.0) -> dict[str, Any] | None:
    """The first val clip at ``t_req`` through the export at ``step`` (cond mode, the validation's
    noise): ``{"clip", "x0", "x0_hat", "step", "mse"}`` (latents float32 [48, 21, h, w])."""
    from gc25d_core.cache.stores import open_store
    from gc25d_core.flow import WAN_SCHEDULE as schedule
    from gc25d_core.models.loading import load_gc_weights
    from gc25d_core.text import TextBank, load_text_table, prompt_keys
    from gc25d_core.train.data import generator
    from gc25d_core.train.inputs import cell_mse, model_kwargs, ti2v_inputs
    from gc25d_core.train.sft import sft_config
    from gc25d_core.train.validation import load_val_clips

    sft = sft_config(cfg)
    found = _export_for(run_dir, step)
    if found is None:
        return None
    export, step = found
    # the run's resolved config pins its snapshot (the sft asset sets data.manifest_version)
    clips = load_val_clips(
        open_store(cfg.cache.store),
        sft.data.manifest_version,
        sft.val.model_copy(update={"num_clips": 1}),
        prompt_keys(cfg),
        cfg.vocab,
    )
    if not clips:
        return None
    clip, device = clips[0], torch.device("cpu")
    model, _ = load_gc_weights(export, device=device, dtype=torch.float32)
    model.eval()
    text = TextBank(load_text_table(cfg, sft.data.text_table), device)
    t = float(schedule.timestep_at(schedule.index_of(t_req)))
    gen = generator(sft.val.seed, "val", clip.sample_id, t_req)
    x0, x_t, target = ti2v_inputs(schedule, clip.latent[None], t, gen, device)
    v = model(**model_kwargs(text, x_t, t, [clip.keys], clip.ids[None], dtype=torch.float32, device=device))
    x0_hat = schedule.x0_from_velocity(x_t, v.float(), t)
    x0_hat[:, :, 0] = x0[:, :, 0]  # the clean anchor the model was given
    return {
        "clip": clip,
        "x0": x0[0],
        "x0_hat": x0_hat[0],
        "step": step,
        "export": export,
        "mse": float(cell_mse(v, target)),
    }


def sft_preview(run_dir: Path | str, cfg: Gc25dConfig, t_req: float = 500.0) -> dict[str, Any]:
    """What the ``sft`` asset shows. Keys (each present when it could be made):
    ``curves_png`` (bytes), ``gaps`` (gap_table rows), ``sample_video`` (Path, an MP4 in
    ``run_dir/previews/``), ``sample_png`` (bytes, 5 frames of it), ``sample_step``, ``sample_clip``,
    ``sample_mse`` (that clip's velocity MSE at t)."""
    from gc25d_core.models.vae import build_vae_for, decode_video, video_to_frames
    from gc25d_core.preview import colorize_ids, png_bytes, side_by_side, strip_of, write_video

    run_dir = Path(run_dir)
    out: dict[str, Any] = {}
    records = val_records(run_dir)
    if not records:
        return out
    out["curves_png"] = curves_png(records)
    out["gaps"] = gap_table(records)
    if not cfg.vae.tiny:
        return out
    step = int(records[-1]["step"])
    found = _export_for(run_dir, step)
    if found is None:
        return out
    # the sample is kept beside its video, by the export it came from: a rerun of the asset on a
    # finished run shows it again without building the model and the VAE
    record = run_dir / "previews" / f"val_sample_step{found[1]:06d}_t{int(t_req)}.json"
    made = kept_sample(record, found[0])
    if made is None:
        pred = predict_x0(run_dir, cfg, step, t_req)
        if pred is None:
            return out
        vae = build_vae_for(cfg, torch.device("cpu"))
        # the two as one batch: one pass through the decoder's layers instead of two
        truth, guess = (
            video_to_frames(v) for v in decode_video(vae, torch.stack([pred["x0"], pred["x0_hat"]]))
        )
        ids = colorize_ids(pred["clip"].ids.numpy())
        panels = side_by_side([truth, guess, ids], ["ground truth", f"pred t={int(t_req)}", "ids"])
        video = write_video(run_dir / "previews" / f"val_sample_step{pred['step']:06d}.mp4", panels)
        made = {
            "sample_video": video,
            "sample_png": png_bytes(strip_of(panels)),
            "sample_step": pred["step"],
            "sample_clip": pred["clip"].sample_id,
            "sample_mse": pred["mse"],
        }
        keep_sample(record, found[0], made)
    out.update(made)
    return out


def keep_sample(record: Path, export: Path, made: dict[str, Any]) -> None:
    """The sample's strip beside ``record`` (.png) and its fields in ``record`` (JSON), with the
    identity of the export it came from."""
    from gc25d_core.atomic import atomic_write_bytes, atomic_write_text

    atomic_write_bytes(record.with_suffix(".png"), made["sample_png"])
    doc = {k: v for k, v in made.items() if k != "sample_png"}
    doc["sample_video"] = Path(made["sample_video"]).name
    doc["export"] = file_identities([export])
    atomic_write_text(record, json.dumps(doc, sort_keys=True))


def kept_sample(record: Path, export: Path) -> dict[str, Any] | None:
    """What ``keep_sample`` kept, if it came from this very export file and its files are there."""
    try:
        doc = json.loads(record.read_text())
        png = record.with_suffix(".png").read_bytes()
    except (OSError, ValueError):
        return None
    video = record.parent / str(doc.get("sample_video", ""))
    if doc.get("export") != file_identities([export]) or not video.is_file():
        return None
    return {
        "sample_video": video,
        "sample_png": png,
        "sample_step": doc["sample_step"],
        "sample_clip": doc["sample_clip"],
        "sample_mse": doc["sample_mse"],
    }
