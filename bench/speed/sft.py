"""SFT step time, MFU and peak memory through the real entry point (issue 7), beside the plain stack.

Builds a synthetic processed world at the v10 shapes (latents [48,21,30,52], cond [81,480,832], meta,
index; gc25d_core/train/synthetic.py) and publishes its training cache, then for each variant launches

    torchrun --nproc_per_node=N -m gc25d_core.jobs.sft --config <variant>.yaml --run-dir <dir>

(full Wan2.2-TI2V-5B GcDiT, random init, ZeRO-2 bf16, micro 1 x GA 2 per GPU), and finally
``torchrun bench/baselines/plain_zero2.py 5b <steps>`` (plain DiffSynth WanModel, ZeRO-2, GA 1, full
checkpointing) in the same lease. Prints one JSON object per line; the last is the summary.

MFU per GPU = 3 * (2*P_blocks*s + 4*L*s^2*d + 4*L*s*512*d) * clips_per_gpu_step / step_s / 989e12,
the formula of plain_zero2.py (s = 8190 tokens, P_blocks = parameters under ``blocks.``).

Usage: python3 -m bench.speed.sft --root /tmp/sftb --nproc 2 --steps 20 \\
           --variants nockpt_fused,ckpt4_fused [--plain-steps 10]
       python3 -m bench.speed.sft --tiny --nproc 2 --steps 4   # CPU smoke (tiny preset, gloo)
       python3 -m bench.speed.sft --tiny --nproc 2 --steps 60 --warm 5 --plain-steps 0 \\
           --variants v10,v10+nanfill --repeat 2   # the tiny preset's SFT with and without the NaN fill
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    bench_env,
    dit_flops,
    emit,
    exit_on_failed_runs,
    mfu,
    short_run,
    torchrun,
    torchrun_bench_args,
)

TEXT_LEN = 512
FUSED = {"fused_rmsnorm": True}
ENV = "_env"  # a variant's environment additions (not an sft override)
ENTRY = "_entry"  # a module that runs the job module (its name, then the job's arguments) for a variant
PROFILED_STEPS = 2
COMPILED = {"gradient_checkpointing": False, "compile": True, "overrides": FUSED}  # v10's model (per token)
CTAS_BUCKETS = {"reduce_bucket_size": 200_000_000}
CKPT_1GPU = 10  # of the 30 blocks
# variant name -> sft section overrides (+ ENV)
VARIANTS: dict[str, dict[str, Any]] = {
    "v10": {},  # configs/sft/v10.yaml as it stands
    "ckpt_all": {"model": {"gradient_checkpointing": True}},
    "ckpt_all_fused": {"model": {"gradient_checkpointing": True, "overrides": FUSED}},
    "nockpt_fused": {"model": {"gradient_checkpointing": False, "overrides": FUSED}},
    "ckpt4_fused": {"model": {"gradient_checkpointing": True, "checkpoint_blocks": 4, "overrides": FUSED}},
    "ckpt8_fused": {"model": {"gradient_checkpointing": True, "checkpoint_blocks": 8, "overrides": FUSED}},
    "nockpt_fused_compile": {"model": COMPILED},
    # gradient slices reduced to their owner instead of whole buckets all-reduced
    "nockpt_fused_compile_reduce": {"model": COMPILED, "zero": {"use_multi_rank_bucket_allreduce": False}},
    # NCCL's Simple protocol for every collective (it picked LL for 1 GB buckets, profile of 2026-11-30)
    "nockpt_fused_compile_simple": {"model": COMPILED, ENV: {"NCCL_PROTO": "Simple"}},
    "nockpt_fused_compile_reduce_simple": {
        "model": COMPILED,
        "zero": {"use_multi_rank_bucket_allreduce": False},
        ENV: {"NCCL_PROTO": "Simple"},
    },
    # NCCL limited to 8 CTAs (SMs) per collective, so the overlapped gradient reduction takes fewer SMs
    # from the backward's GEMMs; smaller buckets shorten the reduction left after the last layer
    "nockpt_fused_compile_ctas8": {
        "model": COMPILED,
        "zero": CTAS_BUCKETS,
        ENV: {"NCCL_MAX_CTAS": "8", "NCCL_MAX_NCHANNELS": "8"},
    },
    "nockpt_fused_compile_ctas4": {
        "model": COMPILED,
        "zero": CTAS_BUCKETS,
        ENV: {"NCCL_MAX_CTAS": "4", "NCCL_MAX_NCHANNELS": "4"},
    },
    # the gradient reduction on the compute stream: no SMs shared with the backward's GEMMs, but the
    # ~3 ms per GB of link time is no longer hidden
    "nockpt_fused_compile_nooverlap": {"model": COMPILED, "zero": {"overlap_comm": False}},
    "ckpt4_fused_compile": {
        "model": {"gradient_checkpointing": True, "checkpoint_blocks": 4, "compile": True, "overrides": FUSED}
    },
    # one GPU (issue 15): the v10 preset with the first CKPT_1GPU blocks recomputed, so ZeRO-2's whole
    # optimizer state (fp32 master + Adam, ~75 GiB on one rank) and GA 2's activations fit one H200;
    # through accelerate's DeepSpeedPlugin (the default), and through deepspeed.initialize directly
    "v10_1gpu": {"model": {"gradient_checkpointing": True, "checkpoint_blocks": CKPT_1GPU}},
    "v10_1gpu_direct": {
        "model": {"gradient_checkpointing": True, "checkpoint_blocks": CKPT_1GPU},
        "zero": {"via": "deepspeed"},
    },
}
# variants that are the v10 preset plus their own overrides (the others start from NAMED_BASE)
PRESET_BASED = ("v10", "v10_1gpu", "v10_1gpu_direct")
NAMED_BASE = {"model": {"overrides": {"per_cell_time": False}}, "zero": {"overlap_comm": True}}
# modifiers: a variant name "a+b" is VARIANTS[a] deep-merged with MODIFIERS[b] (e.g. "..._ctas8+fa4")
MODIFIERS: dict[str, dict[str, Any]] = {
    # FlashAttention-4 for the self-attention (optional flash-attn-4 package: bench/suites.py fa4)
    "fa4": {"model": {"attn_backend": "fa4"}},
    # t_mod once per cell, broadcast in the blocks: no [B, L, 6, dim] tensor or per-token time MLP
    "percell": {"model": {"overrides": {"per_cell_time": True}}},
    # more recomputation than CKPT_1GPU (for v10_1gpu*, should that not fit one GPU)
    "ckpt20": {"model": {"gradient_checkpointing": True, "checkpoint_blocks": 20}},
    "ckptall": {"model": {"gradient_checkpointing": True, "checkpoint_blocks": None}},
    # deterministic mode's NaN fill of every new tensor, which set_determinism turns off (the
    # presets with deterministic: true, e.g. --tiny)
    "nanfill": {ENTRY: "bench.probes.with_nan_fill"},
}


def variant(name: str) -> dict[str, Any]:
    """The overrides (and ENV) of ``name``: a VARIANTS entry, then any ``+modifier`` merged on top."""
    from gc25d_core.config import deep_merge

    base, *mods = name.split("+")
    if base not in VARIANTS or any(m not in MODIFIERS for m in mods):
        raise SystemExit(f"unknown variant {name!r}: {sorted(VARIANTS)} with +{sorted(MODIFIERS)}")
    # deep_merge copies, so variants may share their model / zero sections; names other than the
    # PRESET_BASED ones keep the settings they were measured with before the preset turned per-cell
    # modulation on and the overlap off
    out = deep_merge({} if base in PRESET_BASED else NAMED_BASE, VARIANTS[base])
    for m in mods:
        out = deep_merge(out, MODIFIERS[m])
    return out


def build_world(root: Path, tiny: bool, starts: int, steps: int):
    from gc25d_core.train.synthetic import sft_world

    sft = {**short_run(steps, {"every": 10**6, "num_clips": 2}), "model": {"init": "random"}}
    overrides: dict[str, Any] = {}
    if not tiny:
        overrides = {"text": {"table_path": None}, "index": {"drop_lists": []}}
    t0 = time.perf_counter()
    cfg = sft_world(
        root,
        sft,
        preset="tiny" if tiny else "v10",
        starts=tuple(96 * i for i in range(starts)),
        overrides=overrides,
    )
    emit(probe="world", s=time.perf_counter() - t0, root=str(root), clips_per_run=starts)
    return cfg


def block_flops(tiny: bool) -> tuple[float, dict[str, Any]]:
    """Training FLOPs of one clip (forward + backward = 3x forward) by plain_zero2.py's formula."""
    import torch

    from gc25d_core.models.configs import build_gcdit, full_config, tiny_config

    dit = tiny_config() if tiny else full_config()
    with torch.device("meta"):
        model = build_gcdit(dit, device=torch.device("meta"), dtype=torch.bfloat16)
    p_blocks = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    hw = (4, 6) if tiny else (30, 52)
    s = 21 * hw[0] * hw[1] // 4
    return dit_flops(p_blocks, s, dit.dim, dit.num_layers, TEXT_LEN), {"block_params": p_blocks, "tokens": s}


def tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def summarize(
    records: list[dict[str, Any]], warm: int, flops_per_gpu_step: float, key: str
) -> dict[str, Any]:
    steady = [r[key] for r in records[warm:]]
    if not steady:
        return {"steps_measured": 0}
    med, mean = statistics.median(steady), statistics.fmean(steady)
    out = {
        "steps_measured": len(steady),
        "step_s_median": med,
        "step_s_mean": mean,
        "step_s_min": min(steady),
        "mfu_median": mfu(flops_per_gpu_step, med),
        "mfu_mean": mfu(flops_per_gpu_step, mean),
    }
    # the bench's small cache ends an epoch every few steps, and the step that restarts the
    # DataLoader stalls; at v10's 12,800 clips an epoch is 800 steps, so leave those steps out too
    in_epoch = [
        r[key]
        for prev, r in zip(records[warm - 1 : -1], records[warm:], strict=True)
        if prev.get("epoch") == r.get("epoch")
    ]
    if warm > 0 and in_epoch and "epoch" in records[0]:
        med_in = statistics.median(in_epoch)
        out["step_s_median_in_epoch"] = med_in
        out["mfu_median_in_epoch"] = mfu(flops_per_gpu_step, med_in)
    waits = [r["data_wait_s"] for r in records[warm:] if "data_wait_s" in r]
    if waits:  # host seconds per step spent waiting for the DataLoader (the SFT's metrics)
        out["data_wait_s_median"] = statistics.median(waits)
        out["data_wait_s_max"] = max(waits)
        # steps whose micro-batches were ready (< 5 ms of waiting): this small cache restarts its
        # loader every few steps, v10's every 800
        ready = [r[key] for r in records[warm:] if r.get("data_wait_s", 1.0) < 0.005]
        if ready:
            out["step_s_median_loader_ready"] = statistics.median(ready)
            out["mfu_median_loader_ready"] = mfu(flops_per_gpu_step, out["step_s_median_loader_ready"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    torchrun_bench_args(ap, root="/tmp/gc25d_sft_bench", nproc=2, steps=20, warm=4)
    ap.add_argument("--clips-per-run", type=int, default=6)
    ap.add_argument("--variants", default="nockpt_fused")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the variant list this many times, interleaved (A, B, A, B): same-lease drift shows",
    )
    ap.add_argument("--plain-steps", type=int, default=10, help="0: skip plain_zero2.py")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument(
        "--fa4-path",
        default="",
        help="folders put first on PYTHONPATH for the attn_backend=fa4 variants only: flash-attn-4's "
        "top-level package is `flash_attn`, the name DiffSynth probes for FlashAttention-2, so the "
        "plain stack must not see it",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help=f"torch.profiler over {PROFILED_STEPS} extra steps after --steps (left out of the statistics)",
    )
    args = ap.parse_args(argv)

    from gc25d_core.config import write_resolved
    from gc25d_core.train.sft import with_sft

    out = args.out or args.root / "logs"
    out.mkdir(parents=True, exist_ok=True)
    cfg = build_world(args.root, args.tiny, args.clips_per_run, args.steps)
    flops_clip, info = block_flops(args.tiny)
    assert cfg.sft is not None
    clips_per_gpu_step = cfg.sft.micro_batch * cfg.sft.grad_accum
    env = bench_env()
    summary: dict[str, Any] = {
        "probe": "summary",
        "nproc": args.nproc,
        **info,
        "clips_per_gpu_step": clips_per_gpu_step,
    }
    names = [v for v in args.variants.split(",") if v]
    for name in names:
        variant(name)  # unknown names fail before the first run
    by_variant: dict[str, list[float | None]] = {}
    for rep, name in [(r, n) for r in range(1, args.repeat + 1) for n in names]:
        label = name if args.repeat == 1 else f"{name}.r{rep}"
        extra = variant(name)
        venv = {**env, **extra.pop(ENV, {})}
        job = [extra.pop(ENTRY), "gc25d_core.jobs.sft"] if ENTRY in extra else ["gc25d_core.jobs.sft"]
        if args.fa4_path and extra.get("model", {}).get("attn_backend") == "fa4":
            venv["PYTHONPATH"] = os.pathsep.join(x for x in (args.fa4_path, env.get("PYTHONPATH")) if x)
        if args.profile:  # steady-state steps, run after the measured ones
            extra["max_steps"] = args.steps + PROFILED_STEPS
            extra["profile"] = {"start": args.steps + 1, "steps": PROFILED_STEPS}
        vcfg = with_sft(cfg, cfg.sft.model_dump(mode="json"), extra)
        assert vcfg.sft is not None
        config = write_resolved(vcfg, args.root, f"sft_{name}.yaml")
        run_dir = args.root / "runs" / name
        shutil.rmtree(run_dir / "profile", ignore_errors=True)  # no stale profile from an earlier call
        log = out / f"sft_{label}.log"
        rc, wall = torchrun(
            args.nproc,
            ["-m", *job, "--config", str(config), "--run-dir", str(run_dir), "--fresh"],
            log,
            venv,
        )
        metrics = run_dir / "metrics.jsonl"
        records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        records = [r for r in records if r["step"] <= args.steps]  # not the profiled steps
        res = {
            "rc": rc,
            "wall_s": wall,
            **summarize(records, args.warm, flops_clip * clips_per_gpu_step, "step_s"),
            "peak_mem_gib": max((r["peak_mem_gib"] for r in records if "peak_mem_gib" in r), default=None),
            "loss_first_last": [records[0]["loss"], records[-1]["loss"]] if records else None,
        }
        by_variant.setdefault(name, []).append(res.get("step_s_median_in_epoch", res.get("step_s_median")))
        emit(
            probe="sft",
            variant=name,
            repeat=rep,
            engine=vcfg.sft.engine,
            deterministic=vcfg.sft.deterministic,
            nan_fill=len(job) > 1 and vcfg.sft.deterministic,
            zero_via=vcfg.sft.zero.via,
            checkpointing=[vcfg.sft.model.gradient_checkpointing, vcfg.sft.model.checkpoint_blocks],
            **res,
            step_s=[round(r["step_s"], 4) for r in records],
            data_wait_s=[round(r.get("data_wait_s", 0.0), 4) for r in records],
        )
        if rc != 0:
            print(tail(log), flush=True)
        ops = run_dir / "profile" / "ops.txt"
        if ops.is_file():
            (out / f"ops_{label}.txt").write_text(ops.read_text())
            print("\n".join(ops.read_text().splitlines()[:28]), flush=True)
        busy = run_dir / "profile" / "gpu_busy.json"
        if busy.is_file():
            emit(probe="gpu_busy", variant=name, repeat=rep, **json.loads(busy.read_text()))
        summary[f"ours_{label}"] = res
    # per variant: the in-epoch median step of each repeat, and their median
    summary["step_s_in_epoch_by_variant"] = {
        n: {"runs": v, "median": statistics.median([x for x in v if x is not None]) if any(v) else None}
        for n, v in by_variant.items()
    }
    if args.plain_steps > 0:
        log = out / "plain_zero2.log"
        rc, wall = torchrun(
            args.nproc,
            [
                str(ROOT / "bench" / "baselines" / "plain_zero2.py"),
                "tiny" if args.tiny else "5b",
                str(args.plain_steps),
            ],
            log,
            env,
        )
        records = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"zero2_step"' in line:
                records.append(json.loads(line))
        res = {
            "rc": rc,
            "wall_s": wall,
            **summarize(records, min(args.warm, max(len(records) - 1, 0)), flops_clip, "s"),
            "peak_mem_gib": max(
                (r["peak_gib"] for r in records if r.get("peak_gib") is not None), default=None
            ),
            "mfu_reported_median": statistics.median([r["mfu_vs_989"] for r in records[2:]])
            if len(records) > 2 and records[0].get("mfu_vs_989") is not None
            else None,
        }
        emit(probe="plain_zero2", **res, step_s=[round(r["s"], 4) for r in records])
        if rc != 0:
            print(tail(log), flush=True)
        summary["plain_zero2"] = res
    emit(**summary)
    exit_on_failed_runs({name: r["rc"] for name, r in summary.items() if isinstance(r, dict) and "rc" in r})


if __name__ == "__main__":
    main()
