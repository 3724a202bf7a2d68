"""The `small` preset end to end on one GPU, without Dagster: does a GcDiT of a few hundred million
parameters learn to follow the ids within minutes? (issue 16)

Runs the graph's core steps in the graph's order, each through the same core function or torchrun
entry point its asset calls: code world (`small`: 48 clips at 256×128) → index → text table → cond /
clip_meta / cond_ext (CPU ranks) → tiny VAE fitted to the train frames (GPU) → latents (GPU) →
ext_canvas → cache snapshot → SFT (configs/sft/small.yaml, 1 GPU) → the cond / uncond table.
Prints one JSON line per phase (seconds) and the learning-signal table at the end; rerun skips the
finished phases as the assets do.

Usage (GPU machine): python -m bench.quality.small_preset --root /tmp/small [--sft-steps 1500] [--cpu-ranks 8]
Smoke (here, CPU, minutes): python -m bench.quality.small_preset --root /tmp/small --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import bench_env, start_torchrun


def phase(name: str, t0: float, **extra: Any) -> None:
    print(json.dumps({"phase": name, "s": round(time.perf_counter() - t0, 1), **extra}), flush=True)


def launch(module: str, cfg: Any, run_dir: Path, nproc: int, extra: list[str] | None = None) -> None:
    rc = start_launch(module, cfg, run_dir, nproc, extra).wait()
    if rc != 0:
        log = run_dir / "torchrun.log"
        print(log.read_text()[-6000:], file=sys.stderr)
        raise SystemExit(f"{module} failed (rc {rc}); log {log}")


def start_launch(
    module: str, cfg: Any, run_dir: Path, nproc: int, extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """``launch`` without the wait (its log ``<run_dir>/torchrun.log``): a job beside the next one."""
    from gc25d_core.config import write_resolved

    config = write_resolved(cfg, run_dir, "config.yaml")
    argv = ["-m", module, "--config", str(config), "--run-dir", str(run_dir), *(extra or [])]
    return start_torchrun(nproc, argv, run_dir / "torchrun.log", bench_env())


GIVEN_VAE = "given_tiny_vae.safetensors"  # under <data_root>/models: --vae's copy


def small_config(
    root: Path,
    smoke: bool = False,
    sft_steps: int | None = None,
    vae_sha256: str | None = None,
    vae_width: tuple[int, int] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The `small` preset's run config with its data and runs under ``root``, and the SFT section's
    overrides (``smoke``: the tiny world and a 2-layer model on CPU, for the plumbing;
    ``vae_sha256``: the tiny VAE is ``--vae``'s copy under the data root, checked against it;
    ``vae_width``: the fitted tiny VAE's encoder / decoder widths)."""
    from gc25d_core.config import load_config

    root = root.resolve()
    over: dict[str, Any] = {
        "paths": {"data_root": str(root / "gc25d"), "runs_root": str(root / "runs")},
        "raw": {"root": str(root / "raw")},
        "cache": {"store": str(root / "cache")},
    }
    if vae_sha256 is not None:
        over["vae"] = {"path": str(root / "gc25d" / "models" / GIVEN_VAE), "sha256": vae_sha256}
    if vae_width is not None:
        over.setdefault("vae", {})["fit"] = {"dim": vae_width[0], "dec_dim": vae_width[1]}
    sft: dict[str, Any] = {}
    if smoke:
        over |= {"device": "cpu", "distributed": {"nproc_per_node": 1, "backend": "gloo"}}
        # the tiny world (6 runs at 128×64): the plumbing, not the small world's minutes of rendering
        over["raw"] |= {"codeworld_preset": "tiny"}
        over["geometry"] = {"src_width": 200, "src_height": 96, "crop_x0": 6, "crop_x1": 194}
        over["geometry"] |= {"dst_width": 128, "dst_height": 64}
        vae = over.get("vae", {})
        fit = {"device": "cpu", "steps": 2, "batch": 1, "crop": 64, "frames": 5}
        fit["then"] = {"steps": 1, "batch": 1, "frames": 9, "warm": 1, "lr": 3e-4}  # both phases run
        over["vae"] = {**vae, "fit": {**vae.get("fit", {}), **fit}, "num_workers": 0}
        sft = {
            "precision": "fp32",
            "micro_batch": 1,
            "max_steps": 4,
            "val": {"every": 2, "num_clips": 2},
            "data": {"num_workers": 0},
            "model": {"overrides": {"dim": 64, "ffn_dim": 128, "num_heads": 2, "num_layers": 2}},
        }
    if sft_steps is not None:
        sft["max_steps"] = sft_steps
    return load_config("small", over), sft


def add_vae_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--vae",
        type=Path,
        default=None,
        help="a tiny VAE fitted to this preset's frames before (e.g. one an earlier chain brought back) "
        "in place of the fit: saves its minutes on the GPU",
    )
    ap.add_argument("--vae-sha256", default=None, help="with --vae: its SHA256 (checked before use)")
    ap.add_argument(
        "--vae-width",
        default=None,
        metavar="DIM[/DEC_DIM]",
        help="the fitted tiny VAE's encoder / decoder widths (default the preset's 16 / 16; "
        "docs/picture_study.md: the decoder's width is what the picture's detail costs)",
    )


def split_widths(text: str) -> tuple[int, int]:
    """``DIM`` or ``DIM/DEC_DIM`` -> (dim, dec_dim); a ValueError for anything else (the tiny VAE's
    widths as ``--vae-width`` and picture_study's ``--fits`` write them)."""
    dim, _, dec = text.partition("/")
    if not dim.isdigit() or not (dec or dim).isdigit():
        raise ValueError(text)
    return int(dim), int(dec or dim)


def parse_width(text: str | None) -> tuple[int, int] | None:
    """``--vae-width``'s ``DIM`` or ``DIM/DEC_DIM``."""
    if text is None:
        return None
    try:
        return split_widths(text)
    except ValueError:
        raise SystemExit(f"--vae-width {text!r}: DIM or DIM/DEC_DIM, whole numbers") from None


def place_given_vae(src: Path, sha256: str, dst: Path) -> None:
    """``--vae``'s file copied to ``dst`` (atomically, readable by the group) once its SHA256 is
    ``sha256``; a copy already there with that digest stays."""
    from gc25d_core.atomic import atomic_write_bytes
    from gc25d_core.hashing import sha256_file
    from gc25d_core.models.loading import WeightsError
    from gc25d_core.models.vae import check_vae_sha256

    if dst.is_file() and sha256_file(dst) == sha256:
        return
    try:
        check_vae_sha256(src, sha256, "--vae-sha256")
    except WeightsError as e:
        raise SystemExit(f"--vae: {e}") from None
    atomic_write_bytes(dst, src.read_bytes())


# the cache's latents' RMS a given VAE may give: its normalisation (norm.mean / norm.std) is
# measured on whole train clips by the tiny_vae job's rule, so about 1; one measured on each clip's
# first frames gave 1.99 (picture_study's fits until 2026-12-05, whose later latent frames grow)
GIVEN_VAE_RMS = (0.67, 1.5)


def latents_rms(cfg: Any) -> float:
    """RMS of every clip's latents in the data root (the DiT's data: unit scale expected)."""
    import torch

    from gc25d_core.index import read_index
    from gc25d_core.layout import Layout, Shapes, read_latents

    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    sq, n = 0.0, 0
    for row in read_index(layout):
        z = read_latents(layout.latents(row.clip_id), shapes)["latent"].float()
        sq, n = sq + float(torch.sum(z * z)), n + z.numel()
    return (sq / max(n, 1)) ** 0.5


def check_given_vae_scale(vae: Path, rms: float) -> None:
    """A given VAE whose latents on this code world are far from unit scale stops the chain, naming
    the file, its fields and the way out (bench.quality.vae_renorm)."""
    lo, hi = GIVEN_VAE_RMS
    if not lo <= rms <= hi:
        raise SystemExit(
            f"--vae {vae}: its latents on this code world have RMS {rms:.3f}, outside [{lo}, {hi}]: its "
            "normalisation (norm.mean / norm.std) was not measured on whole clips of this world. "
            "Measure it again: python -m bench.quality.vae_renorm --preset small --raw <raw> --vae "
            f"{vae} --sha256 <its SHA256> --out <new file>"
        )


def main(argv: list[str] | None = None) -> tuple[Any, Path, int]:
    """Data + SFT; returns the run config, the SFT run folder and the snapshot version it trained on."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="data and runs go under it")
    ap.add_argument("--sft-steps", type=int, default=None, help="default: configs/sft/small.yaml")
    ap.add_argument("--cpu-ranks", type=int, default=8, help="ranks of the CPU jobs (cond, meta, ...)")
    add_vae_options(ap)
    ap.add_argument("--smoke", action="store_true", help="CPU, a 2-layer model, a few steps: the plumbing")
    args = ap.parse_args(argv)
    if (args.vae is None) != (args.vae_sha256 is None):
        ap.error("--vae and --vae-sha256 go together (the weights are checked before they are used)")
    if args.vae is not None and args.vae_width is not None:
        ap.error("--vae-width is the fit's: a given --vae keeps the widths it was fitted with")

    from gc25d_core import index as clip_index
    from gc25d_core import raw_prepare
    from gc25d_core.cache.from_layout import pack_and_publish
    from gc25d_core.text import materialize_table
    from gc25d_core.train.previews import learning_signal_report
    from gc25d_core.train.sft import with_sft

    cfg, sft = small_config(
        args.root, args.smoke, args.sft_steps, args.vae_sha256, parse_width(args.vae_width)
    )
    root = args.root.resolve()
    cfg = with_sft(cfg, "small", sft)
    cpu_cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"backend": "gloo"})})
    runs = root / "runs"
    t_all = time.perf_counter()

    t0 = time.perf_counter()
    # the code world's runs on as many processes as the CPU jobs (its own default is 2 at most)
    raw_prepare.prepare_raw(cfg, log=lambda m: None, workers=min(args.cpu_ranks, os.cpu_count() or 1))
    phase("raw_source", t0)
    t0 = time.perf_counter()
    phase("clips_index", t0, **clip_index.build_and_write(Path(cfg.raw.root), cfg))
    t0 = time.perf_counter()
    materialize_table(cfg)
    phase("text_table", t0)
    for module in ("cond", "meta", "cond_ext"):
        t0 = time.perf_counter()
        launch(f"gc25d_core.jobs.{module}", cpu_cfg, runs / module, args.cpu_ranks)
        phase(module, t0)
    t0 = time.perf_counter()
    if args.vae is not None:
        place_given_vae(args.vae, args.vae_sha256, Path(cfg.vae.path))
        phase("tiny_vae", t0, given=str(args.vae), sha256=args.vae_sha256)
    else:
        launch("gc25d_core.jobs.tiny_vae", cfg, runs / "tiny_vae", 1)
        rec = json.loads((Path(cfg.paths.data_root) / "models" / "tiny_vae.json").read_text())
        phase(
            "tiny_vae", t0, recon_mse_heldout=rec.get("recon_mse_heldout"), psnr_db=rec.get("psnr_heldout_db")
        )
    t0 = time.perf_counter()
    launch("gc25d_core.jobs.latents", cfg, runs / "latents", 1)
    rms = latents_rms(cfg)
    phase("latents", t0, rms=round(rms, 4))
    if args.vae is not None:
        check_given_vae_scale(args.vae, rms)
    t0 = time.perf_counter()
    launch("gc25d_core.jobs.ext_canvas", cpu_cfg, runs / "ext_canvas", args.cpu_ranks)
    phase("ext_canvas", t0)
    t0 = time.perf_counter()
    summary = pack_and_publish(cfg)
    snapshot = summary.get("snapshot") or summary.get("head")
    phase("training_cache", t0, snapshot=snapshot)
    phase("data_total", t_all)

    from gc25d_core.cache.manifest import snapshot_id
    from gc25d_core.cache.snapshots import list_versions
    from gc25d_core.cache.stores import open_cache_store

    version = list_versions(open_cache_store(cfg))[-1]
    sft_cfg = with_sft(cfg, "small", {**sft, "data": {**sft.get("data", {}), "manifest_version": version}})
    run_dir = runs / "sft" / snapshot_id(version)
    t0 = time.perf_counter()
    launch("gc25d_core.jobs.sft", sft_cfg, run_dir, cfg.distributed.nproc_per_node)
    phase("sft", t0, run_dir=str(run_dir))
    print(learning_signal_report(run_dir) or f"{run_dir}: no validation records")
    return sft_cfg, run_dir, version


if __name__ == "__main__":
    main()
