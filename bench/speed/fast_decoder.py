"""The fast decoder's speed per cell (gc25d_core.models.fast_decoder): one steady-state latent cell to
its 4 frames on the device, synchronised, beside the VAE's streaming decode of the same cell.
Random weights (speed does not depend on them). Prints one JSON object.

    python -m bench.speed.fast_decoder --device cuda --dims full      # 832x480, latent 30x52 (target <= 15 ms)
    python -m bench.speed.fast_decoder --device cpu --dims tiny
    python -m bench.speed.fast_decoder --device cpu --dims tiny --widths '' --vae-layouts --threads 1
        # the VAE's fp32 decode, one row and two (eval's live decode): the lean ops alone, the decoder's
        # weights channels-last, and the default (models.vae.speed_up_vae; on a CPU the decoder's alone)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch


def vae_cell_seconds(vae: Any, hw: tuple[int, int], dtype: torch.dtype, fast: bool, cells: int) -> float:
    from gc25d_core.models.fast_decoder import time_cells
    from gc25d_core.models.vae import StreamingDecoder, decode_copy

    dev = next(vae.parameters()).device
    dec = StreamingDecoder(decode_copy(vae, dtype, fast=fast), dtype=dtype)
    z = torch.randn(1, vae.z_dim, 1, *hw, generator=torch.Generator().manual_seed(0)).to(dev)
    return time_cells(lambda: dec.push(z), dev, cells, warmup=3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dims", choices=("full", "tiny"), default="full")
    p.add_argument("--widths", default="32,64", help="fast decoder widths to time")
    p.add_argument("--cells", type=int, default=30)
    p.add_argument("--vae", action="store_true", help="also time the VAE's streaming decode (bf16 lean)")
    p.add_argument(
        "--vae-layouts",
        action="store_true",
        help="time the VAE's fp32 streaming decode: the lean ops alone, the decoder channels-last, the default",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from gc25d_core.compat import import_diffsynth
    from gc25d_core.models.fast_decoder import FastDecoder, cell_seconds

    import_diffsynth()
    dev = torch.device(args.device)
    hw = (30, 52) if args.dims == "full" else (4, 8)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    out: dict[str, Any] = {
        "bench": "fast_decoder",
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "latent_hw": list(hw),
        "frames_hw": [16 * hw[0], 16 * hw[1]],
        "dtype": str(dtype),
        "fast_decoder_ms_per_cell": {},
    }
    for w in (int(x) for x in args.widths.split(",") if x):
        torch.manual_seed(0)
        dec = FastDecoder(width=w)
        params = sum(t.numel() for t in dec.parameters())
        ms = 1e3 * cell_seconds(dec, hw, device=dev, dtype=dtype, cells=args.cells)
        out["fast_decoder_ms_per_cell"][str(w)] = {"ms": ms, "params": params}
        print(
            f"[fast_decoder] width {w}: {ms:.2f} ms per cell ({params} params)", file=sys.stderr, flush=True
        )
    if args.vae:
        from gc25d_core.models.vae import build_vae

        vae = build_vae(tiny=args.dims == "tiny", device="cpu").to(dev).requires_grad_(False)
        out["vae_ms_per_cell"] = 1e3 * vae_cell_seconds(
            vae, hw, dtype, dev.type == "cuda", min(args.cells, 10)
        )
    if args.vae_layouts:
        out["vae_layouts"] = vae_layouts(dev, hw, args.cells)
    print(json.dumps(out), flush=True)
    return out


@torch.no_grad()
def vae_layouts(dev: torch.device, hw: tuple[int, int], cells: int) -> dict[str, Any]:
    """ms per cell of the VAE's fp32 streaming decode (tiny random weights: speed does not depend on
    them), 1 and 2 rows: ``lean`` (the lean ops alone), ``lean_cl`` (the decoder's weights
    channels-last), ``default`` (``speed_up_vae`` as the config has it: on a CPU also the decoder's
    convolutions on oneDNN for a single clip). Timed in turn, twice, the lower median kept; each
    variant's frames against ``lean``'s over 4 cells (max abs difference)."""
    import copy

    from gc25d_core.config import load_config
    from gc25d_core.models.fast_decoder import time_cells
    from gc25d_core.models.vae import (
        StreamingDecoder,
        build_vae,
        decoder_parts,
        lean_vae_ops,
        speed_up_vae,
        to_channels_last_3d,
    )

    cfg = load_config("tiny")
    torch.manual_seed(0)
    base = build_vae(tiny=True, device="cpu").to(dev)
    lean = lean_vae_ops(copy.deepcopy(base))
    lean_cl = copy.deepcopy(lean)
    for part in decoder_parts(lean_cl):
        to_channels_last_3d(part)
    vaes = {"lean": lean, "lean_cl": lean_cl, "default": speed_up_vae(copy.deepcopy(base), cfg, dev)}
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    for rows in (1, 2):
        z = torch.randn(rows, base.z_dim, 1, *hw, generator=torch.Generator().manual_seed(rows)).to(dev)
        times: dict[str, list[float]] = {name: [] for name in vaes}
        for _ in range(2):
            for name, vae in vaes.items():
                dec = StreamingDecoder(vae)
                times[name].append(1e3 * time_cells(lambda d=dec, x=z: d.push(x), dev, cells, warmup=3))
        frames = {
            name: torch.cat([d.push(z) for _ in range(4)], dim=2)
            for name, d in ((n, StreamingDecoder(v)) for n, v in vaes.items())
        }
        out[f"rows_{rows}"] = {
            name: {
                "ms_per_cell": min(times[name]),
                "max_abs_diff": float((frames[name] - frames["lean"]).abs().max()),
            }
            for name in vaes
        }
        print(f"[vae_layouts] {rows} row(s): {out[f'rows_{rows}']}", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    main()
