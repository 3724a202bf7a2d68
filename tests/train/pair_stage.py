"""A two-model stage on the shared training core, for the engine and EMA tests (not a product stage).

A "generator" and a "critic" (small block MLPs) train in one run, the way stage 3 trains its
generator and critic: the critic takes several steps per generator step on its own optimizer, the
generator keeps an EMA. Data are seeded draws per (rank, step), so the run needs no cache; the loop,
the run state, the engines and the EMA are the real ones.

    torchrun --nproc_per_node=2 tests/train/pair_stage.py --run-dir D --engine fsdp --steps 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gc25d_core.config import Gc25dConfig, load_config  # noqa: E402
from gc25d_core.distributed import process_group  # noqa: E402
from gc25d_core.report import StdoutReporter  # noqa: E402
from gc25d_core.stage_config import StageConfig  # noqa: E402
from gc25d_core.train.data import generator  # noqa: E402
from gc25d_core.train.ema import Ema  # noqa: E402
from gc25d_core.train.engine import build_engine, default_groups  # noqa: E402
from gc25d_core.train.loop import StageRun  # noqa: E402
from gc25d_core.train.metrics import StepSums  # noqa: E402
from gc25d_core.train.state import ResumePoint, RngState, Stateful  # noqa: E402

DIM = 16
CRITIC_STEPS = 2


class PairBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class PairNet(torch.nn.Module):
    def __init__(self, seed: int, depth: int = 3) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.blocks = torch.nn.ModuleList(PairBlock() for _ in range(depth))
            self.head = torch.nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class PairRun(StageRun):
    name = "pair"

    def build(self, resume: ResumePoint) -> None:
        sec = self.section
        self.engine = build_engine(sec, self.device, self.precision)
        groups = default_groups(sec.optim)
        self.gen = self.engine.train("generator", PairNet(1), sec.optim, groups)
        self.critic = self.engine.train("critic", PairNet(2), sec.optim, groups)
        self.ema = Ema(self.gen, sec.ema)

    def state_parts(self) -> dict[str, Stateful]:
        return {"generator": self.gen, "critic": self.critic, "ema": self.ema, "rng": RngState()}

    def data_state(self) -> dict[str, Any]:
        return {}

    def _batch(self, step: int, k: int) -> torch.Tensor:
        return torch.randn(4, DIM, generator=generator("pair", self.rank, step, k))

    def train_step(self, step: int) -> dict[str, float]:
        sums = StepSums(("critic_loss", "gen_loss"), (), self.device)
        for k in range(CRITIC_STEPS):  # the critic's steps leave the generator's gradients alone
            x = self._batch(step, k)
            with torch.no_grad():
                fake = x + 0.1 * self.gen(x)
            critic_loss = (self.critic(fake) - 1.0).pow(2).mean() + self.critic(x).pow(2).mean()
            self.critic.backward(critic_loss)
            self.critic.step(True)
            sums.add_device([critic_loss / CRITIC_STEPS, torch.zeros(())])
        x = self._batch(step, CRITIC_STEPS)
        gen_loss = self.critic(x + 0.1 * self.gen(x)).pow(2).mean()
        self.gen.backward(gen_loss)
        self.critic.optimizer.zero_grad(set_to_none=True)  # the generator's loss reached the critic
        norm = self.gen.step(True)
        self.ema.update(step)
        sums.add_device([torch.zeros(()), gen_loss])
        tot = sums.reduce()
        return {
            "critic_loss": tot["critic_loss"] / self.world_size,
            "gen_loss": tot["gen_loss"] / self.world_size,
            "gen_grad_norm": float(norm) if norm is not None else float("nan"),
            "ema_started": float(self.ema.started),
        }

    def export(self, step: int) -> list[Path]:
        from safetensors.torch import save_file

        weights = {"generator": self.gen.full_state_dict(), "ema": self.ema.full_state_dict()}
        paths = []
        if self.rank == 0:
            for name, sd in weights.items():
                path = self.export_dir / name / f"step-{step:06d}.safetensors"
                path.parent.mkdir(parents=True, exist_ok=True)
                save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
                paths.append(path)
        return paths


def pair_config(engine: str, steps: int, ema_start: int) -> tuple[Gc25dConfig, StageConfig]:
    cfg = load_config("tiny")
    section = StageConfig(
        engine=engine,  # type: ignore[arg-type]
        precision="fp32",
        grad_accum=1,
        max_steps=steps,
        export_every=steps,
        state_every=2,
        deterministic=True,
        optim={"lr": 1e-2, "cond_lr": None, "warmup_steps": 2, "grad_clip": 1.0},  # type: ignore[arg-type]
        ema={"enabled": True, "decay": 0.9, "start_step": ema_start},  # type: ignore[arg-type]
        fsdp={"block_classes": ["PairBlock"]},  # type: ignore[arg-type]
    )
    return cfg, section


def main(argv: list[str] | None = None) -> None:
    from gc25d_core.faults import maybe_inject_fault  # noqa: F401  (GC25D_FAULT is read by the loop)

    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--engine", default="fsdp")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ema-start", type=int, default=3)
    args = p.parse_args(argv)
    cfg, section = pair_config(args.engine, args.steps, args.ema_start)
    with process_group("gloo"):
        PairRun(cfg, section, args.run_dir, StdoutReporter()).run()


if __name__ == "__main__":
    main()
