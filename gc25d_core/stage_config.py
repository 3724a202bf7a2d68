"""Typed configuration of the training stages (pydantic only: the Dagster side imports it).

``StageConfig`` is the base every stage shares: engine, precision, batch shape, schedule, cadences,
model init, optimizer, data, dropouts, validation, EMA, profiler. A stage's section subclasses it
with its own fields (``SftConfig`` adds the §10 pick rule) and is a typed field of the run config
(``Gc25dConfig.sft``), filled from ``configs/<stage>/<preset>.yaml`` by ``with_stage``.

It sits at the top level, in the config layer beside ``config`` and ``stages``, not in ``train/``:
the run config and the stage table name every section, and eval and deploy read the run config
without importing training code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gc25d_core.schema import Strict

EngineKind = Literal["zero2", "fsdp", "torch"]


class ModelConfig(Strict):
    """Which GcDiT and its initial weights. ``overrides`` are DiTConfig fields (e.g. fused_rmsnorm)."""

    preset: Literal["tiny", "full"] = "full"
    overrides: dict[str, Any] = Field(default_factory=dict)
    init: Literal["random", "wan", "export", "handoff"] = "wan"
    wan_dir: Path | None = None
    wan_sha256: dict[str, str] = Field(
        default_factory=dict, description="shard file name -> SHA256, checked before use"
    )
    export_path: Path | None = None
    export_sha256: str | None = None
    handoff: Path | None = Field(
        default=None,
        description="init='handoff': a producing stage's teacher.json / final.json (gc25d_core.handoff)",
    )
    handoff_export: Literal["export", "ema"] = "export"
    init_seed: int = 0
    gradient_checkpointing: bool = True
    checkpoint_blocks: int | None = Field(
        default=None, description="recompute only the first N blocks (None: all)"
    )
    compile: bool = Field(default=False, description="torch.compile the block body (GPU)")
    attn_backend: Literal["sdpa", "flex", "fa4"] = Field(
        default="sdpa",
        description="self-attention kernel: PyTorch SDPA; flex (compiled flex attention with a block "
        "mask for the causal masks: fully masked tiles skipped; unmasked attention stays on SDPA); or "
        "FlashAttention-4 (GPU sm90+, needs the optional flash-attn-4 package; models.fa4)",
    )
    flex_options: dict[str, bool | int | str] = Field(
        default_factory=dict,
        description="with attn_backend flex: torch's flex kernel options (e.g. USE_TMA, BLOCK_M, "
        "BACKEND), measured per shape by bench/speed/attention.py --mask tf",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.init == "wan" and self.wan_dir is None:
            raise ValueError("model.init='wan' needs model.wan_dir (and wan_sha256, checked at load)")
        if self.init == "export" and self.export_path is None:
            raise ValueError("model.init='export' needs model.export_path")
        if self.flex_options and self.attn_backend != "flex":
            raise ValueError(f"model.flex_options needs model.attn_backend 'flex', not {self.attn_backend!r}")
        return self


class OptimConfig(Strict):
    """AdamW; the DiT group at ``lr``, the ``gc_sem_cond.*`` group at ``cond_lr`` (None: ``lr``);
    linear warmup then constant; global-norm clipping at ``grad_clip`` (the one clip value: the
    generated DeepSpeed config and the engines' clip_grad_norm_ read it)."""

    lr: float = 1e-5
    cond_lr: float | None = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = Field(default=500, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    fused: bool | None = Field(
        default=None, description="torch's fused AdamW kernel (None: on CUDA, off on CPU)"
    )


class DataConfig(Strict):
    manifest_version: int | None = Field(
        default=None, description="snapshot to train on (None: the one manifest.json names at start)"
    )
    seed: int = 0
    num_workers: int = Field(default=1, ge=0)
    interleave: int = Field(default=1, ge=1)
    on_shard_failure: Literal["fail", "quarantine"] = "fail"
    meta_root: Path | None = Field(
        default=None,
        description="processed layout holding meta/<clip>.npz (default paths.data_root); read only for "
        "cache samples that do not carry world_to_clip / world_to_view / ground_z",
    )
    on_missing_meta: Literal["error", "skip_masking"] = "error"
    text_table: Path | None = Field(
        default=None, description="default <data_root>/text_table_gc25d.pt (synthetic table if absent)"
    )


class DropoutConfig(Strict):
    """SPEC §7 per-sample dropouts (masking.py)."""

    enabled: bool = True
    text: float = Field(default=0.1, ge=0, le=1)
    cond: float = Field(default=0.05, ge=0, le=1)
    unknown_mask: float = Field(default=0.5, ge=0, le=1)


class ValConfig(Strict):
    every: int = Field(default=500, ge=1)
    at_start: bool = Field(
        default=False, description="validate the initial weights too (step 0 of a fresh run: the baseline)"
    )
    num_clips: int = Field(default=16, ge=1)
    timesteps: tuple[float, ...] = (200.0, 500.0, 800.0)
    seed: int = 0


class ZeroConfig(Strict):
    stage: Literal[2] = 2
    via: Literal["accelerate", "deepspeed"] = Field(
        default="accelerate",
        description="accelerate's DeepSpeedPlugin (SPEC §7) or deepspeed.initialize directly (the same "
        "generated config; kept for the side-by-side measurement, docs/decisions.md)",
    )
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    use_multi_rank_bucket_allreduce: bool = Field(
        default=True,
        description="DeepSpeed's default: all-reduce whole gradient buckets; false = reduce each slice "
        "to its owner (half the bytes; the 2-GPU profile spends 10-25 %% of kernel time in all-reduce)",
    )


class FsdpConfig(Strict):
    """FSDP1 (SPEC §8 stage 3: FULL_SHARD), one unit per transformer block."""

    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"] = "FULL_SHARD"
    block_classes: tuple[str, ...] = ("GcDiTBlock",)
    forward_prefetch: bool = True
    shard_frozen: bool = Field(
        default=True, description="shard frozen models (the real score) too; false replicates them"
    )


class EmaConfig(Strict):
    """An fp32 shadow ``s ← d·s + (1 − d)·θ`` after each optimizer step from ``start_step`` on
    (before it the shadow follows the weights)."""

    enabled: bool = False
    decay: float = Field(default=0.99, ge=0.0, le=1.0)
    start_step: int = Field(default=200, ge=0)


class ProfileConfig(Strict):
    """torch.profiler over optimizer steps [start, start + steps) on rank 0 -> <run_dir>/profile/."""

    start: int = Field(default=0, ge=0, description="first profiled step (0: off)")
    steps: int = Field(default=2, ge=1)


class StageConfig(Strict):
    """What every training stage shares. ``export_every`` is the SPEC's ``save_every`` (one name here:
    the YAML writes ``export_every``): it writes exports; the full state rotates every ``state_every``."""

    engine: EngineKind = "zero2"
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    micro_batch: int = Field(default=1, ge=1)
    grad_accum: int = Field(default=2, ge=1)
    max_steps: int = Field(default=20000, ge=1)
    export_every: int = Field(default=1000, ge=1)
    state_every: int = Field(default=500, ge=1)
    state_slots: int = Field(default=2, ge=1)
    log_every: int = Field(default=1, ge=1)
    export_final: bool = True
    state_final: bool = Field(
        default=True, description="save the full state at the last step (benchmarks turn it off)"
    )
    deterministic: bool = False
    seed: int = 0
    data_tag: str = "v10"
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(init="random"))
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    dropout: DropoutConfig = DropoutConfig()
    val: ValConfig = ValConfig()
    ema: EmaConfig = EmaConfig()
    zero: ZeroConfig = ZeroConfig()
    fsdp: FsdpConfig = FsdpConfig()
    profile: ProfileConfig = ProfileConfig()

    @model_validator(mode="before")
    @classmethod
    def _spec_name(cls, data: Any) -> Any:
        # the SPEC's name would otherwise fail as an unknown key without saying which one is meant
        if isinstance(data, dict) and "save_every" in data:
            raise ValueError("save_every: the field is export_every (the SPEC's save_every)")
        return data


class PickConfig(Strict):
    """SPEC §10: the teacher = lowest mean cond val mse among steps ≥ min_step, latest within rel_tol."""

    min_step: int = Field(default=6000, ge=0)
    rel_tol: float = Field(default=0.005, ge=0.0)


class SftConfig(StageConfig):
    """SPEC §7 defaults (8 GPU × micro 1 × GA 2 = 16)."""

    pick: PickConfig = PickConfig()


class DeployCausalConfig(Strict):
    """The causal attention an export is deployed with (DESIGN.md §4.4), recorded in its metadata."""

    sink: int = Field(default=3, ge=0)
    window: int = Field(default=17, ge=1)
    rope_cap: int = Field(default=20, ge=1)


class CausalStageConfig(StageConfig):
    """What the causal stages share: teacher forcing, full causal in training by default ("windowed
    0/0": ``train_sink`` 0, ``train_window`` 0 = no window), the attention exports record for
    rollouts (``deploy``), the causal validation's t."""

    teacher_forcing: Literal[True] = True
    train_sink: int = Field(default=0, ge=0)
    train_window: int = Field(default=0, ge=0, description="0: full causal (no window) in training")
    deploy: DeployCausalConfig = DeployCausalConfig()
    causal_val_t: float = Field(default=500.0, description="t of the causal validation (next-cell x0 error)")


class Stage1Config(CausalStageConfig):
    """SPEC §8 stage 1: the causal student by teacher forcing, from the picked SFT teacher; every
    noisy cell draws its own timestep index."""


class Stage2Config(CausalStageConfig):
    """SPEC §8 stage 2: causal consistency distillation with an EMA target on the deploy axis.
    Teacher = student init = the stage-1 final export (``model``); the teacher is frozen and causal.
    ``teacher_substeps`` k > 1 solves each deploy interval with k Euler steps on the fine shifted grid
    (the anchors' fix for the one-step bias); 1 = the SPEC's single step (solver 1, cfg 1.0)."""

    teacher_substeps: int = Field(default=1, ge=1)
    ema: EmaConfig = EmaConfig(enabled=True, decay=0.99, start_step=200)
    dropout: DropoutConfig = DropoutConfig(enabled=False)

    @model_validator(mode="after")
    def _check_stage2(self) -> Stage2Config:
        if not self.ema.enabled:
            raise ValueError("stage 2 needs its EMA (ema.enabled: the target network and the deploy export)")
        if self.engine == "fsdp":
            # each rank draws its own interval, so ranks make different numbers of forwards: an FSDP
            # forward gathers across ranks and would wait forever
            raise ValueError("stage 2 runs on engine zero2 or torch (each rank draws its own CD interval)")
        return self


class Stage3Config(CausalStageConfig):
    """SPEC §8 stage 3: DMD with self-rollout. The generator (``model``) is the stage-2 EMA final
    export (causal); the real score and the critic start from the SFT teacher (``real``,
    bidirectional); the real score is frozen. Per optimizer step the critic takes ``critic_steps``
    steps on fresh rollouts, then the generator one. A rollout has ``min_cells``..``max_cells``
    cells (cell 0 the real anchor) and one exit step, both drawn on rank 0 and broadcast; the last
    ``grad_horizon`` cells carry the generator's gradient; the scored clip is cell 0 + those cells."""

    engine: EngineKind = "fsdp"
    grad_accum: int = Field(default=1, ge=1, le=1, description="one rollout per optimizer step")
    real: ModelConfig = Field(default_factory=lambda: ModelConfig(init="random"))
    critic_optim: OptimConfig = OptimConfig(
        lr=1e-6, cond_lr=None, betas=(0.0, 0.999), weight_decay=0.01, warmup_steps=100, grad_clip=10.0
    )
    critic_steps: int = Field(default=5, ge=1)
    min_cells: int = Field(default=21, ge=2)
    max_cells: int = Field(default=27, ge=2)
    grad_horizon: int = Field(default=20, ge=1)
    real_guidance: float = Field(
        default=1.0,
        ge=1.0,
        description="classifier-free guidance of the real score over the ids, on x̂0 in Wan's "
        "convention: uncond + g·(cond − uncond), uncond with every id UNKNOWN as validation's "
        "(the prompts kept). 1.0 = SPEC §8's cfg 1.0, one conditional pass; the anchors' real "
        "scores guide their text at 4.0–6.0 (research/distill_anchors.md §5)",
    )
    t_min: float = Field(default=20.0, ge=0.0, description="DMD t clamp (the anchors' [20, 980])")
    t_max: float = Field(default=980.0, le=1000.0)
    time_phases: bool = Field(
        default=False,
        description="synchronise the device around rollout / critic / generator for their times (benchmarks)",
    )
    rollout_path: Literal["fast", "module"] = Field(
        default="fast",
        description=(
            "fast: the no-grad rollout forwards on a replica of the generator gathered once per "
            "optimizer step (static KV cache, CUDA graphs on a GPU; models.fast_rollout), the grad "
            "exit forwards on the training module; module: every forward on the training module"
        ),
    )
    rollout_compile: bool = Field(
        default=True,
        description="fast path on CUDA: torch.compile the replica's block bodies (their elementwise "
        "work fused; the KV attention eager). Within bf16 rounding of the eager replica, not bit-identical",
    )
    rollout_compile_rope: bool = Field(
        default=True,
        description="fast path on CUDA with rollout_compile: each block's rotation of the query "
        "cell's q and k in the eager KV attention as one compiled function, and the cached keys' "
        "rotation for each new query cell at every fill level. Within bf16 rounding; 5-10 % off "
        "the iteration (bench.speed.stages +norope beside the default)",
    )
    batch_exit_forwards: bool = Field(
        default=True,
        description="fast path: the generator's rollout runs wholly on the replica, then its "
        "grad_horizon exit forwards with grad run as one forward of the training module over those "
        "cells, each attending to what it saw (false: one grad forward per cell during the rollout). "
        "The scored x0 equal the per-cell forwards' up to floating-point rounding; the rollout "
        "commits the replica's x0",
    )
    batch_critic_rollouts: bool = Field(
        default=False,
        description="the critic updates' no-grad rollouts of a step as one batch before the first "
        "update (each with its own draws and noise; equal to rolling them out one by one up to "
        "floating-point rounding)",
    )
    ema: EmaConfig = EmaConfig(enabled=True, decay=0.99, start_step=100)
    dropout: DropoutConfig = DropoutConfig(enabled=False)

    @model_validator(mode="after")
    def _check_stage3(self) -> Stage3Config:
        if not self.min_cells <= self.max_cells:
            raise ValueError(f"min_cells={self.min_cells} > max_cells={self.max_cells}")
        if self.grad_horizon > self.min_cells - 1:
            raise ValueError(f"grad_horizon={self.grad_horizon} needs min_cells >= {self.grad_horizon + 1}")
        if not self.ema.enabled:
            raise ValueError("stage 3 keeps its EMA (ema.enabled): its EMA exports are what deploy takes")
        return self
