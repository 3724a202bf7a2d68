"""Latents job vs plain DiffSynth VAE encode, side by side in one run (issue 4 GPU acceptance).

Prints JSON lines:
  plain_encode        vae.encode of one preloaded clip [1,3,81,H,W] fp32 (the plain-stack probe)
  plain_end_to_end    per clip: read PNGs + resample_rgb + encode + torch.save, sequentially
  ours                gc25d_core.preprocess.latents.run_latents (DataLoader workers decode/resample while
                      the GPU encodes; clips_per_batch clips per encode), per clips_per_batch setting
  rel_err             stored bf16 latents vs an fp32 reference with TF32 off, and the TF32 reference itself
  gpu_util            mean GPU utilisation sampled during each timed section

Usage (GPU):  python -m bench.speed.latents --raw /tmp/full            (full-size code world)
CPU smoke:    python -m bench.speed.latents --tiny --device cpu --raw data/tiny/raw
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.config import load_config  # noqa: E402
from gc25d_core.index import build_and_write, read_index  # noqa: E402
from gc25d_core.layout import Layout, Shapes, read_latents  # noqa: E402
from gc25d_core.models.vae import build_vae, speed_up_vae  # noqa: E402
from gc25d_core.preprocess import latents as L  # noqa: E402
from gc25d_core.preprocess.tasks import RunCache  # noqa: E402


def out(**kw):
    print(json.dumps(kw), flush=True)


class GpuUtil:
    """Samples GPU utilisation (NVML) in a thread while a section runs."""

    def __init__(self, device: torch.device):
        self.samples: list[int] = []
        self.handle = None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
                self.nvml = pynvml
            except Exception:
                self.handle = None

    def __enter__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self):
        while not self.stop.is_set():
            if self.handle is not None:
                self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", type=Path, required=True, help="raw code-world root (full preset on GPU)")
    ap.add_argument("--tiny", action="store_true", help="tiny VAE and the tiny preset (CPU smoke)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=3, help="each clip is encoded this many times per setting")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--plain-clips", type=int, default=6, help="clips for the sequential plain path")
    ap.add_argument("--lean-ops", type=int, default=1, help="vae.lean_ops for our path (0/1)")
    ap.add_argument(
        "--warmup", type=int, default=1, help="1: one untimed batch before each timed setting (steady state)"
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="bench_latents_"))
    preset = "tiny" if args.tiny else "v10"
    cfg = load_config(
        preset,
        {
            "device": device.type,
            "paths": {"data_root": str(tmp / "data"), "runs_root": str(tmp / "runs")},
            "raw": {"root": str(args.raw), "kind": "codeworld"},
            "index": {"allow_missing_val_runs": True, "drop_lists": []},
            "vae": {
                "tiny": args.tiny,
                "path": None,
                "num_workers": args.workers,
                "lean_ops": bool(args.lean_ops),
            },
        },
    )
    build_and_write(args.raw, cfg)
    rows = sorted(read_index(Layout(cfg.paths.data_root)), key=lambda r: r.clip_id)
    runs = RunCache(Path(cfg.raw.root))
    out(
        torch=torch.__version__,
        device=str(device),
        name=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        clips=len(rows),
        frames_hw=[cfg.geometry.dst_height, cfg.geometry.dst_width],
        repeat=args.repeat,
    )

    torch.manual_seed(0)
    with torch.device(device):
        vae = build_vae(tiny=args.tiny, device=device).eval()

    # plain: encode one preloaded clip (what the plain-stack probe measures)
    frames0 = L.load_clip_frames(runs(rows[0]), rows[0].start, cfg)
    video0 = torch.from_numpy(frames0).permute(3, 0, 1, 2).float().div(127.5).sub(1).unsqueeze(0).to(device)
    with torch.no_grad():
        vae.encode(video0, device=device, tiled=False)  # warm-up
    sync(device)
    times = []
    with GpuUtil(device) as util:
        for _ in range(3):
            t0 = time.perf_counter()
            with torch.no_grad():
                z_tf32 = vae.encode(video0, device=device, tiled=False).float()
            sync(device)
            times.append(time.perf_counter() - t0)
    out(probe="plain_encode", s_per_clip=sorted(times)[1], gpu_util=util.mean)

    # fp32 reference with TF32 off, and the error of TF32 itself
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        with torch.no_grad():
            z_ref = vae.encode(video0, device=device, tiled=False).float()
        torch.backends.cudnn.allow_tf32 = True
    else:
        z_ref = z_tf32
    rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    out(probe="rel_err_tf32_vs_fp32", rel_err=rel(z_tf32, z_ref))

    # plain end to end: sequential read + resample + encode + save
    work = (rows * args.repeat)[: max(len(rows) * args.repeat, 4)]
    plain_work = work[: args.plain_clips]
    t0 = time.perf_counter()
    with GpuUtil(device) as util:
        for row in plain_work:
            fr = L.load_clip_frames(runs(row), row.start, cfg)
            v = torch.from_numpy(fr).permute(3, 0, 1, 2).float().div(127.5).sub(1).unsqueeze(0).to(device)
            with torch.no_grad():
                z = vae.encode(v, device=device, tiled=False)
            torch.save({"latent": z[0].to(torch.bfloat16).cpu()}, tmp / "plain.pt")
        sync(device)
    plain_e2e = (time.perf_counter() - t0) / len(plain_work)
    out(probe="plain_end_to_end", s_per_clip=plain_e2e, clips=len(plain_work), gpu_util=util.mean)

    speed_up_vae(vae, cfg, device)  # what build_vae_for does (channels-last-3d on GPU, lean ops)
    L.build_vae_for = lambda _cfg, _device: vae  # same random weights as the plain path
    for b in [int(x) for x in args.batches.split(",")]:
        c = cfg.model_copy(update={"vae": cfg.vae.model_copy(update={"clips_per_batch": b})})
        if args.warmup:  # cuDNN autotuning of every chunk shape and lazy CUDA init, left out of the timing
            L.run_latents(c, work[:b], device, lambda r, n: None, lambda r, e: None)
            sync(device)
        done: list[int] = []
        errors: list[str] = []
        t0 = time.perf_counter()
        with GpuUtil(device) as util:
            extra = L.run_latents(
                c, work, device, lambda r, n, d=done: d.append(n), lambda r, e, errs=errors: errs.append(e)
            )
            sync(device)
        s = (time.perf_counter() - t0) / len(work)
        out(
            probe="ours",
            clips_per_batch=b,
            s_per_clip=s,
            # after the first frames arrived (the pipeline's fill left out): what a long job sustains
            s_per_clip_after_fill=s - extra["first_batch_seconds"] / len(work),
            fill_s=extra["first_batch_seconds"],
            encode_s_per_clip=extra["encode_seconds"] / len(work),
            speedup_vs_plain_e2e=plain_e2e / s,
            clips=len(done),
            errors=errors[:3],
            gpu_util=util.mean,
            peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        )

    stored = read_latents(Layout(cfg.paths.data_root).latents(rows[0].clip_id), Shapes.of(cfg))["latent"]
    out(
        probe="rel_err_stored_bf16",
        vs_fp32_no_tf32=rel(stored.to(device), z_ref[0]),
        vs_tf32=rel(stored.to(device), z_tf32[0]),
        target=3e-3,
    )


if __name__ == "__main__":
    main()
