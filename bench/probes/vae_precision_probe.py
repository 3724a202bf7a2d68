"""Probe: VAE38 encode speed and error for precision / memory-format options (one clip, random weights).

Errors are relative to an fp32 encode with TF32 off. Prints JSON lines. GPU only.
    python -m bench.probes.vae_precision_probe            # every variant
    python -m bench.probes.vae_precision_probe --lean     # the lean-ops variants + a kernel profile of each
"""

import argparse
import json
import sys
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--lean", action="store_true", help="the lean-ops variants + a kernel profile of each")
args = ap.parse_args()
if not torch.cuda.is_available():
    sys.exit("vae_precision_probe.py measures CUDA kernels: it needs a GPU")

from gc25d_core.compat import import_diffsynth  # noqa: E402

import_diffsynth()
from diffsynth.models.wan_video_vae import WanVideoVAE38  # noqa: E402

from gc25d_core.models.vae import to_channels_last_3d  # noqa: E402

dev = torch.device("cuda")
torch.manual_seed(0)
with torch.device(dev):
    vae = WanVideoVAE38().eval()
vid = torch.rand(1, 3, 81, 480, 832, device=dev) * 2 - 1


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        z = fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2], z


def enc(v, dtype=None):
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
        return vae.encode(v, device=dev, tiled=False).float()


torch.backends.cudnn.allow_tf32 = False
ref = enc(vid)
torch.backends.cudnn.allow_tf32 = True


def rel(z):
    return float((z[:1] - ref).norm() / ref.norm())


def report(probe, fn, clips=1):
    t, z = timed(fn)
    print(
        json.dumps(
            {
                "probe": probe,
                "s_per_clip": t / clips,
                "rel_err": rel(z),
                "rel_err_bf16_stored": rel(z.bfloat16().float()),
            }
        ),
        flush=True,
    )


def profile(probe, fn, top=12):
    """The CUDA kernels that take the most time in one encode."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    rows = sorted(p.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in p.key_averages())
    print(
        json.dumps(
            {
                "probe": f"profile_{probe}",
                "cuda_total_s": total / 1e6,
                "top": [[e.key[:60], round(e.self_device_time_total / 1e6, 4), e.count] for e in rows[:top]],
            }
        ),
        flush=True,
    )


if args.lean:
    from gc25d_core.models.vae import lean_vae_ops

    torch.backends.cudnn.benchmark = True
    to_channels_last_3d(vae)
    vid_cl = vid.contiguous(memory_format=torch.channels_last_3d)
    report("fp32_channels_last_3d", lambda: enc(vid_cl))
    profile("fp32_channels_last_3d", lambda: enc(vid_cl))
    lean_vae_ops(vae)
    report("fp32_channels_last_3d_lean", lambda: enc(vid_cl))
    profile("fp32_channels_last_3d_lean", lambda: enc(vid_cl))
    vid2 = vid.repeat(2, 1, 1, 1, 1).contiguous(memory_format=torch.channels_last_3d)
    report("fp32_channels_last_3d_lean_batch2", lambda: enc(vid2), clips=2)
    report("fp16_channels_last_3d_lean", lambda: enc(vid_cl, torch.float16))
    from gc25d_core.models.vae import encode_on_device

    def enc_dev(v, dtype=None):
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            return encode_on_device(vae, v, dev).float()

    report("fp32_channels_last_3d_lean_on_device", lambda: enc_dev(vid_cl))
    profile("fp32_channels_last_3d_lean_on_device", lambda: enc_dev(vid_cl))
    report("fp32_channels_last_3d_lean_on_device_batch2", lambda: enc_dev(vid2), clips=2)
    report("fp16_channels_last_3d_lean_on_device", lambda: enc_dev(vid_cl, torch.float16))
    sys.exit(0)

report("fp32_tf32conv", lambda: enc(vid))
torch.backends.cudnn.benchmark = True
report("fp32_tf32conv_cudnn_benchmark", lambda: enc(vid))
report("autocast_fp16", lambda: enc(vid, torch.float16))
report("autocast_bf16", lambda: enc(vid, torch.bfloat16))
to_channels_last_3d(vae)
vid_cl = vid.contiguous(memory_format=torch.channels_last_3d)
report("fp32_channels_last_3d", lambda: enc(vid_cl))
report("fp16_channels_last_3d", lambda: enc(vid_cl, torch.float16))
vid2 = vid.repeat(2, 1, 1, 1, 1).contiguous(memory_format=torch.channels_last_3d)
report("fp16_channels_last_3d_batch2", lambda: enc(vid2, torch.float16), clips=2)
