"""NCCL collective bandwidth between the GPUs of one host (issue 7: what the ZeRO-2 gradient
reduction can cost). One JSON line per (collective, size): median time and bus bandwidth
(nccl-tests' convention: all_reduce moves 2(n-1)/n of the buffer per rank, reduce / reduce_scatter /
all_gather (n-1)/n).

    torchrun --nproc_per_node=2 -m bench.probes.nccl_probe [--sizes-mb 64,1024] [--iters 5]

Run it again with NCCL_PROTO=Simple (or other NCCL_* settings) in the environment to compare; the
settings in effect are printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

FACTORS = {"all_reduce": 2.0, "reduce": 1.0, "reduce_scatter": 1.0, "all_gather": 1.0}


def run(name: str, buf: torch.Tensor, out: torch.Tensor, world: int) -> None:
    if name == "all_reduce":
        dist.all_reduce(buf)
    elif name == "reduce":
        dist.reduce(buf, dst=0)
    elif name == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    else:
        dist.all_gather_into_tensor(buf, out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="64,1024")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    if rank == 0:
        peer = [
            torch.cuda.can_device_access_peer(0, j) for j in range(1, min(world, torch.cuda.device_count()))
        ]
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        print(
            json.dumps(
                {
                    "probe": "nccl_env",
                    "world": world,
                    "p2p_from_0": peer,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    "env": env,
                }
            ),
            flush=True,
        )
    for mb in [int(x) for x in args.sizes_mb.split(",")]:
        n = mb * 2**20 // 2  # bf16 elements
        buf = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
        for name, factor in FACTORS.items():
            times = []
            for i in range(args.iters + 1):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(name, buf, out, world)
                end.record()
                end.synchronize()
                if i:  # the first call sets up the communicator's buffers
                    times.append(start.elapsed_time(end) / 1e3)
            t = statistics.median(times)
            busbw = factor * (world - 1) / world * buf.numel() * 2 / t / 1e9
            if rank == 0:
                print(
                    json.dumps(
                        {
                            "probe": "nccl",
                            "op": name,
                            "mb": mb,
                            "ms": round(t * 1e3, 3),
                            "busbw_gbs": round(busbw, 1),
                        }
                    ),
                    flush=True,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
