"""Deploy speed: the live loop a player runs, and (``--mode steady``) the steady-state cell alone.
Prints one JSON object.

``--mode loop`` (the default) measures what a player gets: a session (gc25d_core.deploy.session:
the code world stepped by an action stream of varied actions, its ids on the device, 4 denoise
steps + commit, the streaming VAE decode, the frames on the host ready to send) from its first
cell, per lever in the same run, the exact path first (the oracle):
  load        weights built (random, the real classes) — once, ``load_s``
  warmup_s    the runtime and world built, frame 0 rendered and encoded (LiveSession.prepare: frame 0, the world's compile)
  start_s     session start: the anchor prefilled (and decoded)
  first_frame_s  session start → the first generated frame on the host
  cell_s      per-cell wall of every cell from cell 1 (p50 / p90 / p99 / max, cells over 0.25 s):
              from the previous cell's frames on the host to this one's (cell 1: from its step)
  parts_s     a second session with per-part synchronised timing: world (sim + ids on the device),
              upload, denoise, commit, decode, host — each p50 / p90 / p99 / max
  vs_exact    max |x0 - x0_exact| over every cell (same seed, same actions)
  world_check the world's ids vs the numpy reference renderer (``deploy.world.reference_ids``)

``--mode steady``: one live cell at steady state with a full window (sink 3 + 16 cached + the
current cell), random ids, the code world measured apart (``world``):
  e2e       per-cell wall to the cell's frames on the host (decode on, no per-forward syncs)
  parts     per-forward synchronised: denoise forwards, commit, decode, host (Python) time
  denoise   per-cell wall with decode off: denoise-only throughput
  first     first-frame latency: anchor encode + prefill + first cell + its decode, cold session
  exact     max |x0 - x0_exact| over every cell (same seed, ids, prompts)

``--mode serve``: action-to-photon through the play server (``web.create_app``, the code
``python -m gc25d_core.deploy serve`` runs, served by uvicorn on 127.0.0.1 around a session of
``--serve-lever`` on this bench's weights); a WebSocket client (``ws_latency``) sends ``--events``
key events at a human rate and times each to the arrival of the frame the server tagged as the
first to reflect it (p50 / p90 / p99 / max). ``--url ws://host:port/ws`` measures a running
``serve`` instead (a real export). ``--mode loop --events N`` adds it to the loop run.

Random weights of the real classes (full: Wan2.2-TI2V-5B GcDiT bf16 + the full VAE38; tiny: the CPU
test models), the real runtime (gc25d_core.deploy.runtime.DeployRuntime: the code a session runs).
Levers: compile (fused RMSNorm + torch.compile'd blocks), fold (commit folded into the next cell's
first forward), defer (the commit run after the cell's decode, not waited for), vae_bf16_stream (bf16 decode on a second CUDA stream), cudagraphs (compile mode
reduce-overhead), best (compile + fold + vae_bf16_stream), static (preallocated KV), graphs (CUDA
graphs of the forwards), graphs_vae (graphs + bf16 lean decode: --cuda-graphs --fast-decode),
graphs_all (that + the decode's CUDA graph), graphs_all_defer (that + the commit run after the
decode, not waited for), graphs_all_cstream (graphs_all_defer with the commit on a second stream
beside the decode: the CLI's default on CUDA), graphs_all_fold (graphs_all with the commit
folded into the next cell's first forward, graphed per fill level), graphs_all_defer_stream
(graphs_all_defer + the side-stream decode: the page's switch on), graphs_vae_stream (graphs_vae, decode on the side stream), ... A lever
that fails
records its error. Real time is <= 0.25 s per cell (16 fps), the goal <= 0.125 s.

    python -m bench.speed.deploy --device cuda --dims full                   # the H200 live loop (< 9 min)
    python -m bench.speed.deploy --device cuda --dims full --mode steady     # steady-state cell, all levers
    python -m bench.speed.deploy --device cpu --dims tiny --cells 8 --parts 3 # CPU smoke
    python -m bench.speed.deploy --device cuda --dims full --mode serve --events 60   # action-to-photon
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bench.common import DeviceBench, print_result
from gc25d_core.deploy.world import varied_blocks

LEVERS = (
    "exact",
    "compile",
    "fold",
    "defer",
    "vae_bf16_stream",
    "cudagraphs",
    "best",
    "static",
    "graphs",
    "graphs_vae",
    "graphs_vae_stream",
    "graphs_fast",
    "graphs_all",
    "graphs_all_stream",
    "graphs_all_defer",
    "graphs_all_defer_stream",
    "graphs_all_cstream",
    "graphs_all_cstream_compile",
    "graphs_all_fold",
    "graphs_compile",
    "graphs_all_fp8",
    "graphs_fastdec",
    "graphs_all_cstream_compile_fastdec",
    "graphs_all_cstream_compile_fp8",
    "graphs_all_cstream_compile_fastdec_fp8",
    "graphs_all_cstream_compile_fastdec_fp8_fa4kv",
    "graphs_all_cstream_compile_norope",
    "graphs_all_cstream_compile_fastdec_fp8_norope",
)
# inductor on a CPU costs minutes of C++ builds, and CUDA graphs need CUDA: the rest are opt-in there
CPU_LEVERS = ("exact", "fold", "defer", "vae_bf16_stream", "static")
CUDA_ONLY = set(LEVERS) - set(CPU_LEVERS)
# the live loop's default comparison: the exact path, the CLI's fast path (graphs_all_cstream_compile),
# it without the compile (graphs_all_cstream: the exact latents), the deferred commit on the one
# stream (graphs_all_defer), the
# former one (graphs_all: the commit before the decode), that with the commit folded into the next
# cell's first forward under the graphs, and the CLI's path with the page's side-stream decode on
LOOP_LEVERS = (
    "exact",
    "graphs_all_cstream_compile",
    "graphs_all_cstream",
    "graphs_all_defer",
    "graphs_all_fold",
    "graphs_all",
    "graphs_all_defer_stream",
)
BUDGET_S = 0.25  # one cell = 4 frames at 16 fps


def tail_stats(xs: list[float]) -> dict[str, float] | None:
    """p50 / p90 / p99 / max / mean of every value (the max is the real-time verdict)."""
    if not xs:
        return None
    a = np.asarray(xs, np.float64)
    return {
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "n": len(xs),
        "over_budget": int((a > BUDGET_S).sum()),
    }


def lever_options(name: str, cuda: bool) -> dict[str, Any]:
    stream = {"decode_dtype": "bf16", "decode_stream": cuda}
    graphs_all = {"cuda_graphs": True, "decode_fast": True, "decode_graph": True, "decode_dtype": "bf16"}
    cstream = {**graphs_all, "defer_commit": True, "commit_stream": True}
    # the CLI's --compile: the block bodies, the full-window key rotation, the rest of the RoPE work
    compiled = {"compile": True, "rotate_compile": True, "rope_compile": True}
    options: dict[str, dict[str, Any]] = {
        "exact": {},
        "compile": {"compile": True, "fused_rmsnorm": True},
        "fold": {"fold_commit": True},
        "defer": {"defer_commit": True},
        "vae_bf16_stream": stream,
        "cudagraphs": {"compile": True, "fused_rmsnorm": True, "compile_mode": "reduce-overhead"},
        "best": {"compile": True, "fused_rmsnorm": True, "fold_commit": True, **stream},
        "static": {"static_kv": True},
        "graphs": {"cuda_graphs": True},
        "graphs_vae": {"cuda_graphs": True, "decode_dtype": "bf16", "decode_fast": True},
        "graphs_vae_stream": {"cuda_graphs": True, "decode_fast": True, **stream},
        "graphs_fast": {"cuda_graphs": True, "rotate_compile": True, "decode_fast": True, **stream},
        "graphs_all": graphs_all,
        "graphs_compile": {
            "cuda_graphs": True,
            "compile": True,
            "rotate_compile": True,
            "decode_fast": True,
            **stream,
        },
        "graphs_all_stream": {"cuda_graphs": True, "decode_fast": True, "decode_graph": True, **stream},
        "graphs_all_defer": {**graphs_all, "defer_commit": True},
        "graphs_all_cstream": cstream,
        "graphs_all_fold": {**graphs_all, "fold_commit": True},
        "graphs_all_defer_stream": {
            "cuda_graphs": True,
            "decode_fast": True,
            "decode_graph": True,
            "defer_commit": True,
            **stream,
        },
        # the CLI's path with the block bodies compiled (attention eager: one compile for every
        # fill level), the full-window key rotation as one compiled kernel and the other rotations
        # compiled (the query cell's q/k, the filling window's keys)
        "graphs_all_cstream_compile": {**cstream, **compiled},
        # issue 34: graphs_all with FP8 GEMMs in the blocks (models.fp8, on a copy of the bench's
        # model), and graphs with the fast decoder (random weights: its speed, not its picture)
        "graphs_all_fp8": {**graphs_all, "fp8": True},
        # FP8 with its activation quantisation fused by the compile (eager, it cost more than it saved)
        "graphs_all_cstream_compile_fp8": {**cstream, **compiled, "fp8": True},
        "graphs_fastdec": {"cuda_graphs": True, "decode_dtype": "bf16", "decoder": "fast"},
        # the CLI's path with the fast decoder (--decoder fast) in place of the VAE
        "graphs_all_cstream_compile_fastdec": {
            "cuda_graphs": True,
            "decode_dtype": "bf16",
            "decoder": "fast",
            "defer_commit": True,
            "commit_stream": True,
            **compiled,
        },
    }
    # the CLI's default on an H200 at the 5B's width with torchao and a fast decoder that earned
    # the default (--decoder auto, --fp8 auto), flash-attn-4 not installed: both levers together
    options["graphs_all_cstream_compile_fastdec_fp8"] = {
        **options["graphs_all_cstream_compile_fastdec"],
        "fp8": True,
    }
    # that with FlashAttention-4 over the static KV buffers: the CLI's default where flash-attn-4
    # is installed (--kv-attention auto; bench.suites deploy-fa4 puts it on the path)
    options["graphs_all_cstream_compile_fastdec_fp8_fa4kv"] = {
        **options["graphs_all_cstream_compile_fastdec_fp8"],
        "kv_attention": "fa4",
    }
    # the CLI's paths with the KV attention's RoPE work eager but the full window's key rotation
    # (rope_compile off: the CLI's default before 2026-12-07)
    for base in ("graphs_all_cstream_compile_fastdec_fp8", "graphs_all_cstream_compile"):
        options[f"{base}_norope"] = {**options[base], "rope_compile": False}
    return options[name]


def reset_model(model: Any) -> None:
    """Back to the eager reference body and norms (a lever's switches do not leak into the next)."""
    for block in model.blocks:
        block.__dict__.pop("body", None)
    model.use_fused_rmsnorm(False)
    torch._dynamo.reset()


def stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return {
        "median": statistics.median(s),
        "mean": statistics.fmean(s),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "min": s[0],
        "n": len(s),
    }


def runtime_counters(rt: Any) -> dict[str, Any]:
    """What a runtime reports of its graphs (replays, why they turned off) and its notes."""
    out: dict[str, Any] = {"decode_graph_replays": rt.decoder.replays}
    if rt.graphed is not None:
        out["graph_replays"] = rt.graphed.replays
        out["graphs_disabled"] = rt.graphed.disabled
    if rt.decoder.graph_disabled:
        out["decode_graph_disabled"] = rt.decoder.graph_disabled
    if rt.notes:
        out["notes"] = rt.notes
    return out


class Bench(DeviceBench):
    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        from gc25d_core.flow import DEPLOY_AXIS
        from gc25d_core.models.configs import DEPLOY_CAUSAL, full_config, tiny_config
        from gc25d_core.models.export import ExportMeta
        from gc25d_core.models.gcdit import GcDiT
        from gc25d_core.models.vae import build_vae
        from gc25d_core.text import text_data
        from gc25d_core.vocab import valid_raw_ids

        full = args.dims == "full"
        self.cfg = full_config() if full else tiny_config()
        self.hw = (30, 52) if full else (4, 8)
        t0 = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(self.dev):
            self.model = GcDiT(self.cfg).to(torch.bfloat16 if self.cuda else torch.float32).eval()
        self.model.requires_grad_(False)
        self.model.check_sem_ids = False
        self.vae = build_vae(tiny=not full, device="cpu").to(self.dev).requires_grad_(False)
        self.build_s = time.perf_counter() - t0
        self.meta = ExportMeta(
            vocab="parts", dit_config=self.cfg, causal=DEPLOY_CAUSAL, denoise_axis=DEPLOY_AXIS.timesteps
        )
        g = torch.Generator().manual_seed(0)
        self.keys = list(text_data().keys)
        text_len = 512 if full else 16
        self.table = {
            k: torch.randn(text_len, self.cfg.text_dim, generator=g).to(torch.bfloat16) for k in self.keys
        }
        values = torch.tensor(valid_raw_ids("parts"), dtype=torch.uint8)
        px = (self.hw[0] * 16, self.hw[1] * 16)
        self.ids_pool = [
            values[torch.randint(0, len(values), (4, *px), generator=g)].numpy() for _ in range(3)
        ]
        self.anchor_rgb = torch.randint(0, 256, (1, *px, 3), generator=g, dtype=torch.uint8).numpy()
        self.exact: list[torch.Tensor] = []
        self.exact_frames: list[np.ndarray] = []  # the reference lever's frames, one array per cell
        from gc25d_core.codeworld.presets import FULL_GEOMETRY, TINY_GEOMETRY

        self.geo = FULL_GEOMETRY if full else TINY_GEOMETRY
        assert self.geo.latent_hw == self.hw
        self.blocks = varied_blocks(args.cells, seed=args.action_seed)
        self.world_ids: list[np.ndarray] = []

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def runtime(self, cls: Any, opts: Any) -> Any:
        """The lever's runtime on the bench's model; FP8 converts a copy (in place, for good)."""
        import copy

        from gc25d_core.models.fast_decoder import FastDecoder

        model = copy.deepcopy(self.model) if opts.fp8 else self.model
        fast = FastDecoder().to(self.dev) if opts.decoder == "fast" else None
        return cls(model, self.meta, self.table, self.vae, opts, fast_decoder=fast)

    def compare(self, latents: list[torch.Tensor], frames: list[np.ndarray]) -> dict[str, Any]:
        """This lever's cells against the reference lever's (``--reference``, same seed and
        actions): max |x0 diff|, per-cell latent RMSE and decoded-frame PSNR (uint8, dB)."""
        from gc25d_core.models.fast_decoder import psnr

        n = min(len(self.exact), len(latents))
        pairs = list(zip(self.exact[:n], latents[:n], strict=True))
        diff = max(float((x - y).abs().max()) for x, y in pairs)
        scale = max(float(x.abs().max()) for x in self.exact[:n])
        rmse = [float((x - y).pow(2).mean().sqrt()) for x, y in pairs]
        rms = statistics.fmean(float(x.pow(2).mean().sqrt()) for x in self.exact[:n])
        out: dict[str, Any] = {
            "reference": self.args.reference,
            "cells": n,
            "max_abs_diff": diff,
            "rel": diff / max(scale, 1e-12),
            "latent_rmse": {"mean": statistics.fmean(rmse), "max": max(rmse), "ref_rms": rms},
        }
        m = min(len(self.exact_frames), len(frames))
        if m:
            p = [psnr(a, b) for a, b in zip(self.exact_frames[:m], frames[:m], strict=True)]
            finite = [x for x in p if x != float("inf")]
            out["frame_psnr_db"] = {
                "cells": m,
                "identical_cells": len(p) - len(finite),
                "mean": statistics.fmean(finite) if finite else float("inf"),
                "p50": statistics.median(p),
                "min": min(p),
            }
        return out

    def cell_inputs(self, cell: int) -> tuple[np.ndarray, str]:
        return self.ids_pool[cell % len(self.ids_pool)], self.keys[(7 * cell) % len(self.keys)]

    def run_lever(self, name: str) -> dict[str, Any]:
        from gc25d_core.deploy.runtime import DeployRuntime, RuntimeOptions
        from gc25d_core.models.vae import encode_frames

        a = self.args
        reset_model(self.model)
        opts = RuntimeOptions(seed=0, **lever_options(name, self.cuda))
        out: dict[str, Any] = {"options": opts.model_dump()}
        t_start = time.perf_counter()
        rt = self.runtime(DeployRuntime, opts)
        # first frame, cold: anchor encode + prefill + cell 1 + its decode (compile warm-up included)
        latent = encode_frames(self.vae, self.anchor_rgb)[None]
        rt.start(latent, self.ids_pool[0][:1], self.keys[0])
        ids, key = self.cell_inputs(1)
        first = rt.step(ids, key)
        frames = list(first.frames)
        if not frames:
            frames = rt.flush()
        self.sync()
        out["first_frame_s"] = time.perf_counter() - t_start
        latents = [first.latent.float().cpu()]
        full_window = rt.spec.sink + (rt.spec.window or 0)  # from this cell on every cell sees a full cache
        cell = 2
        while cell < full_window + a.warmup:
            ids, key = self.cell_inputs(cell)
            latents.append(rt.step(ids, key).latent.float().cpu())
            cell += 1
        self.sync()
        out["warm_s"] = time.perf_counter() - t_start
        out["cached_cells"] = len(rt.streamer.cache) if rt.streamer.cache is not None else 0
        if name in a.profile:
            out["profile"], cell = self.profile(rt, cell, name, latents)
        limit = a.max_exact_s if name == "exact" and a.max_exact_s is not None else a.max_lever_s
        deadline = time.perf_counter() + limit
        e2e: list[float] = []
        for _ in range(a.cells):
            ids, key = self.cell_inputs(cell)
            t0 = time.perf_counter()
            o = rt.step(ids, key)
            for f in o.frames:  # the frames are on the host: the cell is done
                assert f.dtype == np.uint8
            e2e.append(time.perf_counter() - t0)
            latents.append(o.latent.float().cpu())
            cell += 1
            if time.perf_counter() > deadline:
                out["stopped_early"] = f"max_lever_s={a.max_lever_s}"
                break
        rt.timing = True
        parts: dict[str, list[float]] = {k: [] for k in ("denoise", "commit", "decode", "host", "total")}
        forwards: list[list[float]] = []
        for _ in range(a.parts):
            ids, key = self.cell_inputs(cell)
            o = rt.step(ids, key)
            for k in parts:
                parts[k].append(getattr(o.times, k))
            forwards.append(o.times.forwards)
            latents.append(o.latent.float().cpu())
            cell += 1
        rt.timing = False
        rt.options = rt.options.model_copy(update={"decode": False})
        rt.flush()
        denoise_only: list[float] = []
        for _ in range(a.parts):
            ids, key = self.cell_inputs(cell)
            self.sync()
            t0 = time.perf_counter()
            o = rt.step(ids, key)
            self.sync()
            denoise_only.append(time.perf_counter() - t0)
            latents.append(o.latent.float().cpu())
            cell += 1
        out.update(runtime_counters(rt))
        out["cells_measured"] = len(e2e)
        out["e2e_s_per_cell"] = stats(e2e)
        out["denoise_only_s_per_cell"] = stats(denoise_only)
        out["parts_s"] = {k: stats(v) for k, v in parts.items()}
        out["forwards_per_cell"] = len(forwards[0]) if forwards else None
        out["forward_s"] = (
            [statistics.median(col) for col in zip(*forwards, strict=False)] if forwards else None
        )
        med = out["e2e_s_per_cell"]["median"] if e2e else None
        den = out["denoise_only_s_per_cell"]["median"] if denoise_only else None
        out["e2e_fps"] = 4 / med if med else None
        out["denoise_only_fps"] = 4 / den if den else None
        out["real_time"] = bool(med is not None and med <= 0.25)
        out["goal"] = bool(med is not None and med <= 0.125)
        if name == a.reference:
            self.exact = latents
        elif self.exact:
            out["vs_exact"] = self.compare(latents, [])
        del rt
        if self.cuda:
            torch.cuda.empty_cache()
        return out

    def run_loop(self, name: str) -> dict[str, Any]:
        """The live loop of one lever: a session from its start, every cell timed (see the module
        docstring), then a second session with per-part timing."""
        from gc25d_core.deploy.runtime import DeployRuntime, RuntimeOptions
        from gc25d_core.deploy.session import LiveSession
        from gc25d_core.deploy.world import LiveWorld, WorldConfig

        a = self.args
        reset_model(self.model)
        opts = RuntimeOptions(seed=0, **lever_options(name, self.cuda))
        out: dict[str, Any] = {"options": opts.model_dump()}
        t0 = time.perf_counter()
        rt = self.runtime(DeployRuntime, opts)
        world = LiveWorld(WorldConfig(renderer=a.world), self.geo, device=self.dev)
        out["world_renderer"] = world.renderer  # auto: torch on a GPU, numpy on a CPU
        session = LiveSession(rt, world, self.vae)
        session.prepare()
        self.sync()
        out["warmup_s"] = time.perf_counter() - t0
        out["runtime_warmup_s"] = rt.warmup_s  # of warmup_s: the throwaway session (graphs, autotune)
        check = name == "exact" and not self.world_ids
        # pass 1: what the player gets — no syncs but the runtime's own, every cell from cell 1
        t_start = time.perf_counter()
        frames_out = len(session.start())
        self.sync()
        out["start_s"] = time.perf_counter() - t_start
        walls: list[float] = []
        latents: list[torch.Tensor] = []
        kept: list[np.ndarray] = []  # each cell's frames (fresh host arrays: kept, not copied)
        first_frame: float | None = None
        limit = a.max_exact_s if name == "exact" and a.max_exact_s is not None else a.max_lever_s
        deadline = time.perf_counter() + limit
        t0 = time.perf_counter()
        for i, block in enumerate(self.blocks):
            o = session.step(block)
            for f in o.out.frames:  # the frames are on the host: the cell is done
                assert f.dtype == np.uint8
            t1 = time.perf_counter()
            # the loop's period (frames to frames): what a cell leaves in flight on the device (a
            # deferred commit) is paid in the next one, whose first sync waits for it
            walls.append(t1 - t0)
            t0 = t1
            frames_out += len(o.out.frames)
            if first_frame is None and frames_out > 1:  # past the anchor's frame
                first_frame = t1 - t_start
            # kept on the device: a copy to the host here would wait for that in-flight work
            latents.append(o.out.latent.detach().clone())
            if o.out.frames:
                kept.append(np.concatenate(o.out.frames) if len(o.out.frames) > 1 else o.out.frames[0])
            if check and i < a.world_check:
                self.world_ids.append(o.ids)
            if time.perf_counter() > deadline:
                out["stopped_early"] = f"time limit {limit} s after {i + 1} cells"
                break
        rest = rt.flush()
        if first_frame is None and rest:
            first_frame = time.perf_counter() - t_start
        latents = [x.float().cpu() for x in latents]
        out["first_frame_s"] = first_frame
        out["cell_s"] = tail_stats(walls)
        out["first_cells_s"] = walls[:5]
        out["cells_fps"] = 4 / out["cell_s"]["p50"] if walls else None
        # pass 2: the parts, each synchronised (slower than pass 1 by the syncs; the side stream's
        # overlap is lost while timing)
        rt.timing = True
        session.start()
        parts: dict[str, list[float]] = {}
        for block in self.blocks[: a.parts]:
            o = session.step(block)
            times = o.out.times.as_dict()
            times["world_sim"], times["world_ids"] = world.times["sim"], world.times["render"]
            for k, v in times.items():
                parts.setdefault(k, []).append(v)
        rt.flush()
        rt.timing = False
        out["parts_s"] = {k: tail_stats(v) for k, v in parts.items()}
        out.update(runtime_counters(rt))
        if name == a.reference:
            self.exact, self.exact_frames = latents, kept
        elif self.exact:
            out["vs_exact"] = self.compare(latents, kept)
        del rt, session, world, kept
        if self.cuda:
            torch.cuda.empty_cache()
        return out

    def world_check(self) -> dict[str, Any]:
        """The session's ids (exact lever, first ``--world-check`` cells) vs the numpy reference."""
        import os

        from gc25d_core.deploy.world import WorldConfig, reference_ids

        n = len(self.world_ids)
        t0 = time.perf_counter()
        workers = max(1, (os.cpu_count() or 2) - 1)
        ref = reference_ids(WorldConfig(), self.geo, self.blocks[:n], workers=workers)[1:]
        same = sum(int((x == y).sum()) for x, y in zip(ref, self.world_ids, strict=True))
        total = sum(x.size for x in ref)
        per_cell = [float((x == y).mean()) for x, y in zip(ref, self.world_ids, strict=True)]
        return {
            "cells": n,
            "agreement": same / max(total, 1),
            "worst_cell_agreement": min(per_cell) if per_cell else None,
            "reference_s": time.perf_counter() - t0,
            "workers": workers,
        }

    def serve_latency(self, name: str, events: int) -> dict[str, Any]:
        """Action-to-photon through the play server: ``web.create_app`` (the code ``serve`` runs)
        around a live session of lever ``name`` on this process's model, served by uvicorn on
        127.0.0.1 in a thread; ``ws_latency`` plays the page's part over a real WebSocket."""
        import asyncio
        import socket
        import threading

        import uvicorn

        from gc25d_core.deploy.runtime import DeployRuntime, RuntimeOptions
        from gc25d_core.deploy.session import LiveSession
        from gc25d_core.deploy.web import create_app, server_config
        from gc25d_core.deploy.world import LiveWorld, WorldConfig

        reset_model(self.model)
        opts = RuntimeOptions(seed=0, **lever_options(name, self.cuda))
        t0 = time.perf_counter()
        rt = self.runtime(DeployRuntime, opts)
        world = LiveWorld(WorldConfig(renderer=self.args.world), self.geo, device=self.dev)
        session = LiveSession(rt, world, self.vae)
        session.prepare()
        warmup_s = time.perf_counter() - t0
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        app = create_app(session, host="127.0.0.1", port=port)
        server = uvicorn.Server(server_config(app, "127.0.0.1", port))  # serve's own settings
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        try:
            out = asyncio.run(ws_latency(f"ws://127.0.0.1:{port}/ws", events, seed=self.args.action_seed))
        finally:
            server.should_exit = True
            thread.join(timeout=30)
        out.update(lever=name, options=opts.model_dump(), warmup_s=warmup_s, server="in-process")
        del rt, session, world
        if self.cuda:
            torch.cuda.empty_cache()
        return out

    def world_speed(self) -> dict[str, Any]:
        """The world's cost per cell apart: sim (host) and ids (device-synchronised), per renderer."""
        from gc25d_core.deploy.world import LiveWorld, WorldConfig

        out: dict[str, Any] = {"geometry": [self.geo.dst_width, self.geo.dst_height]}
        variants: list[tuple[str, Literal["torch", "numpy"], torch.dtype]] = [
            ("torch_fp64", "torch", torch.float64),
            ("torch_fp32", "torch", torch.float32),
        ]
        if self.args.world_numpy_cells:
            variants.append(("numpy", "numpy", torch.float64))
        for label, renderer, dtype in variants:
            w = LiveWorld(WorldConfig(renderer=renderer), self.geo, device=self.dev, dtype=dtype)
            w.warm_up()  # the compile at load, as a session's prepare does
            w.reset(with_rgb=False)
            n = self.args.world_numpy_cells if renderer == "numpy" else len(self.blocks)
            total, sim = [], []
            for block in self.blocks[:n]:
                self.sync()
                t0 = time.perf_counter()
                w.advance(block)
                self.sync()
                total.append(time.perf_counter() - t0)
                sim.append(w.times["sim"])
            out[label] = {"cell_s": tail_stats(total), "sim_s": tail_stats(sim)}
        return out

    def profile(
        self, rt: Any, cell: int, name: str, latents: list[torch.Tensor]
    ) -> tuple[dict[str, Any], int]:
        """torch.profiler over ``--profile-cells`` steady-state cells (decode on, no per-forward
        syncs): the top CUDA kernels by total time, the top CPU self times and how busy the GPU
        was (kernel time / wall, summed and as the union of kernel intervals)."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.sync()
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(self.args.profile_cells):
                ids, key = self.cell_inputs(cell)
                o = rt.step(ids, key)
                for f in o.frames:
                    assert f.dtype == np.uint8
                latents.append(o.latent)
                cell += 1
            frames = rt.flush()  # a side-stream decode still in flight belongs to these cells
            del frames
            self.sync()
            wall_us = (time.perf_counter() - t0) * 1e6
        latents[-self.args.profile_cells :] = [x.float().cpu() for x in latents[-self.args.profile_cells :]]
        return profile_summary(prof, wall_us, name, self.args.profile_cells), cell

    def decode_error(self, cells: int) -> dict[str, Any]:
        """Frames of the lossy decode variants vs the fp32 reference decode on the same (exact)
        latents: max / mean |diff| in uint8 steps and PSNR (dB), over ``cells`` streamed cells."""
        from gc25d_core.models.vae import StreamingDecoder, decode_copy, video_to_frames

        zs = [z.to(self.dev) for z in self.exact[:cells]]

        def frames(vae: Any, dtype: torch.dtype) -> list[np.ndarray]:
            dec = StreamingDecoder(vae, dtype=dtype)
            return [video_to_frames(dec.push(z)[0].clamp_(-1, 1)) for z in zs]

        ref = frames(self.vae, torch.float32)
        out: dict[str, Any] = {"cells": len(zs)}
        for name, dtype, fast in (("bf16", torch.bfloat16, False), ("bf16_fast", torch.bfloat16, True)):
            got = frames(decode_copy(self.vae, dtype, fast=fast), dtype)
            d = np.concatenate(
                [
                    np.abs(a.astype(np.int16) - b.astype(np.int16)).ravel()
                    for a, b in zip(ref, got, strict=True)
                ]
            )
            mse = float(np.mean(d.astype(np.float64) ** 2))
            out[name] = {
                "max_abs_u8": int(d.max()),
                "mean_abs_u8": float(d.mean()),
                "psnr_db": float(10 * np.log10(255**2 / mse)) if mse > 0 else None,
            }
        return out

    def world(self) -> dict[str, Any]:
        """The code world's cost per cell at the benchmark's geometry (``--world``: the torch
        renderer on the bench's device, or the numpy reference on one core)."""
        from gc25d_core.deploy.world import LiveWorld, WorldConfig

        geo = self.geo
        w = LiveWorld(WorldConfig(renderer=self.args.world), geo, device=self.dev)
        w.warm_up()
        t0 = time.perf_counter()
        w.reset(with_rgb=False)
        reset_s = time.perf_counter() - t0
        times = []
        for i in range(self.args.world_cells):
            t0 = time.perf_counter()
            w.advance(np.array([1 + i % 4, 0, 0, 0, 0], np.uint8))
            self.sync()
            times.append(time.perf_counter() - t0)
        return {"geometry": [geo.dst_width, geo.dst_height], "reset_s": reset_s, "s_per_cell": stats(times)}


# what a player's fingers do: key sets held one after another (the page sends one event per change)
HUMAN_KEYS: tuple[list[str], ...] = (
    ["w"],
    ["w", "shift"],
    ["d"],
    [],
    ["a"],
    ["j"],
    ["w", "d"],
    ["s"],
    ["k"],
    [" "],
    ["g"],
    ["l"],
    ["w", "a", "shift"],
)


async def ws_latency(
    url: str, events: int, seed: int = 0, gap_s: tuple[float, float] = (0.15, 0.6)
) -> dict[str, Any]:
    """The page's side of ``serve`` over a real WebSocket: after the first generated cell, ``events``
    key events at a human rate (one every ``gap_s`` seconds, uniform), each numbered as the page
    numbers them; per event the time from its send to the arrival of the message holding the
    frame the server tagged as the first to reflect it (``acks``), the page's jitter buffer not
    included. p50 / p90 / p99 / max, seconds."""
    import asyncio
    import random

    import websockets

    rng = random.Random(seed)
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    seen = {"messages": 0, "bytes": 0}
    server: dict[str, list[float]] = {"queued": [], "step": [], "encode_prev": []}  # the server's own times
    first_cell = asyncio.Event()
    done = asyncio.Event()
    async with websockets.connect(url, max_size=None) as ws:

        async def reader() -> None:
            async for text in ws:
                t = time.perf_counter()
                m = json.loads(text)
                if m.get("type") == "error":
                    raise RuntimeError(f"serve: {m.get('error')}")
                seen["messages"] += 1
                seen["bytes"] += len(text)
                if m.get("cell", 0) >= 1:
                    first_cell.set()
                    for k, xs in server.items():
                        if isinstance(m.get("times", {}).get(k), float) and (k != "queued" or sent):
                            xs.append(m["times"][k])
                for ack in m.get("acks", []):
                    for n, t0 in sent.items():
                        if n <= ack["event"] and n not in got:
                            got[n] = t - t0
                if len(got) == events:
                    done.set()

        task = asyncio.create_task(reader())
        try:
            await asyncio.wait_for(first_cell.wait(), timeout=60)
            keys: list[str] = []
            t_start = time.perf_counter()
            for n in range(1, events + 1):
                keys = rng.choice([k for k in HUMAN_KEYS if k != keys])
                sent[n] = time.perf_counter()
                await ws.send(json.dumps({"keys": keys, "id": n}))
                await asyncio.sleep(rng.uniform(*gap_s))
            await asyncio.wait_for(done.wait(), timeout=30)
            wall = time.perf_counter() - t_start
        finally:
            task.cancel()
    xs = np.asarray([got[n] for n in sorted(got)], np.float64)
    return {
        "url": url,
        "events": events,
        "answered": len(xs),
        "events_per_s": events / wall,
        "latency_s": {
            "p50": float(np.percentile(xs, 50)),
            "p90": float(np.percentile(xs, 90)),
            "p99": float(np.percentile(xs, 99)),
            "max": float(xs.max()),
            "min": float(xs.min()),
            "mean": float(xs.mean()),
        },
        "within_0.4s_p50": float(np.percentile(xs, 50)) <= 0.4,
        # where it goes on the server (p50, s): an event's wait for its block's take, the take to
        # the frames on the host, the message's encode; the rest is the socket and the client
        "server_p50_s": {k: float(np.percentile(v, 50)) if v else None for k, v in server.items()},
        "messages": seen["messages"],
        "mean_message_bytes": seen["bytes"] / max(1, seen["messages"]),
    }


def _device_kernels(prof: Any) -> list[Any]:
    from torch.autograd import DeviceType

    return [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CUDA]


def profile_summary(prof: Any, wall_us: float, name: str, cells: int) -> dict[str, Any]:
    """Kernel / CPU tables of a torch.profiler run, printed to stderr and returned (ms)."""
    kernels = _device_kernels(prof)
    by_name: dict[str, list[float]] = {}
    spans: list[tuple[float, float]] = []
    for e in kernels:
        tr = e.time_range
        by_name.setdefault(e.name, []).append(tr.end - tr.start)
        spans.append((tr.start, tr.end))
    busy_sum = sum(sum(v) for v in by_name.values())
    union, last = 0.0, float("-inf")
    for s0, s1 in sorted(spans):
        if s1 > last:
            union += s1 - max(s0, last)
            last = s1
    top_k = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    cpu = [
        a
        for a in prof.key_averages()
        if getattr(a, "device_type", None) is None or str(getattr(a, "device_type", "")).endswith("CPU")
    ]
    top_c = sorted(cpu, key=lambda a: -a.self_cpu_time_total)[:15]
    res: dict[str, Any] = {
        "cells": cells,
        "wall_ms": wall_us / 1e3,
        "kernels": len(kernels),
        "kernels_per_cell": len(kernels) / max(cells, 1),
        "gpu_kernel_ms_sum": busy_sum / 1e3,
        "gpu_busy_sum_frac": busy_sum / wall_us if wall_us else None,
        "gpu_busy_union_frac": union / wall_us if wall_us else None,
        "top_kernels_ms": [[n[:120], sum(v) / 1e3, len(v)] for n, v in top_k],
        "top_cpu_self_ms": [[a.key[:120], a.self_cpu_time_total / 1e3, a.count] for a in top_c],
    }
    err = sys.stderr
    print(f"== profile {name}: {cells} cells, wall {res['wall_ms']:.1f} ms, {len(kernels)} kernels", file=err)
    print(
        f"   GPU busy: sum {res['gpu_kernel_ms_sum']:.1f} ms = {res['gpu_busy_sum_frac'] or 0:.2f} of wall, "
        f"union {res['gpu_busy_union_frac'] or 0:.2f}",
        file=err,
    )
    for n, ms, c in res["top_kernels_ms"]:
        print(f"   {ms:9.2f} ms {c:6d}x  {n}", file=err)
    print("   -- CPU self time", file=err)
    for n, ms, c in res["top_cpu_self_ms"]:
        print(f"   {ms:9.2f} ms {c:6d}x  {n}", file=err)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dims", choices=("full", "tiny"), default="full")
    p.add_argument(
        "--mode",
        choices=("loop", "steady", "serve"),
        default="loop",
        help="the live loop, one cell, or action-to-photon through the play server",
    )
    p.add_argument(
        "--events",
        type=int,
        default=None,
        help="key events sent to the play server (default: serve 60; loop 0 = not measured)",
    )
    p.add_argument(
        "--serve-lever",
        default=None,
        help="the play server's lever, or a comma list measured one after another (default: "
        "graphs_all_cstream on cuda, the CLI's; exact on cpu)",
    )
    p.add_argument(
        "--url",
        default=None,
        help="serve: measure a running server (ws://host:port/ws, e.g. python -m gc25d_core.deploy "
        "serve) instead of one started here on this bench's random weights",
    )
    p.add_argument(
        "--levers",
        default="",
        help=f"comma list of {','.join(LEVERS)} (default: loop {','.join(LOOP_LEVERS)}; steady all on cuda)",
    )
    p.add_argument(
        "--reference",
        default="exact",
        help="the lever run first, every other compared with (vs_exact: latents, and frames in the loop)",
    )
    p.add_argument("--cells", type=int, default=None, help="cells per lever (default: loop 240, steady 100)")
    p.add_argument(
        "--parts",
        type=int,
        default=None,
        help="cells timed per part, synchronised (default: loop 60, steady 8)",
    )
    p.add_argument(
        "--world",
        choices=("auto", "torch", "numpy"),
        default="auto",
        help="the loop's world renderer (auto, the session's default: torch on a GPU, numpy on a CPU)",
    )
    p.add_argument("--action-seed", type=int, default=0, help="seed of the loop's action stream")
    p.add_argument(
        "--world-check", type=int, default=None, help="loop cells checked vs the numpy world (default: all)"
    )
    p.add_argument(
        "--world-numpy-cells",
        type=int,
        default=2,
        help="cells of the numpy world timed in world_speed (0: skip)",
    )
    p.add_argument("--warmup", type=int, default=2, help="cells after the window is full, before timing")
    p.add_argument("--max-lever-s", type=float, default=120.0, help="stop a lever's e2e loop after this")
    p.add_argument(
        "--max-exact-s",
        type=float,
        default=None,
        help="loop: the exact lever's own limit (the oracle compared over the cells it ran)",
    )
    p.add_argument("--world-cells", type=int, default=3, help="steady: code-world cells timed (0: skip)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument(
        "--profile", default="", help="comma list of levers to profile (torch.profiler, steady state)"
    )
    p.add_argument("--profile-cells", type=int, default=2, help="cells under the profiler per lever")
    p.add_argument(
        "--decode-error-cells", type=int, default=4, help="cells decoded fp32 vs bf16 variants (0: skip)"
    )
    args = p.parse_args(argv)
    if args.mode == "serve" and args.url:  # a client only: no model here
        import asyncio

        result = asyncio.run(ws_latency(args.url, args.events or 60, seed=args.action_seed))
        return print_result({"bench": "deploy", "mode": "serve", "serve": result}, args.out)
    args.events = args.events if args.events is not None else (60 if args.mode == "serve" else 0)
    args.serve_lever = args.serve_lever or (
        "graphs_all_cstream_compile" if args.device == "cuda" else "exact"
    )
    args.serve_levers = [x for x in args.serve_lever.split(",") if x]
    for name in args.serve_levers:
        if name not in LEVERS:
            p.error(f"unknown --serve-lever {name}; known: {list(LEVERS)}")
    loop = args.mode != "steady"
    args.cells = args.cells if args.cells is not None else (240 if loop else 100)
    args.parts = args.parts if args.parts is not None else (60 if loop else 8)
    args.world_check = args.cells if args.world_check is None else min(args.world_check, args.cells)
    args.profile = {x for x in args.profile.split(",") if x}
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    default = LOOP_LEVERS if loop else LEVERS
    chosen = [x for x in args.levers.split(",") if x] or [
        x for x in default if args.device == "cuda" or x not in CUDA_ONLY
    ]
    unknown = set(chosen) - set(LEVERS)
    if unknown:
        p.error(f"unknown levers {sorted(unknown)}; known: {list(LEVERS)}")
    if args.reference not in LEVERS:
        p.error(f"unknown --reference {args.reference}; known: {list(LEVERS)}")
    if args.reference in chosen:
        chosen.remove(args.reference)
    chosen = [args.reference, *chosen]  # the reference first: every lever is compared with it
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):  # library chatter must not break the one JSON line
        result = run(args, chosen)
    return print_result(result, args.out)


def run(args: argparse.Namespace, chosen: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    bench = Bench(args)
    result: dict[str, Any] = {
        "bench": "deploy",
        "device": str(bench.dev),
        "gpu": torch.cuda.get_device_name(0) if bench.cuda else None,
        "torch": torch.__version__,
        "dims": args.dims,
        "latent_hw": list(bench.hw),
        "tokens_per_cell": bench.hw[0] * bench.hw[1] // 4,
        "build_s": bench.build_s,
        "levers": {},
    }
    result["mode"] = args.mode
    if args.mode == "serve":
        result["load_s"] = bench.build_s
        serve_levers(args, bench, result)
        result["wall_s"] = time.perf_counter() - t0
        return result
    if args.mode == "loop":
        return run_loop(args, chosen, bench, result, t0)
    for name in chosen:
        lever = run_one(args, bench, result, name, bench.run_lever)
        e2e = (lever.get("e2e_s_per_cell") or {}).get("median")
        print(f"[bench] {name}: e2e {e2e} s/cell, error {lever.get('error')}", file=sys.stderr, flush=True)
    if args.decode_error_cells and bench.exact:
        try:
            result["decode_error"] = bench.decode_error(args.decode_error_cells)
        except Exception as e:
            result["decode_error"] = {"error": f"{type(e).__name__}: {e}"}
    if args.world_cells:
        try:
            result["world"] = bench.world()
        except Exception as e:
            result["world"] = {"error": f"{type(e).__name__}: {e}"}
    ok = {k: v for k, v in result["levers"].items() if "e2e_s_per_cell" in v and v["e2e_s_per_cell"]}
    if ok:
        best = min(ok, key=lambda k: ok[k]["e2e_s_per_cell"]["median"])
        result["summary"] = {
            "best_lever": best,
            "best_e2e_s_per_cell": ok[best]["e2e_s_per_cell"]["median"],
            "best_e2e_fps": ok[best]["e2e_fps"],
            "best_denoise_only_fps": ok[best]["denoise_only_fps"],
            "exact_e2e_s_per_cell": ok["exact"]["e2e_s_per_cell"]["median"] if "exact" in ok else None,
            "real_time_0.25s": ok[best]["real_time"],
            "goal_0.125s": ok[best]["goal"],
        }
    result["wall_s"] = time.perf_counter() - t0
    return result


def serve_levers(args: argparse.Namespace, bench: Bench, result: dict[str, Any]) -> None:
    """Action-to-photon of each ``--serve-lever``: ``serve`` is the first's, ``serve_by_lever`` all."""
    by_lever: dict[str, Any] = {}
    for name in args.serve_levers:
        try:
            by_lever[name] = bench.serve_latency(name, args.events)
        except Exception as e:
            by_lever[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            reset_model(bench.model)
        print(f"[bench] serve {name}: {by_lever[name].get('latency_s')}", file=sys.stderr, flush=True)
        result["serve"] = by_lever[args.serve_levers[0]]
        if len(args.serve_levers) > 1:
            result["serve_by_lever"] = by_lever
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".partial.json").write_text(json.dumps(result))


def run_one(
    args: argparse.Namespace, bench: Any, result: dict[str, Any], name: str, run: Any
) -> dict[str, Any]:
    """One lever into ``result["levers"]``: a failing lever records its error and the run goes on
    (the model reset); partial results are written after each, so they survive a run stopped at its
    time limit."""
    try:
        result["levers"][name] = run(name)
    except Exception as e:
        result["levers"][name] = {
            "error": f"{type(e).__name__}: {e}",
            "trace": traceback.format_exc()[-2000:],
        }
        reset_model(bench.model)
        if bench.cuda:
            torch.cuda.empty_cache()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".partial.json").write_text(json.dumps(result))
    return result["levers"][name]


def run_loop(
    args: argparse.Namespace, chosen: list[str], bench: Bench, result: dict[str, Any], t0: float
) -> dict[str, Any]:
    result["load_s"] = bench.build_s
    result["cells"] = args.cells
    result["geometry"] = [bench.geo.dst_width, bench.geo.dst_height]
    result["actions"] = {
        "seed": args.action_seed,
        "distinct_blocks": len({b.tobytes() for b in bench.blocks}),
    }
    if args.events:  # action-to-photon through the play server, before the levers (one model)
        serve_levers(args, bench, result)
    for name in chosen:
        lever = run_one(args, bench, result, name, bench.run_loop)
        cs = lever.get("cell_s") or {}
        print(
            f"[bench] {name}: p50 {cs.get('p50')} max {cs.get('max')} s/cell, error {lever.get('error')}",
            file=sys.stderr,
            flush=True,
        )
    for key, fn in (("world_speed", bench.world_speed), ("world_check", bench.world_check)):
        if key == "world_check" and not bench.world_ids:
            continue
        try:
            result[key] = fn()
        except Exception as e:
            result[key] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    ok = {k: v for k, v in result["levers"].items() if v.get("cell_s")}
    if ok:
        best = min(ok, key=lambda k: ok[k]["cell_s"]["p50"])
        cs = ok[best]["cell_s"]
        result["summary"] = {
            "best_lever": best,
            "best_cell_p50_s": cs["p50"],
            "best_cell_max_s": cs["max"],
            "best_first_frame_s": ok[best]["first_frame_s"],
            "exact_cell_p50_s": ok["exact"]["cell_s"]["p50"] if "exact" in ok else None,
            "every_cell_real_time": cs["max"] <= BUDGET_S,
            "p50_within_0.18s": cs["p50"] <= 0.18,
        }
    result["wall_s"] = time.perf_counter() - t0
    return result


if __name__ == "__main__":
    main()
