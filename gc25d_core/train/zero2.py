"""ZeRO-2: accelerate's ``Accelerator`` with a ``DeepSpeedPlugin`` (or ``deepspeed.initialize``) over the
config ``engine.deepspeed_config`` generates; one trained model per run (train.engine)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gc25d_core.distributed import global_rank
from gc25d_core.stage_config import EngineKind, OptimConfig
from gc25d_core.train.engine import (
    ParamGroups,
    Trained,
    _accelerate_yaml,
    _host_copy,
    build_optimizer,
    ensure_process_group,
    group_lrs,
    new_accelerator,
)
from gc25d_core.train.state import SlotReader, SlotWriter

# DeepSpeed's CPU accelerator compiles this C++ op (its shared-memory collectives) on first use
CPU_COMM_OP = "deepspeed_shm_comm"


def _cached_cpu_comm_op() -> tuple[Path, Path | None]:
    """The extensions folder torch builds into, and the op's library there if a build is cached."""
    import os

    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    return root, next(root.glob(f"**/{CPU_COMM_OP}/{CPU_COMM_OP}.so"), None)


def cpu_op_build_note() -> str | None:
    """What to say before DeepSpeed starts on CPU when its communication op is not built yet: the
    compile takes about a minute with no output of its own. None when a build is cached."""
    root, cached = _cached_cpu_comm_op()
    if cached is not None:
        return None
    return (
        f"DeepSpeed is compiling its CPU op {CPU_COMM_OP} (first use in {root}): about a minute without "
        "output; later runs load it from there"
    )


def build_cpu_comm_op() -> Path | None:
    """Compile DeepSpeed's CPU communication op into the extensions folder now (``make setup``), so
    that the first training job does not spend its first half minute on it; a cached build is only
    loaded. Returns the op's library, or None where this DeepSpeed has no such op for this machine
    (another accelerator, not Linux): its jobs then use gloo's collectives, as DeepSpeed does."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    builder.load(verbose=False)
    return _cached_cpu_comm_op()[1]


class _Zero2Trained:
    """ZeRO-2 through accelerate's DeepSpeed plugin (``via: accelerate``) or ``deepspeed.initialize``
    (``via: deepspeed``) with the same generated config. accelerate hands our LambdaLR back to us (it
    passes only DeepSpeed's own scheduler classes to the engine), so on that path we step it at the
    boundary and save it beside DeepSpeed's files; the direct path gives it to DeepSpeed."""

    def __init__(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups, engine):
        from gc25d_core.train.safe_load import install_safe_checkpoint_engine

        self.name, self.autocast = name, False  # DeepSpeed's bf16 mode holds bf16 weights
        self.acc = engine.accelerator
        opt, sched = build_optimizer(groups(model), optim, engine.device.type == "cuda")
        self.client_optimizer, self.client_scheduler = opt, sched
        if self.acc is not None:
            self.ds_engine, _, self.scheduler = self.acc.prepare(model, opt, sched)
        else:
            import deepspeed

            self.ds_engine, _, _, self.scheduler = deepspeed.initialize(
                model=model,
                optimizer=opt,
                lr_scheduler=sched,
                config=engine.ds_config,
                dist_init_required=False,
            )
        self.safe_ckpt = install_safe_checkpoint_engine(self.ds_engine)
        self.module: torch.nn.Module = self.ds_engine.module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.ds_engine(*args, **kwargs)

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)  # ZeRO-2 weights are whole on every rank

    @contextlib.contextmanager
    def accumulate(self, boundary: bool) -> Iterator[None]:
        if self.acc is None:  # DeepSpeed counts micro-steps itself
            yield
            return
        with self.acc.accumulate(self.ds_engine):
            if self.acc.sync_gradients != boundary:  # accelerate counts micro-steps too
                raise RuntimeError(
                    f"accelerate's accumulation boundary ({self.acc.sync_gradients}) disagrees with the "
                    f"stage's ({boundary}): every optimizer step must run exactly grad_accum micro-steps"
                )
            yield

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed scales by 1 / grad_accum; through accelerate it also steps at the boundary
        if self.acc is not None:
            self.acc.backward(loss)
        else:
            self.ds_engine.backward(loss)

    def step(self, boundary: bool) -> torch.Tensor | None:
        if self.acc is None:
            self.ds_engine.step()  # every micro-step: DeepSpeed steps at its own boundary
        if not boundary:
            return None
        if self.acc is not None:
            self.scheduler.step()  # one LambdaLR step (step_scheduler_with_optimizer=False)
        norm = self.ds_engine.get_global_grad_norm()
        if norm is None:
            return torch.tensor(float("nan"))
        return norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))

    def lrs(self) -> list[float]:
        return group_lrs(self.client_optimizer)

    def save(self, slot: SlotWriter) -> None:
        with self.safe_ckpt.recording(slot.folder) as digests:
            self.ds_engine.save_checkpoint(
                str(slot.folder), tag=self.name, client_state={}, save_latest=False
            )
        slot.record(digests)
        if self.acc is not None and global_rank() == 0:
            slot.save(self.client_scheduler.state_dict(), f"{self.name}-scheduler.pt")

    def load(self, slot: SlotReader) -> None:
        with self.safe_ckpt.expecting(slot.folder, slot.digests):
            path, _ = self.ds_engine.load_checkpoint(
                str(slot.folder), tag=self.name, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {slot.folder / self.name}")
        if self.acc is not None:
            self.client_scheduler.load_state_dict(slot.load(f"{self.name}-scheduler.pt"))

    def local_params(self) -> list[tuple[str, torch.Tensor]]:
        # ZeRO-2 keeps the (bf16) weights replicated; the EMA shadows them in fp32 on every rank
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return _host_copy(self.module)


class Zero2Engine:
    kind: EngineKind = "zero2"

    def __init__(self, device: torch.device, precision: str, ds_config: dict[str, Any], via: str):
        ensure_process_group("nccl" if device.type == "cuda" else "gloo")
        self.device, self.precision, self.ds_config = device, precision, ds_config
        self.accelerator: Any = None
        if via == "accelerate":
            from accelerate.utils import DeepSpeedPlugin

            self.accelerator = new_accelerator(
                deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                gradient_accumulation_steps=ds_config["gradient_accumulation_steps"],
                # one LambdaLR step per optimizer step (accelerate's default steps it once per process)
                step_scheduler_with_optimizer=False,
            )
        self._trained = 0

    @property
    def build_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    def train(self, name: str, model: torch.nn.Module, optim: OptimConfig, groups: ParamGroups) -> Trained:
        if self._trained:
            raise ValueError("the ZeRO-2 engine trains one model per run (use the FSDP engine for several)")
        self._trained += 1
        return _Zero2Trained(name, model, optim, groups, self)

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.build_dtype).eval().requires_grad_(False)

    def config_files(self, run_dir: Path) -> dict[str, str]:
        import json

        ds_file = (run_dir / "deepspeed.json").resolve()
        return {
            "deepspeed.json": json.dumps(self.ds_config, indent=1),
            "accelerate.yaml": _accelerate_yaml(
                {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": str(ds_file)}}
            ),
        }
