"""Distributed health check: every rank joins, all-reduces each step, and rank 0 checkpoints.

It proves the launcher end to end (process group, per-rank errors, checkpoint resume, reporting)
before hours of GPU time go into a real stage, and measures all-reduce latency on the cluster.

    torchrun --nproc_per_node=2 -m gc25d_core.jobs.cluster_check --config c.yaml --run-dir d --steps 6
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import time

import torch
import torch.distributed as dist

from gc25d_core.checkpoint import CheckpointDir
from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import all_reduce, barrier, global_rank, pick_backend, world_size
from gc25d_core.faults import maybe_inject_fault
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    rank, n_ranks = global_rank(), world_size()
    backend = dist.get_backend() if dist.is_initialized() else "none"
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    ckpts = CheckpointDir(args.run_dir / "checkpoints", keep=2)
    start_step, total = 0, 0.0
    if (latest := ckpts.latest()) is not None and not args.fresh:
        state = ckpts.load_json(latest)
        start_step, total = state["step"], state["total"]
        rep.log(f"resuming from {ckpts.path(latest)} (step {start_step})")
    expected_per_step = n_ranks * (n_ranks + 1) / 2
    progress = rep.progress(total=args.steps, unit="steps", every_s=2.0, start=start_step)
    latencies = []
    for step in range(start_step + 1, args.steps + 1):
        maybe_inject_fault(step, rep.retry_number)
        t0 = time.perf_counter()
        (got,) = all_reduce([float(rank + 1)], device)
        latencies.append(time.perf_counter() - t0)
        if got != expected_per_step:
            raise RuntimeError(f"all_reduce returned {got}, expected {expected_per_step} (step {step})")
        total += got
        if args.step_seconds:
            time.sleep(args.step_seconds)
        barrier()
        if rank == 0:
            ckpts.save_json(step, {"step": step, "total": total, "world_size": n_ranks})
        barrier()
        progress.update(1)
    hosts: list[str | None] = [None] * n_ranks
    if dist.is_initialized():
        dist.all_gather_object(hosts, socket.gethostname())
    else:
        hosts = [socket.gethostname()]
    digest = hashlib.sha256(json.dumps({"steps": args.steps, "total": total}).encode()).hexdigest()[:16]
    rep.materialize(
        {
            "world_size": n_ranks,
            "backend": backend,
            "requested_backend": pick_backend(cfg.distributed.backend),
            "steps": args.steps,
            "resumed_from_step": start_step,
            "total": total,
            "hosts": sorted(set(hosts)),
            "all_reduce_ms_median": 1000 * sorted(latencies)[len(latencies) // 2] if latencies else 0.0,
            "checkpoint_dir": str(ckpts.root),
        },
        data_version=digest,
    )


def parser() -> argparse.ArgumentParser:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (to watch progress)")
    p.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    return p


if __name__ == "__main__":
    run_job(parser(), main)
