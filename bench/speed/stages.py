"""Stages 1–3 (and the SFT beside them) on one GPU through the real entry points (issues 17, 18, 19).

Builds the synthetic v10-shaped world of sft.py (gc25d_core/train/synthetic.py, with the rollout
extensions stage 3 needs), random causal exports where a stage needs one (stage 2: the full 5B;
stage 3: full width at ``--s3-blocks`` of the 30 blocks), then for each run of ``--runs``

    torchrun --nproc_per_node=N -m bench.speed.stage_timer <stage> --config <run>.yaml --run-dir <dir> --fresh

(bench/speed/stage_timer.py = the job ``python -m gc25d_core.jobs.<stage>`` with each step's phases timed).
Runs (the stage's v10 preset plus short-run cadences, random weights):

    sft        the SFT, v10 preset with 10 of 30 blocks recomputed (sft.py's v10_1gpu)
    s1         stage 1 (teacher forcing, [clean | noisy] = 2 x 21 cells, full causal), SDPA + dense mask
    s1_flex    the same with ``attn_backend: flex`` (compiled flex attention, block-sparse mask)
    s2         stage 2 (teacher fwd, EMA-target fwd, student fwd + bwd; ZeRO-2), SDPA
    s2_flex    the same with flex
    s3         stage 3 (DMD: critic updates on no-grad rollouts, generator update; FSDP) at
               ``--s3-blocks`` blocks, ``time_phases: true``

``+<modifier>`` on a run name: ``+ckpt<N>`` recomputes only the first N blocks, ``+nockpt`` none,
``+overlap`` / ``+nooverlap`` turn ZeRO-2's overlapped gradient reduction on / off (stages 1–2 and
the SFT), ``+fx<name>`` sets flex's kernel options to bench/speed/attention.py's ``FLEX_VARIANTS["flex_<name>"]``,
``+module`` (stage 3) runs every rollout forward on the FSDP module instead of the fast path's replica,
``+perexit`` its generator's exit forwards with grad one per cell (not batched into one forward),
``+batch`` the critic updates' rollouts as one batch, ``+nocompile`` the replica eager, ``+norope``
its KV attention's RoPE rotations eager (its block bodies still compiled),
``+L<N>`` builds N of the 30 blocks at full width (stage 3: instead of ``--s3-blocks``): the per-block
rate with the memory a sharded run leaves (one GPU holds a 5B model's optimizer state only by
recomputing most blocks).

MFU (bench/common.py: 989 TFLOP/s, DiT-block FLOPs 2·P·s + 4·L·pairs·d + 4·L·s·512·d per forward,
×3 with backward; recomputation not counted): ``pairs`` = the query-key pairs the mask allows
(teacher forcing: the block-causal [clean | noisy] mask; stage 3's KV-cache forwards: the cell
against the cells it sees); ``mfu_dense`` counts every pair of the sequence (what SDPA with a dense
mask computes). Stage 2 counts the teacher and target forwards each step made, stage 3 every rollout
forward (the draws of the step), the critic and real scores, and the backward of the exit forwards
that hold the graph.

Usage: python3 -m bench.speed.stages --root /tmp/stb --runs s1,s1_flex,sft,s2 --steps 7 --warm 2
       python3 -m bench.speed.stages --tiny --runs sft,s1,s1_flex,s2,s3 --steps 3 --warm 1   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PEAK_TFLOPS,
    ROOT,
    bench_env,
    emit,
    exit_on_failed_runs,
    forward_flops,
    mfu,
    print_result,
    short_run,
    torchrun,
    torchrun_bench_args,
)

TEXT_LEN = 512
PROFILED_STEPS = 2
STAGE_OF = {"sft": "sft", "s1": "stage1_tf", "s2": "stage2_cd", "s3": "stage3_dmd"}
CKPT_1GPU = 10  # SFT: of the 30 blocks (sft.py's v10_1gpu)


# ------------------------------------------------------------------------------------------ runs

# stage 3's modifiers: +module every rollout forward on the FSDP module (the path before issue 33),
# +perexit the generator's exit forwards one per cell during its rollout (before batched exits),
# +batch the critic updates' rollouts of a step as one batch, +nocompile the replica eager,
# +norope the KV attention's RoPE rotations eager (the replica's body still compiled)
S3_MODIFIERS: dict[str, tuple[str, Any]] = {
    "module": ("rollout_path", "module"),
    "perexit": ("batch_exit_forwards", False),
    "batch": ("batch_critic_rollouts", True),
    "nocompile": ("rollout_compile", False),
    "norope": ("rollout_compile_rope", False),
}
# one small validation at the end (the loop always validates the last step)
STAGE_VAL = {"every": 10**6, "num_clips": 1, "timesteps": [500.0], "at_start": False}


def run_kind(name: str) -> str:
    return name.split("+")[0].partition("_")[0]


def run_layers(name: str, s3_blocks: int) -> int | None:
    """The run's depth: ``+L<N>``, else stage 3's ``--s3-blocks``, else the preset's (None)."""
    for m in name.split("+")[1:]:
        if m.startswith("L") and m[1:].isdigit():
            return int(m[1:])
    return s3_blocks if run_kind(name) == "s3" else None


def run_overrides(name: str, tiny: bool, exports: dict[str, Path], s3_blocks: int) -> dict[str, Any]:
    from gc25d_core.config import deep_merge

    base, *mods = name.split("+")
    kind, _, backend = base.partition("_")
    if kind not in STAGE_OF or backend not in ("", "flex"):
        raise SystemExit(f"unknown run {name!r}: sft, s1, s1_flex, s2, s2_flex, s3 (+ckptN, +nockpt, +LN)")
    layers = run_layers(name, s3_blocks)
    depth = {} if layers is None else {"overrides": {"num_layers": layers}}
    out: dict[str, Any] = {"model": {}}
    if kind == "sft":
        out["model"] = deep_merge({"init": "random"}, depth)
        if not tiny:
            out["model"].update(gradient_checkpointing=True, checkpoint_blocks=CKPT_1GPU)
    elif kind == "s1":
        out["model"] = deep_merge({"init": "random"}, depth)
    elif kind == "s2":
        out["model"] = deep_merge({"init": "export", "export_path": str(exports.get(name, ""))}, depth)
    else:
        out["model"] = deep_merge({"init": "export", "export_path": str(exports.get(name, ""))}, depth)
        out["real"] = deep_merge({"init": "random"}, depth)
        out["time_phases"] = True
    if backend:
        out["model"]["attn_backend"] = backend
    for m in mods:
        if m == "nockpt":
            out["model"]["gradient_checkpointing"] = False
        elif m.startswith("ckpt") and m[4:].isdigit():
            out["model"].update(gradient_checkpointing=True, checkpoint_blocks=int(m[4:]))
        elif m in S3_MODIFIERS:
            field, value = S3_MODIFIERS[m]
            if kind != "s3":
                raise SystemExit(f"+{m} is stage 3's ({field}), not {name!r}'s")
            out[field] = value
        elif m == "mcompile":  # stage 3: the generator, critic and real score's block bodies compiled
            if kind != "s3":
                raise SystemExit(f"+mcompile is stage 3's (model.compile, real.compile), not {name!r}'s")
            out["model"]["compile"] = True
            out["real"]["compile"] = True
        elif m in ("overlap", "nooverlap"):  # ZeRO-2's gradient reduction beside the backward, or after it
            out["zero"] = {"overlap_comm": m == "overlap"}
        elif m.startswith("fx"):  # flex kernel options: attention.py's FLEX_VARIANTS["flex_<name>"]
            from bench.speed.attention import FLEX_VARIANTS

            if f"flex_{m[2:]}" not in FLEX_VARIANTS:
                raise SystemExit(f"unknown flex variant +{m} in {name!r}: {sorted(FLEX_VARIANTS)}")
            out["model"]["flex_options"] = FLEX_VARIANTS[f"flex_{m[2:]}"]
        elif not (m.startswith("L") and m[1:].isdigit()):
            raise SystemExit(f"unknown modifier +{m} in {name!r}")
    return out


def run_config(
    cfg, name: str, steps: int, tiny: bool, exports: dict[str, Path], s3_blocks: int, profile: int = 0
):
    from gc25d_core.config import deep_merge
    from gc25d_core.train.presets import with_stage

    stage = STAGE_OF[run_kind(name)]
    over = deep_merge(short_run(steps, STAGE_VAL), run_overrides(name, tiny, exports, s3_blocks))
    if profile:
        over = deep_merge(
            over,
            {"max_steps": steps + profile, "profile": {"start": steps + 1, "steps": profile}},
        )
    if tiny and stage == "stage3_dmd":
        over = deep_merge(over, {"critic_steps": 2})
    return stage, with_stage(cfg, stage, "tiny" if tiny else "v10", over)


# ------------------------------------------------------------------------------------------ world


def build_world(root: Path, tiny: bool, starts: int):
    from gc25d_core.train.synthetic import sft_world

    if (root / "world.json").is_file():  # built earlier in this lease (same folder)
        from gc25d_core.config import config_from_yaml

        emit(probe="world", reused=True, root=str(root))
        return config_from_yaml(root / "world.yaml")
    overrides: dict[str, Any] = {} if tiny else {"text": {"table_path": None}, "index": {"drop_lists": []}}
    t0 = time.perf_counter()
    cfg = sft_world(
        root,
        short_run(4, STAGE_VAL),
        preset="tiny" if tiny else "v10",
        starts=tuple(96 * i for i in range(starts)),
        overrides=overrides,
        ext=True,  # stage 3's rollouts read the extension's ids and prompts
    )
    from gc25d_core.config import write_resolved

    write_resolved(cfg, root, "world.yaml")
    (root / "world.json").write_text(json.dumps({"starts": starts}))
    emit(probe="world", s=time.perf_counter() - t0, root=str(root), clips=5 * starts)
    return cfg


def dit_of(cfg, tiny: bool, layers: int | None = None):
    from gc25d_core.models.configs import full_config, tiny_config

    make = tiny_config if tiny else full_config
    return make(vocab=cfg.vocab, **({} if layers is None else {"num_layers": layers}))


def export_specs(names: list[str], tiny: bool, s3_blocks: int) -> dict[str, tuple[str, int | None]]:
    """run name -> (export name, layers) of the exports the runs start from (stages 2 and 3)."""
    specs: dict[str, tuple[str, int | None]] = {}
    for n in names:
        kind, layers = run_kind(n), run_layers(n, s3_blocks)
        if kind in ("s2", "s3"):
            specs[n] = (f"{kind}_{'full' if layers is None else f'{layers}blocks'}", layers)
    return specs


def export_path(root: Path, name: str) -> Path:
    return root / "exports" / f"{name}.safetensors"


def make_export(root: Path, name: str, dit) -> Path:
    """A seeded random causal export (deploy attention and axis), built on the GPU where there is one."""
    import torch

    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.models.configs import DEPLOY_CAUSAL, build_gcdit
    from gc25d_core.models.export import save_export

    path = export_path(root, name)
    if path.is_file():
        return path
    t0 = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = build_gcdit(dit, device=dev, dtype=torch.bfloat16 if dev == "cuda" else None)
    save_export(path, model, data="codeworld", causal=DEPLOY_CAUSAL, denoise_axis=DEPLOY_AXIS.timesteps)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    emit(
        probe="export",
        name=name,
        s=time.perf_counter() - t0,
        layers=dit.num_layers,
        gib=path.stat().st_size / 2**30,
    )
    return path


# ------------------------------------------------------------------------------------------ FLOPs


class Flops:
    """DiT-block FLOPs of one run's model (meta build: parameter count under ``blocks.``)."""

    def __init__(self, dit, shapes, deploy, tf_causal):
        import torch

        from gc25d_core.models.causal import group_mask
        from gc25d_core.models.configs import CausalConfig, build_gcdit

        model = build_gcdit(dit, device=torch.device("meta"))
        self.p_blocks = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
        self.p_total = sum(p.numel() for p in model.parameters())
        self.dim, self.layers = dit.dim, dit.num_layers
        _, cells, h, w = shapes.latent
        self.cells, self.tpc = cells, (h // 2) * (w // 2)
        self.tf_groups = int(group_mask(cells, tf_causal, teacher_forcing=True).sum())
        self.deploy = CausalConfig(sink=deploy.sink, window=deploy.window, rope_cap=deploy.rope_cap)

    def fwd(self, tokens: int, pairs: float | None = None) -> float:
        return forward_flops(self.p_blocks, tokens, self.dim, self.layers, TEXT_LEN, pairs)

    # one clip of ``cells`` cells, bidirectional (SFT, the stage-3 scores)
    def full(self, cells: int | None = None) -> float:
        return self.fwd((cells or self.cells) * self.tpc)

    # teacher forcing over [clean | noisy]: allowed pairs, and every pair (dense mask)
    def tf(self, dense: bool = False) -> float:
        s = 2 * self.cells * self.tpc
        return self.fwd(s, None if dense else self.tf_groups * self.tpc**2)

    def kv(self, q_cell: int) -> float:
        """A KV-cache forward of cell ``q_cell`` (one cell's tokens against the cells it sees + itself)."""
        import torch

        from gc25d_core.models.causal import visible

        seen = int(visible(q_cell, torch.arange(q_cell), self.deploy).sum()) if q_cell else 0
        return self.fwd(self.tpc, self.tpc**2 * (seen + 1))

    def rollout(self, cells: int, exit_step: int) -> float:
        """Forward FLOPs of a rollout (prefill, exit_step + 1 denoise forwards + a commit per cell)."""
        return self.kv(0) + sum((exit_step + 2) * self.kv(q) for q in range(1, cells))

    def stage3_step(
        self, draws: list[tuple[int, int]], horizon: int, batched_exits: bool
    ) -> dict[str, float]:
        """One DMD step's FLOPs by part, from its draws (the critic updates' (cells, exit step), then
        the generator's): the no-grad rollouts, the critic updates (forward + backward over the
        scored clip), the generator's exits (the backward of its last ``horizon`` cells' exit
        forwards; with ``batched_exits`` also the training module's forward over those cells, which
        the replica ran too) and its two scores."""
        scored = self.full(1 + horizon)
        c_g = draws[-1][0]
        exits = sum(self.kv(q) for q in range(max(1, c_g - horizon), c_g))
        parts = {
            "rollouts": sum(self.rollout(c, e) for c, e in draws),
            "critic_updates": (len(draws) - 1) * 3 * scored,
            "generator_exits": (3 if batched_exits else 2) * exits,
            "generator_scores": 2 * scored,
        }
        return {**parts, "total": sum(parts.values())}


# ------------------------------------------------------------------------------------------ results


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(name: str, stage: str, run_dir: Path, warm: int, steps: int, fl: Flops, sec) -> dict[str, Any]:
    mpath, ppath = run_dir / "metrics.jsonl", run_dir / "phases.jsonl"
    metrics = [json.loads(x) for x in mpath.read_text().splitlines()] if mpath.is_file() else []
    phases = [json.loads(x) for x in ppath.read_text().splitlines()] if ppath.is_file() else []
    metrics = [r for r in metrics if r["step"] <= steps]
    phases = [r for r in phases if r["step"] <= steps]
    steady_m, steady_p = metrics[warm:], phases[warm:]
    out: dict[str, Any] = {
        "steps_measured": len(steady_m),
        "step_s": [round(r["step_s"], 4) for r in metrics],
        "peak_mem_gib": max((r.get("peak_mem_gib", 0.0) for r in metrics), default=None),
        "mem_start_gib": [round(r["mem_start_gib"], 2) for r in phases],
    }
    if not steady_m:
        return out
    step_med = med([r["step_s"] for r in steady_m])
    out["step_s_median"] = step_med
    out["step_s_min"] = min(r["step_s"] for r in steady_m)
    # in-epoch: leave out the steps whose data loader restarted (this small cache's epochs)
    in_epoch = [
        r["step_s"]
        for p, r in zip(metrics[warm - 1 : -1], steady_m, strict=False)
        if p.get("epoch") == r.get("epoch")
    ]
    if warm > 0 and in_epoch and len(in_epoch) < len(steady_m):
        out["step_s_median_in_epoch"] = med(in_epoch)
    keys = sorted({k for r in steady_p for k in r["s"]})
    out["phase_s_median"] = {k: med([r["s"].get(k, 0.0) for r in steady_p]) for k in keys}
    out["phase_n"] = {k: [r["n"].get(k, 0) for r in steady_p] for k in keys}
    ga = sec.grad_accum * sec.micro_batch
    if stage == "sft":
        per_step = [3 * fl.full() * ga for _ in steady_p]
    elif stage == "stage1_tf":
        per_step = [3 * fl.tf() for _ in steady_p]
        out["mfu_dense_median"] = mfu(3 * fl.tf(dense=True), step_med)
    elif stage == "stage2_cd":
        per_step = [(3 + r["n"].get("teacher_fwd", 0) + r["n"].get("ema_fwd", 0)) * fl.tf() for r in steady_p]
        p = out["phase_s_median"]
        split = []
        for r in steady_p:
            s = r["s"]
            fwd_other = s.get("teacher_fwd", 0.0) + s.get("ema_fwd", 0.0)
            split.append((s["micro_loss"] - fwd_other, r["step_s"] - s["micro_loss"]))
        out["student_fwd_s_median"] = med([a for a, _ in split])
        out["student_bwd_opt_s_median"] = med([b for _, b in split])
        out["teacher_fwd_s_per_call"] = p.get("teacher_fwd", 0.0) / max(
            1, med(out["phase_n"].get("teacher_fwd", [1]))
        )
        ema_calls = [(r["s"].get("ema_fwd", 0.0), r["n"].get("ema_fwd", 0)) for r in steady_p]
        with_ema = [s for s, n in ema_calls if n]
        out["ema_fwd_s_per_call"] = med(with_ema)
        out["steps_with_ema_fwd"] = sum(1 for _, n in ema_calls if n)
        out["mfu_dense_median"] = mfu(
            statistics.median(
                [
                    (3 + r["n"].get("teacher_fwd", 0) + r["n"].get("ema_fwd", 0)) * fl.tf(dense=True)
                    for r in steady_p
                ]
            ),
            step_med,
        )
    else:  # stage 3
        k = sec.grad_horizon
        per_step, roll_f, roll_s = [], [], []
        batched = sec.rollout_path == "fast" and sec.batch_exit_forwards
        for r in steady_p:
            step_flops = fl.stage3_step([(c, e) for c, e in r["draws"]], k, batched)
            per_step.append(step_flops["total"])
            roll_f.append(step_flops["rollouts"])
            roll_s.append(r["s"].get("rollout_nograd", 0.0) + r["s"].get("rollout_grad", 0.0))
        s = [r["s"] for r in steady_p]
        out["rollout_s_median"] = med(roll_s)
        out["rollout_forward_mfu_median"] = med(
            [mfu(f, t) for f, t in zip(roll_f, roll_s, strict=True) if t > 0]
        )
        # the rollouts' share of the step's FLOPs is their share of its time at equal efficiency:
        # a time share above it says the rollouts run less efficiently than the updates
        out["rollout_flop_share_median"] = med([f / p for f, p in zip(roll_f, per_step, strict=True)])
        out["rollout_time_share_median"] = med(
            [t / r["step_s"] for t, r in zip(roll_s, steady_p, strict=True) if r["step_s"] > 0]
        )
        out["updates_mfu_median"] = med(
            [
                mfu(p - f, r["step_s"] - t)
                for p, f, t, r in zip(per_step, roll_f, roll_s, steady_p, strict=True)
                if r["step_s"] > t
            ]
        )
        out["critic_updates_s_median"] = med(
            [x.get("critic_step", 0.0) + x.get("critic_prefetch", 0.0) for x in s]
        )
        out["critic_updates_ex_rollout_s_median"] = med(
            [
                x.get("critic_step", 0.0) + x.get("critic_prefetch", 0.0) - x.get("rollout_nograd", 0.0)
                for x in s
            ]
        )
        out["generator_update_s_median"] = med([x.get("generator_step", 0.0) for x in s])
        out["generator_update_ex_rollout_s_median"] = med(
            [x.get("generator_step", 0.0) - x.get("rollout_grad", 0.0) for x in s]
        )
        # the generator's exit forwards that carry gradients (fast path: timed apart, on the training
        # module): the rollout without them is the no-grad work the replica runs
        out["exit_fwd_grad_s_median"] = med([x.get("exit_fwd_grad", 0.0) for x in s])
        out["rollout_nograd_work_s_median"] = med(
            [
                x.get("rollout_nograd", 0.0) + x.get("rollout_grad", 0.0) - x.get("exit_fwd_grad", 0.0)
                for x in s
            ]
        )
        out["critic_s_median_stage"] = med([r.get("critic_s", 0.0) for r in steady_m])
        out["generator_s_median_stage"] = med([r.get("generator_s", 0.0) for r in steady_m])
        out["draws"] = [r["draws"] for r in steady_p]
        out["rollout_gather_s_median"] = med([r.get("rollout_gather_s", 0.0) for r in steady_m])
        # every step's losses: two runs of the same draws (fast / +module rollouts) compare here
        out["losses"] = [[r.get("critic_loss"), r.get("gen_loss")] for r in metrics]
    flops_med = statistics.median(per_step) if per_step else 0.0
    out["flops_per_step"] = flops_med
    out["mfu_median"] = mfu(flops_med, step_med)
    out["mfu_per_step_median"] = med([mfu(f, r["step_s"]) for f, r in zip(per_step, steady_p, strict=True)])
    return out


def stage3_flop_split(draws: str, blocks: int) -> dict[str, Any]:
    """Stage 3's FLOPs of one step by part at the v10 preset's width and ``blocks`` blocks, and the
    rollouts' share: what their share of the step's time is where they run as efficiently as the
    updates (issue 33's rollout share, against this floor)."""
    from gc25d_core.config import load_config
    from gc25d_core.layout import Shapes
    from gc25d_core.models.configs import FULL_CAUSAL
    from gc25d_core.train.presets import with_stage

    cfg = with_stage(load_config("v10"), "stage3_dmd", "v10")
    sec = cfg.stage3_dmd
    pairs = [tuple(int(x) for x in d.split("/")) for d in draws.split(",")]
    if len(pairs) != sec.critic_steps + 1 or any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--flops: {sec.critic_steps} critic draws then the generator's, each CELLS/EXIT")
    fl = Flops(dit_of(cfg, False, blocks), Shapes.of(cfg), sec.deploy, FULL_CAUSAL)
    split = fl.stage3_step([(c, e) for c, e in pairs], sec.grad_horizon, sec.batch_exit_forwards)
    return {
        "probe": "stage3_flop_split",
        "blocks": blocks,
        "draws": pairs,
        "tflop": {k: round(v / 1e12, 1) for k, v in split.items()},
        "rollout_flop_share": split["rollouts"] / split["total"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    torchrun_bench_args(ap, root="/tmp/gc25d_stage_bench", nproc=1, steps=7, warm=2)
    ap.add_argument("--clips-per-run", type=int, default=4, help="world size: 5 runs x this many clips")
    ap.add_argument("--runs", default="s1,s1_flex,sft,s2")
    ap.add_argument("--s3-blocks", type=int, default=10, help="stage 3's depth (of the 30 blocks)")
    ap.add_argument("--s3-steps", type=int, default=None, help="stage 3's steps (default --steps)")
    ap.add_argument("--timeout", type=int, default=420, help="seconds per run")
    ap.add_argument("--profile", default="", help="comma list of runs profiled over extra steps")
    ap.add_argument("--profile-steps", type=int, default=PROFILED_STEPS, help="how many (default 2)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--exports-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--flops",
        default=None,
        metavar="C/E,...",
        help="print stage 3's FLOP split of one step at --s3-blocks (v10 preset) for these draws "
        "(cells/exit step of each critic update, then the generator's; e.g. 27/3,21/3,27/2,27/2,22/2,21/1) and exit",
    )
    args = ap.parse_args(argv)
    if args.flops is not None:
        print_result(stage3_flop_split(args.flops, args.s3_blocks), None)
        return

    from gc25d_core.config import write_resolved
    from gc25d_core.layout import Shapes
    from gc25d_core.models.configs import FULL_CAUSAL
    from gc25d_core.stage_config import CausalStageConfig, DeployCausalConfig
    from gc25d_core.train.causal_run import train_causal

    names = [n for n in args.runs.split(",") if n]
    profiled = {n for n in args.profile.split(",") if n}
    s3_blocks = min(args.s3_blocks, 2) if args.tiny else args.s3_blocks
    specs = export_specs(names, args.tiny, s3_blocks)
    if args.exports_only:  # the subprocess below: the exports, on the GPU, then exit
        from gc25d_core.config import load_config

        vocab_cfg = load_config("tiny" if args.tiny else "v10")
        for name, layers in dict(specs.values()).items():
            make_export(args.root, name, dit_of(vocab_cfg, args.tiny, layers))
        return
    for n in names:
        run_overrides(n, args.tiny, {}, s3_blocks)  # unknown names fail first
    if not (args.root / "world.json").is_file():
        shutil.rmtree(args.root, ignore_errors=True)
    prep = None
    if any(not export_path(args.root, n).is_file() for n, _ in specs.values()):
        # the exports (GPU build + a 10 GB write) beside the world (CPU)
        prep = subprocess.Popen(
            [sys.executable, "-m", "bench.speed.stages", "--exports-only", *sys.argv[1:]], cwd=ROOT
        )
    cfg = build_world(args.root, args.tiny, args.clips_per_run)
    if prep is not None and prep.wait() != 0:
        raise SystemExit("building the exports failed")
    out = args.out or args.root / "logs"
    out.mkdir(parents=True, exist_ok=True)
    env = bench_env()
    shapes = Shapes.of(cfg)
    summary: dict[str, Any] = {"probe": "summary", "peak_tflops": PEAK_TFLOPS}
    for name in names:
        kind = run_kind(name)
        exports = {k: export_path(args.root, n) for k, (n, _) in specs.items()}
        steps = args.s3_steps if (kind == "s3" and args.s3_steps) else args.steps
        stage, rcfg = run_config(
            cfg, name, steps, args.tiny, exports, s3_blocks, args.profile_steps if name in profiled else 0
        )
        sec = getattr(rcfg, stage)
        config = write_resolved(rcfg, args.root, f"{name}.yaml")
        run_dir = args.root / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        log = out / f"{name}.log"
        rc, wall = torchrun(
            args.nproc,
            [
                "-m",
                "bench.speed.stage_timer",
                stage,
                "--config",
                str(config),
                "--run-dir",
                str(run_dir),
                "--fresh",
            ],
            log,
            env,
            args.timeout,
        )
        layers = run_layers(name, s3_blocks)
        causal = isinstance(sec, CausalStageConfig)
        fl = Flops(
            dit_of(cfg, args.tiny, layers),
            shapes,
            sec.deploy if causal else DeployCausalConfig(),
            train_causal(sec) if causal else FULL_CAUSAL,
        )
        res = {
            "rc": rc,
            "wall_s": round(wall, 1),
            "stage": stage,
            "layers": fl.layers,
            "block_params": fl.p_blocks,
            "params": fl.p_total,
            "checkpointing": [sec.model.gradient_checkpointing, sec.model.checkpoint_blocks],
            "attn_backend": sec.model.attn_backend,
            **summarize(name, stage, run_dir, args.warm, steps, fl, sec),
        }
        prof = run_dir / "profile"
        if (prof / "gpu_busy.json").is_file():  # the profiled steps: busy fraction, time per kind
            busy = json.loads((prof / "gpu_busy.json").read_text())
            res["profile"] = {
                k: busy[k] for k in ("busy_frac", "gaps_s", "per_step_by_kind", "phases") if k in busy
            }
        emit(probe="run", run=name, **res)
        if rc != 0:
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]), flush=True)
        for f in ("ops.txt", "gpu_busy.json"):
            if (prof / f).is_file():
                shutil.copy(prof / f, out / f"{name}_{f}")
        if (prof / "ops.txt").is_file():
            print("\n".join((prof / "ops.txt").read_text().splitlines()[:24]), flush=True)
        summary[name] = {k: v for k, v in res.items() if k not in ("draws", "step_s", "phase_n")}
    emit(**summary)
    exit_on_failed_runs({name: r["rc"] for name, r in summary.items() if isinstance(r, dict) and "rc" in r})


if __name__ == "__main__":
    main()
