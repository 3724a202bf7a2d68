"""FSDP FULL_SHARD, one unit per transformer block, several trained models per run (train.engine).

On CUDA through accelerate's FSDP plugin; on CPU (gloo) through torch's FSDP with the same settings,
because accelerate enables FSDP only for accelerator devices. Each rank saves its own shards of the
weights and optimizer state (same world size to resume)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, cast

import torch

from gc25d_core.distributed import global_rank
from gc25d_core.stage_config import EngineKind, FsdpConfig, OptimConfig
from gc25d_core.train.engine import (
    ParamGroups,
    Trained,
    _accelerate_yaml,
    apply_update,
    build_optimizer,
    ensure_process_group,
    group_lrs,
    new_accelerator,
)
from gc25d_core.train.state import SlotReader, SlotWriter


def _block_classes(model: torch.nn.Module, names: tuple[str, ...]) -> set[type[torch.nn.Module]]:
    """One FSDP unit per transformer block: the model's module classes named in ``fsdp.block_classes``."""
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"{type(model).__name__} has no module of fsdp.block_classes={list(names)}")
    return classes


class _FsdpTrained:
    def __init__(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups, engine):
        self.name, self.autocast, self.clip = name, False, optim.grad_clip  # FSDP's mixed precision casts
        self.device, self.grad_accum = engine.device, engine.grad_accum
        self.module = model
        self.wrapped = engine.wrap(model)
        # use_orig_params: the groups see the original (now sharded) parameters by name
        self.optimizer, self.scheduler = build_optimizer(
            groups(self.wrapped), optim, self.device.type == "cuda"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped(*args, **kwargs)

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped(*args, **kwargs)

    def accumulate(self, boundary: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if boundary else self.wrapped.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum).backward()

    def step(self, boundary: bool) -> torch.Tensor | None:
        if not boundary:
            return None
        return apply_update(self.optimizer, self.scheduler, self.wrapped.clip_grad_norm_(self.clip))

    def lrs(self) -> list[float]:
        return group_lrs(self.optimizer)

    def _name(self) -> str:
        return f"{self.name}-rank{global_rank()}.pt"

    def save(self, slot: SlotWriter) -> None:
        # each rank its own shard of the weights and of the optimizer state (same world size to resume)
        state = {
            "params": {n: p.detach().clone() for n, p in self.local_params()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        slot.save(state, self._name())

    def load(self, slot: SlotReader) -> None:
        state = slot.load(self._name(), map_location=self.device)
        with torch.no_grad():
            params = dict(self.local_params())
            if set(params) != set(state["params"]):
                raise RuntimeError(f"{slot.folder / self._name()}: parameter shards differ from the model's")
            for n, p in params.items():
                p.copy_(state["params"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def local_params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.wrapped.named_parameters() if p.requires_grad]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # gathered to rank 0 in host memory from the GPU; every rank gathers it on CPU ranks, where
        # FSDP's offload copy crashed the gloo run. The names are the unwrapped model's.
        opts = StateDictOptions(full_state_dict=True, cpu_offload=self.device.type == "cuda")
        full = get_model_state_dict(self.wrapped, options=opts)
        return cast(dict[str, torch.Tensor], full)  # a full state dict holds plain tensors


class FsdpEngine:
    kind: EngineKind = "fsdp"

    def __init__(self, device: torch.device, precision: str, grad_accum: int, fsdp: FsdpConfig):
        ensure_process_group("nccl" if device.type == "cuda" else "gloo")
        self.device, self.precision, self.grad_accum, self.cfg = device, precision, grad_accum, fsdp
        self.accelerator: Any = None
        if device.type == "cuda":
            from accelerate.utils import FullyShardedDataParallelPlugin

            self.accelerator = new_accelerator(
                fsdp_plugin=FullyShardedDataParallelPlugin(**self.plugin_kwargs()),
                mixed_precision="bf16" if precision == "bf16" else "no",
            )

    @property
    def build_dtype(self) -> torch.dtype:
        return torch.float32  # fp32 master shards; FSDP's mixed precision computes in bf16

    def plugin_kwargs(self) -> dict[str, Any]:
        return {
            "fsdp_version": 1,
            "sharding_strategy": self.cfg.sharding_strategy,
            "auto_wrap_policy": "transformer_based_wrap",
            "transformer_cls_names_to_wrap": list(self.cfg.block_classes),
            "use_orig_params": True,
            "sync_module_states": False,  # every rank builds the same seeded or loaded weights
            "limit_all_gathers": True,
            "forward_prefetch": self.cfg.forward_prefetch,
            "state_dict_type": "SHARDED_STATE_DICT",
        }

    def _mixed_precision(self) -> Any:
        from torch.distributed.fsdp import MixedPrecision

        if self.precision != "bf16":
            return None
        return MixedPrecision(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16
        )

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.accelerator is not None:
            return self.accelerator.prepare_model(model)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy(_block_classes(model, self.cfg.block_classes)),
            sharding_strategy=ShardingStrategy[self.cfg.sharding_strategy],
            mixed_precision=self._mixed_precision(),
            device_id=self.device,
            use_orig_params=True,
            limit_all_gathers=True,
            forward_prefetch=self.cfg.forward_prefetch,
        )

    def train(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups) -> Trained:
        return _FsdpTrained(name, model, optim, groups, self)

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.eval().requires_grad_(False)
        if not self.cfg.shard_frozen:  # replicated: no all-gathers in its forwards
            return model.to(torch.bfloat16 if self.precision == "bf16" else torch.float32)
        return self.wrap(model)

    def config_files(self, run_dir: Path) -> dict[str, str]:
        kw = self.plugin_kwargs()
        return {
            "accelerate.yaml": _accelerate_yaml(
                {
                    "distributed_type": "FSDP",
                    "mixed_precision": "bf16" if self.precision == "bf16" else "no",
                    "fsdp_config": {f"fsdp_{k}": v for k, v in kw.items() if k != "fsdp_version"}
                    | {"fsdp_version": 1},
                }
            )
        }
