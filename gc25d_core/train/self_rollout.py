"""Stage 3's self-rollout (SPEC §8; the rollout half of ``train.stage3_dmd.Stage3Run``).

The generator rolls clips out through the deploy runtime's sampler (``models.sampler``) from the
real clean anchor, with the real per-cell ids and prompts; the draws (cells, exit step) come from
rank 0. The fast path (``rollout_path`` "fast", ``models.fast_rollout``) runs the no-grad forwards
on a replica of the generator gathered once per optimizer step; the exit forwards that carry
gradients stay on the training module, by default as one forward over the scored cells after the
rollout (``batch_exit_forwards``). Several no-grad rollouts (a step's critic updates) can run
as one batch (``rollout_groups``), each exactly as it would alone up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, cast

import torch

from gc25d_core.distributed import broadcast_ints
from gc25d_core.models.configs import CausalConfig
from gc25d_core.models.fast_rollout import ExitCapture, ReplicaMode, RolloutRunner
from gc25d_core.models.sem_cond import cell_frame_slice, cells_frame_slice
from gc25d_core.stage_config import Stage3Config
from gc25d_core.train.data import TrainingSample, batch_of, generator
from gc25d_core.train.inputs import to_device

if TYPE_CHECKING:
    from gc25d_core.models.gcdit import GcDiT

__all__ = ["SelfRollout", "replica_mode"]


def replica_mode(engine: Any) -> ReplicaMode | None:
    """How the engine's generator forward computes (the rollout replica mirrors it): FSDP's bf16
    mixed precision holds bf16 weights, casts the root's float inputs, and on CUDA accelerate adds
    bf16 autocast and fp32 outputs; the torch engine keeps fp32 weights under bf16 autocast."""
    bf16 = engine.precision == "bf16"
    if engine.kind == "fsdp":
        acc = bf16 and getattr(engine, "accelerator", None) is not None
        dtype = torch.bfloat16 if bf16 else torch.float32
        return ReplicaMode(dtype=dtype, autocast=acc, cast_inputs=bf16, fp32_out=acc)
    if engine.kind == "torch":
        return ReplicaMode(dtype=torch.float32, autocast=bf16)
    return None


class SelfRollout:
    """The rollout methods of stage 3's run, over the run's state (its section, generator, engine,
    text bank, device; the causal spec, axis and checkpointing ``build`` sets)."""

    section: Stage3Config
    model: Any
    engine: Any
    text: Any
    device: torch.device
    axis: tuple[float, ...]
    rollout_causal: CausalConfig
    rollout_checkpoint: bool
    rollout_path: str
    fast_runner: RolloutRunner | None
    gather_s: float
    sync_phases: bool
    draws: list[tuple[int, int]]  # (cells, exit step) of this step's rollouts

    def _draw(self, step: int, k: int) -> tuple[int, int]:
        """(cells incl. the anchor, exit step) drawn on rank 0 and broadcast."""
        sec = self.section
        g = generator(sec.seed, "rollout", step, k)
        cells = int(torch.randint(sec.min_cells, sec.max_cells + 1, (1,), generator=g))
        exit_step = int(torch.randint(0, len(self.axis), (1,), generator=g))
        cells, exit_step = broadcast_ints([cells, exit_step], self.device)
        self.draws = [] if k == 0 else self.draws  # the step's first rollout (its first critic update)
        self.draws.append((cells, exit_step))
        return cells, exit_step

    def rollout(
        self, samples: list[TrainingSample], cells: int, exit_step: int, gen: torch.Generator, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
        """One rollout of ``samples``: ``rollout_groups`` of one group."""
        return self.rollout_groups([samples], [(cells, exit_step)], [gen], grad=grad)[0]

    def rollout_groups(
        self,
        groups: list[list[TrainingSample]],
        draws: list[tuple[int, int]],
        gens: list[torch.Generator],
        grad: bool,
    ) -> list[tuple[torch.Tensor, torch.Tensor, list[list[str]]]]:
        """Per group of samples with its draw (cells, exit step) and generator: the scored clip
        [B, 48, 1 + K, H, W] (cell 0 = the anchor), its raw ids and text keys. Several groups (a
        step's critic updates, no grad) roll out as one batch, each as it would alone
        (``sampler.RowGroups``). ``rollout_path`` "fast": the no-grad forwards on the generator's
        replica (``_fast``), the grad exit forwards on ``self.model``; "module": every forward on
        ``self.model``."""
        from gc25d_core.models.gcdit import GcDiT, TextContext
        from gc25d_core.models.sampler import CausalStreamer, RowGroups

        horizon, n = self.section.grad_horizon, len(groups[0])
        if any(len(g) != n for g in groups) or (grad and len(groups) > 1):
            raise ValueError("rollout groups: one with grad, or several of one size without")
        samples, cells = [s for g in groups for s in g], max(c for c, _ in draws)
        for s in samples:
            if s.ext_ids is None or s.ext_keys is None or len(s.all_keys()) < cells:
                raise ValueError(
                    f"{s.sample_id}: stage 3 needs {cells} cells of ids and prompts (has_ext clips)"
                )
        ids = batch_of([s.all_ids() for s in samples])
        keys = [s.all_keys() for s in samples]
        anchor = to_device(batch_of([s.latent for s in samples]), self.device).float()[:, :, :1]
        dtype = next(self.model.module.parameters()).dtype
        device_gens = [
            torch.Generator(device=self.device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=g)))
            for g in gens
        ]
        how: dict[str, Any] = (
            {"generator": device_gens[0], "exit_step": draws[0][1]}
            if len(groups) == 1
            else {"groups": RowGroups(device_gens, [e for _, e in draws])}
        )
        fast = self._fast() if self.rollout_path == "fast" else None
        exits = None
        if fast is not None and grad and self.section.batch_exit_forwards:
            exits = ExitCapture(range(draws[0][0] - horizon, draws[0][0]), float(self.axis[draws[0][1]]))

        def text(cell: int) -> TextContext:
            # unbound: the forward binds it to the (possibly sharded) text embedding
            raw, index = self.text.context([[k[cell]] for k in keys])
            if fast is None:
                return TextContext.build(raw, index)
            return fast.cell_text(raw, index, key=tuple(k[cell] for k in keys))

        # the clip's ids on the device at once (one copy per rollout, not a pinned copy per cell)
        ids_dev = to_device(ids[:, : cell_frame_slice(cells - 1).stop], self.device)

        def sem(cell: int) -> torch.Tensor:
            return ids_dev[:, cell_frame_slice(cell)]

        if fast is None:
            streamer = CausalStreamer(
                cast(GcDiT, self.model.module),
                self.rollout_causal,
                self.axis,
                forward=self.model,
                checkpoint=self.rollout_checkpoint,
            )
            with torch.no_grad():
                streamer.start(anchor.to(dtype), text(0), sem(0))
        else:
            streamer = fast.streamer(
                self.rollout_causal,
                self.axis,
                anchor.to(dtype),
                slow=self.model if grad and exits is None else None,
                checkpoint=self.rollout_checkpoint,
                exits=exits,
            )
            with torch.no_grad():
                fast.start(streamer, anchor.to(dtype), text(0), sem(0))
        out, first = {}, min(c for c, _ in draws) - horizon
        for cell in range(1, cells):
            scored = grad and exits is None and cell >= cells - horizon
            x0 = streamer.step(text(cell), sem(cell), grad=scored, **how)
            if cell >= first:
                out[cell] = x0.float()
        if exits is not None:
            tail = exits.cells
            raw, index = self.text.context([[k[c] for c in tail] for k in keys])
            frames = ids_dev[:, cells_frame_slice(tail)]
            x0 = exits.forward(
                self.model, TextContext.build(raw, index.to(self.device)), frames, self.rollout_checkpoint
            )
            for i, c in enumerate(tail):
                out[c] = x0[:, :, i : i + 1].float()
        clips = []
        for g, (c, _) in enumerate(draws):
            rows, tail = slice(g * n, (g + 1) * n), range(c - horizon, c)
            frames = torch.cat([ids[rows, cell_frame_slice(t)] for t in (0, *tail)], dim=1)
            clip_keys = [[k[t] for t in (0, *tail)] for k in keys[rows]]
            clips.append((torch.cat([anchor[rows], *(out[t][rows] for t in tail)], dim=2), frames, clip_keys))
        return clips

    def _fast(self) -> RolloutRunner:
        """The generator's rollout replica with its current weights. Gathered once per optimizer
        step of the generator (its scheduler's count): the weights change only there, so the step's
        ``critic_steps`` + 1 rollouts share one gather. Derived state, never saved: a resumed run
        gathers on its first rollout."""
        version = self.model.scheduler.last_epoch
        if self.fast_runner is None:
            mode = replica_mode(self.engine)
            if mode is None:
                raise ValueError(
                    f"stage3_dmd.rollout_path 'fast' runs on the fsdp and torch engines, not {self.engine.kind}"
                )
            template = cast("GcDiT", self.model.module)
            compile_ = self.section.rollout_compile and self.device.type == "cuda"
            self.fast_runner = RolloutRunner(
                template, mode, self.device, compile=compile_, compile_rope=self.section.rollout_compile_rope
            )
            self.fast_runner.model.load_state_dict(
                {n.replace("_fsdp_wrapped_module.", ""): b for n, b in template.named_buffers()}, strict=False
            )
        if self.fast_runner.version != version:
            t0 = self._sync_time()
            with self._gathered():
                self.fast_runner.load(self.model.module.named_parameters(), version)
            self.gather_s += self._sync_time() - t0
        return self.fast_runner

    def _sync_time(self) -> float:
        if self.sync_phases and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _gathered(self) -> contextlib.AbstractContextManager[Any]:
        """The generator's full parameters in its module (FSDP: gathered from the shards on every
        rank; a collective, so every rank calls it at the same rollout)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        wrapped = getattr(self.model, "wrapped", None)
        if isinstance(wrapped, FSDP):
            return FSDP.summon_full_params(wrapped, writeback=False)
        return contextlib.nullcontext()
