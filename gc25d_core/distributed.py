"""Process-group helpers for torchrun jobs: ranks from the environment, the device, init/teardown, sharding."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

    from gc25d_core.config import Gc25dConfig

T = TypeVar("T")


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed_launch() -> bool:
    """Started by torchrun (or another launcher that sets the rendezvous environment), any world size:
    DeepSpeed and FSDP need a process group even on one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def pick_device(cfg: Gc25dConfig) -> torch.device:
    """The device of this rank: its current CUDA device when the config says cuda, else the CPU."""
    import torch

    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("config device=cuda but CUDA is not available (use the tiny preset on CPU)")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def pick_backend(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def process_group(backend: str = "auto", timeout_s: float = 600.0) -> Iterator[None]:
    """Init the default group when launched by torchrun (world size 1 included); always tear it down."""
    import torch
    import torch.distributed as dist

    started = False
    if is_distributed_launch() and not dist.is_initialized():
        chosen = pick_backend(backend)
        if chosen == "nccl":
            torch.cuda.set_device(local_rank())
        dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout_s))
        started = True
    try:
        yield
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def dist_active() -> bool:
    """An initialised process group of more than one rank (collectives have someone to talk to)."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def all_reduce(values: Sequence[float], device, op: str = "sum") -> list[float]:
    """Sum (or min) of ``values`` over the ranks, float64 on ``device``; the values alone without a group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist_active():
        dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.SUM)
    return t.tolist()


def shard(items: Sequence[T], rank: int | None = None, n_ranks: int | None = None) -> list[T]:
    """Deterministic round-robin shard: item i goes to rank i % n_ranks (default: the world size)."""
    rank = global_rank() if rank is None else rank
    n_ranks = world_size() if n_ranks is None else n_ranks
    if not 0 <= rank < n_ranks:
        raise ValueError(f"rank {rank} outside 0..{n_ranks - 1} (world size {n_ranks})")
    return list(items[rank::n_ranks])


def broadcast_ints(values: Sequence[int], device, src: int = 0) -> list[int]:
    """``values`` as rank ``src`` has them, on every rank (a draw made once, shared)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.int64, device=device)
    if dist_active():
        dist.broadcast(t, src=src)
    return [int(v) for v in t.tolist()]
