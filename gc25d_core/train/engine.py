"""Training engines: one protocol, three implementations (DESIGN.md §4.6).

An engine turns a built model plus its optimizer settings into a ``Trained`` handle that does the
forward, backward, optimizer step and state save/load the way its parallelism needs:

    Zero2Engine   (train.zero2) accelerate's ``Accelerator`` with a ``DeepSpeedPlugin`` built from the DeepSpeed dict
                  we generate (ZeRO-2; SFT, stage 1, stage 2). One trained model per run.
    FsdpEngine    (train.fsdp) FSDP FULL_SHARD, one unit per GcDiT block, bf16 mixed precision on GPU; several
                  trained models in one run (stage 3: generator and critic). On CUDA through
                  accelerate's FSDP plugin; on CPU (gloo) through torch's FSDP with the same settings,
                  because accelerate only enables FSDP for accelerator devices.
    TorchEngine   plain torch on one process, DDP on several (CPU tests, the fallback).

Gradient clipping happens in exactly one place per engine: DeepSpeed's ``gradient_clipping`` (the
generated config) for ZeRO-2, ``clip_grad_norm_`` in ``step`` for FSDP and torch; all three take
the value from ``OptimConfig.grad_clip``.

State goes through ``save(slot)`` / ``load(slot)`` (train.state's SlotWriter / SlotReader, on every
rank): DeepSpeed's own checkpoint files, recorded and read back by our weights-only checkpoint
engine (``safe_load``); per-rank shard files for FSDP; one file for torch. Every file's SHA256 is
recorded and checked before ``torch.load(weights_only=True)``. The resume checks
(same engine, same world size for sharded state) are the run state's (``state``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from gc25d_core.distributed import dist_active, global_rank, world_size
from gc25d_core.stage_config import EngineKind, OptimConfig, StageConfig, ZeroConfig
from gc25d_core.train.state import SlotReader, SlotWriter

__all__ = [
    "Engine",
    "Trained",
    "TorchEngine",
    "build_engine",
    "deepspeed_config",
    "ensure_process_group",
    "lr_lambda",
]


def lr_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Multiplier of optimizer step s (0-based): linear warmup over ``warmup_steps``, then 1."""

    def f(s: int) -> float:
        return 1.0 if warmup_steps <= 0 else min(1.0, (s + 1) / warmup_steps)

    return f


def build_optimizer(param_groups: list[dict[str, Any]], optim: OptimConfig, on_cuda: bool):
    """AdamW over the given groups (each with its ``lr``), warmup-then-constant LambdaLR."""
    fused = on_cuda if optim.fused is None else optim.fused
    opt = torch.optim.AdamW(
        param_groups,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=fused or None,  # one kernel over the flat fp32 partition instead of foreach passes
    )
    f = lr_lambda(optim.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [f] * len(param_groups))
    return opt, sched


ParamGroups = Callable[[torch.nn.Module], list[dict[str, Any]]]


def apply_update(optimizer: torch.optim.Optimizer, scheduler: Any, norm: torch.Tensor) -> torch.Tensor:
    """After the clip: the optimizer step, the LR step, the gradients freed; the pre-clip norm back."""
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def group_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


def default_groups(optim: OptimConfig) -> ParamGroups:
    return lambda m: [{"params": [p for p in m.parameters() if p.requires_grad], "lr": optim.lr}]


def deepspeed_config(
    zero: ZeroConfig, *, micro_batch: int, grad_accum: int, grad_clip: float, world_size: int, precision: str
) -> dict[str, Any]:
    """The DeepSpeed config generated from a stage's settings (written to <run_dir>/deepspeed.json)."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
        "gradient_clipping": grad_clip,
        "zero_optimization": {
            "stage": zero.stage,
            "overlap_comm": zero.overlap_comm,
            "contiguous_gradients": zero.contiguous_gradients,
            "reduce_bucket_size": zero.reduce_bucket_size,
            "allgather_bucket_size": zero.allgather_bucket_size,
            "use_multi_rank_bucket_allreduce": zero.use_multi_rank_bucket_allreduce,
        },
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": False},
        # the optimizer is a client torch.optim.AdamW (a DS-config optimizer becomes a JIT-built FusedAdam)
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def ensure_process_group(backend: str) -> None:
    """DeepSpeed and FSDP need a process group even on one rank: without torchrun's environment,
    a single-rank group on an in-memory store (no port to pick) and the LOCAL_RANK DeepSpeed asks for."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("LOCAL_RANK", "0")
    timeout = datetime.timedelta(seconds=600)
    if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


def _host_copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0: the weights copied to the host (a snapshot: the EMA swaps values in and out of the
    live tensors); other ranks: nothing."""
    if global_rank() != 0:
        return {}
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def new_accelerator(**kwargs: Any) -> Any:
    """An ``Accelerator`` with this run's plugins. accelerate keeps its state process-wide and
    refuses a second plugin; a process that runs several stages one after the other (tests, a
    notebook) gets a fresh one by clearing that state first (the process group is kept)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(**kwargs)


class Trained(Protocol):
    """One trained model, its optimizer and LR schedule, as its engine wraps them."""

    name: str
    module: torch.nn.Module  # the model as built: exports, validation, the EMA's source
    autocast: bool  # whether forwards run under bf16 autocast (FSDP/torch bf16; DeepSpeed holds bf16)

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def accumulate(self, boundary: bool) -> contextlib.AbstractContextManager[None]: ...

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        """An evaluation forward (the caller holds no_grad). Under FSDP it gathers the shards, so
        every rank must make the same number of these calls; the others talk to no other rank."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, boundary: bool) -> torch.Tensor | None:
        """At a boundary: clip, optimizer step, LR step, zero grads; the pre-clip global grad norm
        as a device tensor (no host sync). None between boundaries."""
        ...

    def lrs(self) -> list[float]: ...

    def save(self, slot: SlotWriter) -> None: ...

    def load(self, slot: SlotReader) -> None: ...

    def local_params(self) -> list[tuple[str, torch.Tensor]]:
        """This rank's share of the trained parameters, in a fixed order (the EMA's source)."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the full weights on rank 0 (other ranks may get an empty dict)."""
        ...


class Engine(Protocol):
    kind: EngineKind
    device: torch.device
    precision: str

    @property
    def build_dtype(self) -> torch.dtype:
        """The dtype models are built in for this engine."""
        ...

    def train(
        self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups
    ) -> Trained: ...

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def config_files(self, run_dir: Path) -> dict[str, str]:
        """File name in ``run_dir`` -> text of the configs a user relaunches with (deepspeed.json,
        accelerate.yaml)."""
        ...


# ============================================================================== torch / DDP


class _TorchTrained:
    def __init__(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups, engine):
        self.name, self.module = name, model
        self.device, self.autocast = engine.device, engine.precision == "bf16"
        self.optimizer, self.scheduler = build_optimizer(groups(model), optim, engine.device.type == "cuda")
        self.grad_accum, self.clip = engine.grad_accum, optim.grad_clip
        self.wrapped: torch.nn.Module = model
        if dist_active():
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = DistributedDataParallel(model, device_ids=ids)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.wrapped(*args, **kwargs)

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.module(*args, **kwargs)  # not through DDP: no buffer broadcast

    def accumulate(self, boundary: bool) -> contextlib.AbstractContextManager[None]:
        no_sync = getattr(self.wrapped, "no_sync", None)
        return contextlib.nullcontext() if boundary or no_sync is None else no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum).backward()

    def step(self, boundary: bool) -> torch.Tensor | None:
        if not boundary:
            return None
        return apply_update(
            self.optimizer,
            self.scheduler,
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip),
        )

    def lrs(self) -> list[float]:
        return group_lrs(self.optimizer)

    def save(self, slot: SlotWriter) -> None:
        if global_rank() == 0:  # replicated: one copy
            state = {
                "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
            slot.save(state, f"{self.name}.pt")

    def load(self, slot: SlotReader) -> None:
        state = slot.load(f"{self.name}.pt", map_location=self.device)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def local_params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return _host_copy(self.module)


@dataclass
class TorchEngine:
    device: torch.device
    precision: str
    grad_accum: int
    kind: EngineKind = "torch"

    @property
    def build_dtype(self) -> torch.dtype:
        return torch.float32  # fp32 weights; bf16 only through autocast

    def train(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups) -> Trained:
        return _TorchTrained(name, model, optim, groups, self)

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.eval().requires_grad_(False)

    def config_files(self, run_dir: Path) -> dict[str, str]:
        return {}


def _accelerate_yaml(body: dict[str, Any]) -> str:
    """The file ``accelerate launch --config_file`` takes (one machine, one process per GPU)."""
    import yaml

    doc = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": 1,
        "num_processes": world_size(),
        "machine_rank": 0,
        "main_training_function": "main",
        **body,
    }
    return yaml.safe_dump(doc, sort_keys=True)


def build_engine(stage: StageConfig, device: torch.device, precision: str) -> Engine:
    """The engine a stage's config names, on this process's device."""
    if stage.engine == "zero2":
        from gc25d_core.train.zero2 import Zero2Engine

        ds = deepspeed_config(
            stage.zero,
            micro_batch=stage.micro_batch,
            grad_accum=stage.grad_accum,
            grad_clip=stage.optim.grad_clip,
            world_size=world_size(),
            precision=precision,
        )
        return Zero2Engine(device, precision, ds, stage.zero.via)
    if stage.engine == "fsdp":
        from gc25d_core.train.fsdp import FsdpEngine

        return FsdpEngine(device, precision, stage.grad_accum, stage.fsdp)
    return TorchEngine(device, precision, stage.grad_accum)
