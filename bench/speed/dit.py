"""GcDiT vs the plain DiffSynth forward on one GPU (issue 6). Prints one JSON object per line.

Random bf16 weights of the full Wan2.2-TI2V-5B + gc_sem_cond (zero last layer), clip [1,48,21,30,52],
text [1,512,4096], semantic ids [1,81,480,832]; bf16 autocast as in bench/baselines/plain_stack.py. Probes:

  forward  plain model_fn_wan_video vs GcDiT.forward over 21 cells (+ per-cell text bank variant)
  train    forward + backward with gradient checkpointing: plain, GcDiT (all blocks checkpointed),
           GcDiT with fewer checkpointed blocks (--ckpt-blocks), per-cell time embedding, fused RMSNorm;
           MFU = 3 * (2*P_blocks*s + 4*L*s^2*d + 4*L*s*512*d) / t / 989e12 (research/h200_baseline.md)
  deploy   one KV-cache cell with a full window (sink 3 + 16 cached + current): 4 denoise forwards
           + 1 commit forward (target <= 0.35 s)
  tf       teacher-forcing forward + backward over [clean | noisy] (2 x 21 cells), SDPA mask and flex

Usage: python -m bench.speed.dit                      # GPU, full dims
       python -m bench.speed.dit --tiny --device cpu  # CPU smoke of every code path
Options: --probes forward,train,deploy,tf  --reps 3  --ckpt-blocks 20,10,0
         --compile  (repeat the probes with fused RMSNorm + torch.compile'd blocks)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import DeviceBench, dit_flops, emit, mfu


class Bench(DeviceBench):
    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        from gc25d_core.models.configs import full_config, tiny_config
        from gc25d_core.models.gcdit import GcDiT

        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.cfg = tiny_config() if args.tiny else full_config()
        self.hw = (4, 6) if args.tiny else (30, 52)
        self.text_len = 16 if args.tiny else 512
        self.cells = args.cells
        t0 = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(self.dev):
            self.model = GcDiT(self.cfg).to(self.dtype).eval()
        self.model.attn_backend = args.attn_backend  # the unmasked attention of forward / train
        self.sync()
        self.block_params = sum(
            p.numel() for n, p in self.model.named_parameters() if n.startswith("blocks.")
        )
        emit(
            probe="build",
            s=time.perf_counter() - t0,
            device=str(self.dev),
            dtype=str(self.dtype),
            tiny=args.tiny,
            params=sum(p.numel() for p in self.model.parameters()),
            block_params=self.block_params,
            torch=torch.__version__,
            gpu=torch.cuda.get_device_name(0) if self.cuda else None,
            attn_backend=args.attn_backend,
        )
        g = torch.Generator(device="cpu").manual_seed(0)
        n = self.cells
        self.latents = torch.randn(1, 48, n, *self.hw, generator=g).to(self.dev, self.dtype)
        self.context = torch.randn(1, self.text_len, self.cfg.text_dim, generator=g).to(self.dev, self.dtype)
        self.bank = torch.randn(1, 4, self.text_len, self.cfg.text_dim, generator=g).to(self.dev, self.dtype)
        self.bank_index = torch.randint(0, 4, (1, n), generator=g).to(self.dev)
        from gc25d_core.vocab import valid_raw_ids

        values = torch.tensor(valid_raw_ids("parts"), dtype=torch.uint8)
        px = (self.hw[0] * 16, self.hw[1] * 16)
        self.ids = values[torch.randint(0, len(values), (1, 1 + 4 * (n - 1), *px), generator=g)].to(self.dev)
        self.ts = torch.tensor([500.0], device=self.dev)

    # ---------------------------------------------------------------------------- helpers
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def autocast(self):
        return (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self.cuda
            else torch.autocast("cpu", enabled=False)
        )

    def timed(self, fn: Callable[[], Any], warm: int = 1) -> float:
        for _ in range(warm):
            fn()
        self.sync()
        times = []
        for _ in range(self.args.reps):
            t = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None

    def flops(self, tokens: int, train: bool) -> float:
        return dit_flops(self.block_params, tokens, self.cfg.dim, self.cfg.num_layers, self.text_len, train)

    def tokens(self, cells: int) -> int:
        return cells * self.hw[0] * self.hw[1] // 4

    def report(
        self, probe: str, variant: str, fn: Callable[[], Any], tokens: int, train: bool, **extra: Any
    ) -> None:
        self.reset_peak()
        try:
            s = self.timed(fn)
        except torch.OutOfMemoryError as e:
            emit(probe=probe, variant=variant, error=f"OOM: {str(e)[:200]}")
            self.model.zero_grad(set_to_none=True)
            self.reset_peak()
            return
        fl = self.flops(tokens, train)
        emit(
            probe=probe,
            variant=variant,
            tokens=tokens,
            s=s,
            model_tflops=fl / s / 1e12,
            mfu_vs_989=mfu(fl, s),
            peak_gib=self.peak_gib(),
            **extra,
        )

    # ---------------------------------------------------------------------------- probes
    def probe_forward(self, tag: str = "") -> None:
        from diffsynth.pipelines.wan_video import model_fn_wan_video

        m, tok = self.model, self.tokens(self.cells)

        def plain():
            with torch.no_grad(), self.autocast():
                return model_fn_wan_video(
                    dit=m,
                    latents=self.latents,
                    timestep=self.ts,
                    context=self.context,
                    fuse_vae_embedding_in_latents=True,
                )

        def gc():
            with torch.no_grad(), self.autocast():
                return m(self.latents, self.ts, self.context, self.ids)

        def gc_bank():
            with torch.no_grad(), self.autocast():
                return m(self.latents, self.ts, self.bank, self.ids, context_index=self.bank_index)

        if not tag:
            self.report("forward", "plain_model_fn_wan_video", plain, tok, False, cells=self.cells)
            a, b = plain().float(), gc().float()
            emit(
                probe="forward_diff",
                max_abs=float((a - b).abs().max()),
                ref_rms=float(a.pow(2).mean().sqrt()),
            )
        self.report("forward", "gcdit" + tag, gc, tok, False, cells=self.cells)
        if not tag:

            def gc_no_sem():
                with torch.no_grad(), self.autocast():
                    return m(self.latents, self.ts, self.context)

            self.report("forward", "gcdit_without_sem_cond", gc_no_sem, tok, False, cells=self.cells)
        self.report("forward", "gcdit_percell_text_bank4" + tag, gc_bank, tok, False, cells=self.cells)

    def _train_step(self, fwd: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step():
            with self.autocast():
                out = fwd()
            out[:, :, 1:].float().pow(2).mean().backward()
            self.model.zero_grad(set_to_none=True)

        return step

    def probe_train(self, tag: str = "") -> None:
        from diffsynth.pipelines.wan_video import model_fn_wan_video

        m, tok = self.model, self.tokens(self.cells)
        m.train()
        variants: list[tuple[int | None, bool, bool]] = [(None, False, False), (None, True, False)]
        variants += [(b, False, False) for b in self.args.ckpt_blocks]
        variants += [(None, False, True), (min(self.args.ckpt_blocks, default=None), False, True)]
        if tag:  # compiled (fused norm already on): the two ends only
            variants = [(None, False, False), (min(self.args.ckpt_blocks, default=None), False, False)]
        try:
            if not tag:
                self.report(
                    "train",
                    "plain_model_fn_ckpt_all",
                    self._train_step(
                        lambda: model_fn_wan_video(
                            dit=m,
                            latents=self.latents,
                            timestep=self.ts,
                            context=self.context,
                            fuse_vae_embedding_in_latents=True,
                            use_gradient_checkpointing=True,
                        )
                    ),
                    tok,
                    True,
                )
            for blocks, per_cell, fused in dict.fromkeys(variants):
                name = "all" if blocks is None else str(blocks)
                m.per_cell_time = per_cell
                m.use_fused_rmsnorm(fused or bool(tag))
                variant = (
                    f"gcdit_ckpt_{name}"
                    + ("_percell_time" if per_cell else "")
                    + ("_fusednorm" if fused else "")
                )
                self.report(
                    "train",
                    variant + tag,
                    self._train_step(
                        lambda b=blocks: m(
                            self.latents,
                            self.ts,
                            self.context,
                            self.ids,
                            use_gradient_checkpointing=True,
                            checkpoint_blocks=b,
                        )
                    ),
                    tok,
                    True,
                    checkpointed_blocks=self.cfg.num_layers if blocks is None else blocks,
                )
        finally:
            m.per_cell_time = False
            m.use_fused_rmsnorm(bool(tag))
            m.eval()
            m.zero_grad(set_to_none=True)

    def probe_deploy(self, tag: str = "") -> None:
        from gc25d_core.flow import DEPLOY_AXIS
        from gc25d_core.models.configs import DEPLOY_CAUSAL
        from gc25d_core.models.gcdit import TextContext
        from gc25d_core.models.sampler import denoise_cell
        from gc25d_core.models.sem_cond import cell_frame_slice

        m = self.model
        spec = DEPLOY_CAUSAL
        axis = DEPLOY_AXIS.timesteps
        first = spec.sink + spec.window  # the window is full from this cell on
        total = first + 1 + self.args.reps + 1
        frames = 1 + 4 * (total - 1)
        px = self.ids.shape[-2:]
        ids = self.ids[:, :1].expand(1, frames, *px) if frames > self.ids.shape[1] else self.ids
        text = TextContext.build(self.bank[:, 0])
        cache = m.new_kv_cache(spec, self.hw)
        g = torch.Generator(device=self.dev).manual_seed(0)
        self.reset_peak()
        with torch.no_grad(), self.autocast():
            for cell in range(first):
                m.forward_kv(
                    self.latents[:, :, :1],
                    cell,
                    0.0,
                    text,
                    ids[:, cell_frame_slice(cell)],
                    cache,
                    commit=True,
                    return_output=False,
                )
        state = {"cell": first}

        def one_cell():
            cell = state["cell"]
            x = torch.randn(1, 48, 1, *self.hw, generator=g, device=self.dev, dtype=self.dtype)
            with torch.no_grad(), self.autocast():
                denoise_cell(
                    m, cache, cell, x, axis, text=text, sem_ids=ids[:, cell_frame_slice(cell)], generator=g
                )
            state["cell"] += 1

        s = self.timed(one_cell)
        cached = len(cache.cells)
        emit(
            probe="deploy_kv_cell",
            variant="gcdit" + tag,
            s=s,
            forwards=len(axis) + 1,
            cached_cells=cached,
            query_cell=state["cell"] - 1,
            cached_tokens=cached * self.tokens(1),
            target_s=0.35,
            peak_gib=self.peak_gib(),
        )

    def probe_tf(self, tag: str = "") -> None:
        from gc25d_core.models.configs import FULL_CAUSAL

        m, tok = self.model, 2 * self.tokens(self.cells)
        noisy = torch.randn_like(self.latents)
        t = torch.linspace(0, 999, self.cells, device=self.dev)[None]
        m.train()
        try:
            for backend in ("sdpa", "flex"):
                if backend == "flex" and not self.cuda:
                    continue
                m.attn_backend = backend
                self.report(
                    "tf_train",
                    f"gcdit_{backend}_ckpt_all" + tag,
                    self._train_step(
                        lambda: m.forward_teacher_forcing(
                            self.latents,
                            noisy,
                            t,
                            self.context,
                            self.ids,
                            causal=FULL_CAUSAL,
                            use_gradient_checkpointing=True,
                        )
                    ),
                    tok,
                    True,
                    note="flops counted as a dense 2x sequence (mask halves attention work)",
                )
        except Exception as e:  # flex needs a working torch.compile; report and go on
            emit(probe="tf_train", variant=f"gcdit_{m.attn_backend}" + tag, error=repr(e)[:300])
        finally:
            m.attn_backend = self.args.attn_backend
            m.eval()
            m.zero_grad(set_to_none=True)

    def run(self) -> None:
        probes = self.args.probes
        for name in probes:
            getattr(self, f"probe_{name}")()
        if self.args.compile:  # again with fused RMSNorm and torch.compile'd blocks
            self.model.enable_compile()
            self.model.use_fused_rmsnorm(True)
            for name in probes:
                getattr(self, f"probe_{name}")(tag="+compile+fusednorm")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cells", type=int, default=21)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--probes", default="forward,train,deploy,tf", type=lambda s: [x for x in s.split(",") if x]
    )
    p.add_argument(
        "--ckpt-blocks",
        default=None,
        type=lambda s: [int(x) for x in s.split(",") if x],
        help="extra train variants checkpointing only the first N blocks (default 20,10,0 / tiny 1,0)",
    )
    p.add_argument(
        "--compile", action="store_true", help="also run forward/train with torch.compile'd blocks"
    )
    p.add_argument(
        "--attn-backend",
        default="sdpa",
        choices=["sdpa", "fa4"],
        help="kernel of the unmasked self-attention (fa4: the optional flash-attn-4 package)",
    )
    args = p.parse_args(argv)
    if args.ckpt_blocks is None:
        args.ckpt_blocks = [1, 0] if args.tiny else [20, 10, 0]
    unknown = set(args.probes) - {"forward", "train", "deploy", "tf"}
    if unknown:
        p.error(f"unknown probes {sorted(unknown)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device: use --tiny --device cpu for the CPU smoke")
    Bench(args).run()


if __name__ == "__main__":
    main()
