"""Exponential moving average of a trained model's weights: an fp32 shadow, always in the run state.

The shadow is built from the weights before any state is loaded, updated after every optimizer step
(``s ← d·s + (1 − d)·θ`` from ``start_step`` on, a plain copy before it, so the shadow is the
weights until the EMA starts), and saved with the state together with its ``started`` flag, so a
resume never drops it and never restarts it. Public CD trainers lose theirs on resume (FastVideo
#1440; Causal-Forcing's CD trainer cannot resume after its EMA starts): the resume test here is
bit-identity of the shadow after a kill past the start step.

The shadow covers the engine's ``local_params`` (this rank's share: the whole model under ZeRO-2 and
torch, the local shards under FSDP), so it is saved per rank and exported through the engine's
``full_state_dict`` with the shadow swapped in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gc25d_core.distributed import global_rank
from gc25d_core.stage_config import EmaConfig
from gc25d_core.train.engine import Trained
from gc25d_core.train.state import SlotReader, SlotWriter


class Ema:
    def __init__(self, trained: Trained, cfg: EmaConfig):
        self.trained, self.cfg = trained, cfg
        self.names = [n for n, _ in trained.local_params()]
        with torch.no_grad():
            self.shadow = [p.detach().float().clone() for _, p in trained.local_params()]
        self.started = False
        self.updates = 0

    def _params(self) -> list[torch.Tensor]:
        params = self.trained.local_params()
        if [n for n, _ in params] != self.names:
            raise RuntimeError("the trained model's parameters changed since the EMA was built")
        return [p for _, p in params]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step ``step`` (1-based)."""
        params = self._params()
        if step < self.cfg.start_step:
            torch._foreach_copy_(self.shadow, [p.float() for p in params])
            return
        self.started = True
        self.updates += 1
        # fp32 lerp: s + (1 - d)(θ - s) = d·s + (1 - d)·θ
        torch._foreach_lerp_(self.shadow, [p.float() for p in params], 1.0 - self.cfg.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The trained weights replaced by the shadow (cast to their dtype) inside the block."""
        params = self._params()
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            for p, s in zip(params, self.shadow, strict=True):
                p.copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved, strict=True):
                    p.copy_(s)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the EMA weights (in the model's dtypes) on rank 0."""
        with self.swapped_in():
            return self.trained.full_state_dict()

    # -- state ----------------------------------------------------------------------------------

    def _name(self) -> str:
        return f"ema-{self.trained.name}-rank{global_rank()}.pt"

    def save(self, slot: SlotWriter) -> None:
        state = {
            "names": self.names,
            "shadow": self.shadow,
            "started": self.started,
            "updates": self.updates,
            "decay": self.cfg.decay,
            "start_step": self.cfg.start_step,
        }
        slot.save(state, self._name())

    def load(self, slot: SlotReader) -> None:
        path = slot.folder / self._name()
        state = slot.load(self._name(), map_location=self.shadow[0].device if self.shadow else "cpu")
        if state["names"] != self.names:
            raise RuntimeError(f"{path}: EMA shadow of other parameters than the model's")
        for key in ("decay", "start_step"):
            if state[key] != getattr(self.cfg, key):
                raise RuntimeError(f"{path}: EMA {key}={state[key]}, the config has {getattr(self.cfg, key)}")
        with torch.no_grad():
            for s, v in zip(self.shadow, state["shadow"], strict=True):
                s.copy_(v)
        self.started, self.updates = bool(state["started"]), int(state["updates"])
