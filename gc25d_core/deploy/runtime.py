"""The live runtime: a causal export, the text table and the VAE, one latent cell at a time.

    runtime = DeployRuntime.load(export, cfg, options)        # contract checked (load_deploy_model)
    frames0 = runtime.start(anchor_latent, ids0, key0)         # cell 0: the clean TI2V anchor at t=0
    out = runtime.step(ids4, key)                              # 4 denoise steps + commit, decode

Per cell the shared 4-step sampler runs (``models.sampler.CausalStreamer`` / ``denoise_cell`` /
``KVCache``: the code stage 3 trains with): the export's recorded denoise axis, sink / window / RoPE
cap, the commit at t = 0 into the cache; then ``StreamingDecoder`` decodes the cell's 4 frames.
Noise comes from one generator seeded per session, so a seed and a block sequence give the same
frames. Options (each measured against this exact path by bench/speed/deploy.py): ``fold_commit`` (the
commit rides on the next cell's first forward), ``defer_commit`` (the commit runs after the cell's
decode and is not waited for: the same latents, the frames one commit sooner), ``compile`` (torch.compile of the block body),
``decode_dtype`` bf16 (a bf16 copy of the VAE) and ``decode_stream`` (the decode of cell k runs on a
second CUDA stream while cell k + 1 denoises; frames then come out one cell later), ``fp8`` (FP8
GEMMs in the blocks' linear layers, models.fp8; ``fp8_skip`` opts layers out) and ``decoder='fast'``
(the fast_decoder asset's small decoder instead of the VAE's, models.fast_decoder) and
``kv_attention='fa4'`` (FlashAttention-4 over the static KV buffers, models.fa4).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from gc25d_core.models.configs import NUM_SEM_COND_KEYS, NUM_WAN_KEYS_5B, full_config
from gc25d_core.models.export import ExportError, ExportMeta
from gc25d_core.models.kv_cache import StaticKVCache
from gc25d_core.schema import Strict
from gc25d_core.vocab import check_ids

FULL_SIZE_KEYS = NUM_WAN_KEYS_5B + NUM_SEM_COND_KEYS  # 831 (SPEC §6)
DEPLOY_SPEC = {"sink": 3, "window": 17, "rope_cap": 20}  # SPEC §8 deploy contract
DEPLOY_STEPS = 4


class RuntimeOptions(Strict):
    seed: int = Field(default=0, description="noise seed of the session")
    fold_commit: bool = Field(default=False, description="commit cell k inside cell k+1's first forward")
    defer_commit: bool = Field(
        default=False,
        description="commit cell k after its decode, not waited for (its frames first; the same latents)",
    )
    commit_stream: bool = Field(
        default=False,
        description="with defer_commit on a GPU: the commit runs on a second CUDA stream beside the "
        "decode (the same latents; the next cell waits for it on the device)",
    )
    compile: bool = Field(default=False, description="torch.compile the block body (GPU)")
    compile_mode: str | None = Field(
        default=None,
        description="torch.compile mode, e.g. reduce-overhead (CUDA graphs of the compiled parts)",
    )
    fused_rmsnorm: bool = Field(default=False, description="F.rms_norm for the q/k norms (GPU speed)")
    decode_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description="VAE decode precision")
    decode_stream: bool = Field(
        default=False, description="decode on a second CUDA stream (frames 1 cell later)"
    )
    decode: bool = Field(default=True, description="decode frames (off: latents only, e.g. long tests)")
    static_kv: bool = Field(
        default=False, description="preallocated KV buffers (models.kv_cache.StaticKVCache; same results)"
    )
    cuda_graphs: bool = Field(
        default=False,
        description="replay CUDA graphs of the steady-state forwards (implies static_kv; eager on a CPU)",
    )
    rotate_compile: bool = Field(
        default=False,
        description="the static cache's full-window key rotation as one compiled kernel (GPU)",
    )
    rope_compile: bool = Field(
        default=False,
        description="the static cache's other RoPE work compiled (GPU; the CLI's default with "
        "--compile): each block's rotation of the query cell's q and k, and the keys' rotation while "
        "the window fills (StaticKVCache.compile_query_rotation; stage 3's rollout_compile_rope). "
        "Within bf16 rounding",
    )
    decode_graph: bool = Field(
        default=False, description="replay a CUDA graph of the steady-state cell decode (GPU)"
    )
    decode_fast: bool = Field(
        default=False,
        description="lean VAE ops + channels-last-3d conv weights + cuDNN autotune for the decode (GPU)",
    )
    decoder: Literal["vae", "fast", "auto"] = Field(
        default="vae",
        description="the VAE's streaming decoder, or the fast_decoder asset's (models.fast_decoder); "
        "auto (open_session resolves it): fast on CUDA where its record earns the default "
        "(models.fast_decoder.default_worthy), else vae",
    )
    fp8: bool | Literal["auto"] = Field(
        default=False,
        description="FP8 GEMMs for the DiT blocks' linear layers (models.fp8); auto (the CLI's default "
        "on CUDA): on where the GPU and torchao allow it and the DiT is as wide as where it measured "
        "faster (models.fp8.auto_fp8)",
    )
    fp8_skip: tuple[str, ...] = Field(
        default=(), description="fnmatch patterns of linear layers kept in bf16 with fp8 (per-layer opt-out)"
    )
    kv_attention: Literal["sdpa", "fa4", "auto"] = Field(
        default="sdpa",
        description="the attention of each cell over the static KV buffers: PyTorch SDPA, or "
        "FlashAttention-4 (the optional flash-attn-4 package, sm90+ GPU, static_kv / cuda_graphs; "
        "models.fa4); auto (the CLI's default on CUDA): fa4 where it is installed and the DiT is as "
        "wide as where it measured faster (models.fa4.auto_kv_attention), else sdpa",
    )


def contract_problems(meta: ExportMeta, num_keys: int, *, full_size: bool | None = None) -> list[str]:
    """What keeps an export from being deployed (SPEC §6 / §8), each naming the field; empty = ok.
    ``full_size`` (default: the export's config is the 5B one) asks for the 831 keys."""
    problems: list[str] = []
    if meta.causal is None or meta.denoise_axis is None:
        problems.append("causal=false: not a causal export (stage 1/2/3 exports are causal)")
    else:
        if len(meta.denoise_axis) != DEPLOY_STEPS:
            problems.append(
                f"denoise_axis={list(meta.denoise_axis)}: deploy runs {DEPLOY_STEPS} steps per cell"
            )
        for name, want in DEPLOY_SPEC.items():
            got = getattr(meta.causal, name)
            if got != want:
                problems.append(f"{name}={got} (the deploy contract is {want})")
    full = (
        meta.dit_config.architecture() == full_config(meta.vocab).architecture()
        if full_size is None
        else full_size
    )
    if full and num_keys != FULL_SIZE_KEYS:
        problems.append(f"{num_keys} tensors (a full-size export has {FULL_SIZE_KEYS})")
    return problems


def load_deploy_model(
    path: Path | str,
    *,
    vocab: str | None = None,
    device: Any = "cpu",
    dtype: torch.dtype | None = None,
    expected_sha256: str | None = None,
    strict_contract: bool = False,
) -> tuple[Any, ExportMeta]:
    """The runtime's loader: ``load_gc_weights`` (SHA256, metadata, key set, shapes, bf16), then the
    causal metadata a session needs and the vocabulary the world renders (``vocab``). With
    ``strict_contract`` the SPEC §8 numbers (sink 3 / window 17 / cap 20, 4 steps, 831 keys at full
    size) must hold too. Errors name the file and the field."""
    from gc25d_core.models.loading import load_gc_weights

    path = Path(path)
    model: Any
    model, meta = load_gc_weights(path, device=device, dtype=dtype, expected_sha256=expected_sha256)
    if meta.causal is None or meta.denoise_axis is None:
        raise ExportError(f"export {path}: causal=false — deploy needs a causal export (stage 1, 2 or 3)")
    if vocab is not None and meta.vocab != vocab:
        raise ExportError(f"export {path}: vocab={meta.vocab!r} but the code world renders {vocab!r} ids")
    if strict_contract:
        problems = contract_problems(meta, len(model.state_dict()))
        if problems:
            raise ExportError(f"export {path}: not the deploy contract: " + "; ".join(problems))
    model.eval().requires_grad_(False)
    model.check_sem_ids = False  # the world's ids are checked on the host, once per cell
    return model, meta


REPLAY_CELLS = 8  # latents a decoder switched to mid-session replays (set_decoder)


@dataclass
class CellTimes:
    """Seconds of one cell's parts (device-synchronised when timing is on)."""

    world: float = 0.0
    upload: float = 0.0
    denoise: float = 0.0
    commit: float = 0.0
    decode: float = 0.0
    host: float = 0.0
    total: float = 0.0
    forwards: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if k != "forwards"}


@dataclass
class CellOut:
    cell: int
    frames: list[np.ndarray]  # RGB uint8 [T, H, W, 3] decoded this step (cells in order)
    latent: torch.Tensor  # x0 [1, 48, 1, h, w] of this cell
    times: CellTimes


class _TimedForward:
    """The model's forward, timed per kind (denoise / commit / fold) when ``sync`` is set."""

    def __init__(self, model: Any, sync: Callable[[], None]):
        self.model, self.sync = model, sync
        self.on = False
        self.times: dict[str, float] = {"denoise": 0.0, "commit": 0.0}
        self.each: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.on:
            return self.model(*args, **kwargs)
        self.sync()
        t0 = time.perf_counter()
        out = self.model(*args, **kwargs)
        self.sync()
        dt = time.perf_counter() - t0
        self.times["commit" if kwargs.get("commit") else "denoise"] += dt
        self.each.append(dt)
        return out


class DeployRuntime:
    def __init__(
        self,
        model: Any,
        meta: ExportMeta,
        table: dict[str, torch.Tensor],
        vae: Any,
        options: RuntimeOptions | None = None,
        fast_decoder: Any = None,
    ):
        """``fast_decoder``: a ``models.fast_decoder.FastDecoder``, which ``options.decoder='fast'``
        needs (it decodes instead of the VAE; the VAE still encodes the anchor)."""
        from gc25d_core.models.gcdit import TextContext
        from gc25d_core.models.kv_graphs import GraphedKVForward
        from gc25d_core.models.sampler import CausalStreamer
        from gc25d_core.models.vae import StreamingDecoder

        self.options = opts = options or RuntimeOptions()
        self.model, self.meta = model, meta
        assert meta.causal is not None and meta.denoise_axis is not None
        self.spec, self.axis = meta.causal, tuple(meta.denoise_axis)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cuda = self.device.type == "cuda"
        if opts.fused_rmsnorm:
            model.use_fused_rmsnorm(True)
        static_attention = None
        self.kv_choice = f"kv attention {opts.kv_attention}"
        if opts.kv_attention == "auto":
            from gc25d_core.models.fa4 import auto_kv_attention

            if opts.static_kv or opts.cuda_graphs:
                kind, self.kv_choice = auto_kv_attention(int(model.dim), self.dtype, self.device)
            else:
                kind, self.kv_choice = "sdpa", "kv attention sdpa: FA4 runs over the static KV buffers only"
            self.options = opts = opts.model_copy(update={"kv_attention": kind})
        if opts.kv_attention == "fa4":
            from gc25d_core.models.fa4 import check_fa4, fa4_attention

            if not (opts.static_kv or opts.cuda_graphs):
                raise ValueError(
                    "kv_attention='fa4' runs over the static KV buffers (static_kv or cuda_graphs)"
                )
            check_fa4(self.device, "kv_attention='fa4'")
            static_attention = fa4_attention
        self.fp8_layers: list[str] = []
        self.fp8_choice = "fp8 on (asked for)" if opts.fp8 is True else "fp8 off"
        if opts.fp8 == "auto":
            from gc25d_core.models.fp8 import auto_fp8

            on, self.fp8_choice = auto_fp8(int(model.dim), self.device)
            self.options = opts = opts.model_copy(update={"fp8": on})
        if opts.fp8:  # before the graphs are captured (warm_up): they replay the FP8 kernels
            from gc25d_core.models.fp8 import apply_fp8

            self.fp8_layers = apply_fp8(model, opts.fp8_skip)
        if opts.compile:
            # the KV attention eager: one compiled body for every block and window fill level
            model.enable_compile(
                eager_attention=True, **({"mode": opts.compile_mode} if opts.compile_mode else {})
            )
        # one bank of every prompt for the whole session: its text embedding and each block's
        # cross-attention K/V are computed once and shared by every cell (TextContext memo)
        self.keys = sorted(table)
        self.key_index = {k: i for i, k in enumerate(self.keys)}
        bank = torch.stack([table[k] for k in self.keys])[None].to(self.device)
        self.text = TextContext.build(bank, torch.zeros(1, 1, dtype=torch.long))
        self._key_idx = {k: torch.tensor([[i]], device=self.device) for k, i in self.key_index.items()}
        self.vae = vae
        decode_dtype = torch.bfloat16 if opts.decode_dtype == "bf16" else torch.float32
        if opts.decoder == "auto":
            raise ValueError(
                "decoder='auto' is resolved by deploy.session.open_session (it reads the fast decoder's record)"
            )
        if opts.decoder == "fast" and fast_decoder is None:
            raise ValueError(
                "decoder='fast' needs the fast decoder (the fast_decoder asset's file: "
                "models.fast_decoder.load_fast_decoder_for)"
            )
        if decode_dtype != torch.float32 or opts.decode_fast:
            from gc25d_core.models.vae import decode_copy

            self.vae = decode_copy(vae, decode_dtype, fast=opts.decode_fast)
        # every decoder the session has (the page switches between them, ``set_decoder``)
        self.decoders: dict[str, Any] = {
            "vae": StreamingDecoder(self.vae, dtype=decode_dtype, graph=opts.decode_graph and self.cuda)
        }
        if fast_decoder is not None:
            from gc25d_core.models.fast_decoder import StreamingFastDecoder

            self.decoders["fast"] = StreamingFastDecoder(fast_decoder.to(self.device), dtype=decode_dtype)
        self.decoder: Any = self.decoders[opts.decoder]
        # the latents decoded last, which a decoder switched to mid-session replays (``set_decoder``;
        # kept only where there is another decoder to switch to)
        self._decoded: deque[torch.Tensor] = deque(maxlen=REPLAY_CELLS)
        self.decode_stream: torch.cuda.Stream | None = None
        self.set_decode_stream(opts.decode_stream)
        self._pending_decode: tuple[torch.Tensor, Any] | None = None
        if opts.commit_stream and not opts.defer_commit:
            raise ValueError("commit_stream needs defer_commit (the commit runs beside the decode)")
        self.commit_stream = torch.cuda.Stream(self.device) if opts.commit_stream and self.cuda else None
        # the static cache's compiled rotations (full window, filling window, query cell), compiled
        # once and handed to every cache a session builds
        self._rope_fns: tuple[Any, Any, Any] | None = None
        self.graphed: GraphedKVForward | None = None
        self.notes: list[str] = []
        inner: Any = model
        if opts.cuda_graphs:
            if self.cuda:
                self.graphed = inner = GraphedKVForward(model)
            else:
                self.notes.append("cuda_graphs: no CUDA device, the static cache runs eagerly")
        if opts.commit_stream and not self.cuda:
            self.notes.append("commit_stream: no CUDA device, the commit runs after the decode")
        self.forward = _TimedForward(inner, self.sync)
        self.streamer = CausalStreamer(
            model,
            self.spec,
            self.axis,
            forward=self.forward,
            fold_commit=opts.fold_commit,
            static_kv=opts.static_kv or opts.cuda_graphs,
            defer_commit=opts.defer_commit,
            static_attention=static_attention,
        )
        self.generator = torch.Generator(self.device).manual_seed(opts.seed)
        self.timing = False
        self.cell = 0
        self._valid_lut: torch.Tensor | None = None
        self.warmup_s = 0.0

    # -- pieces ------------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        export: Path | str,
        table: dict[str, torch.Tensor],
        vae: Any,
        *,
        vocab: str | None = None,
        device: Any = "cpu",
        expected_sha256: str | None = None,
        options: RuntimeOptions | None = None,
        fast_decoder: Any = None,
    ) -> DeployRuntime:
        device = torch.device(device)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, meta = load_deploy_model(
            export, vocab=vocab, device=device, dtype=dtype, expected_sha256=expected_sha256
        )
        return cls(model, meta, table, vae.to(device), options, fast_decoder=fast_decoder)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def text_of(self, key: str) -> Any:
        if key not in self.key_index:
            raise ValueError(f"prompt key {key!r} is not in the text table ({len(self.keys)} keys)")
        return self.text.select(self._key_idx[key])

    def _ids(self, ids: np.ndarray | torch.Tensor, frames: int) -> torch.Tensor:
        if isinstance(ids, torch.Tensor) and ids.device.type != "cpu":
            return self._device_ids(ids, frames)
        a = ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
        if a.ndim == 3:
            a = a[None]
        if a.ndim != 4 or a.shape[1] != frames:
            raise ValueError(f"ids of a cell must be uint8 [{frames}, H, W], got {list(a.shape)}")
        check_ids(a, self.meta.vocab, "cell ids")
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).to(self.device)

    def _device_ids(self, ids: torch.Tensor, frames: int) -> torch.Tensor:
        """Ids already on the device (the world's torch renderer): the same checks as the host path,
        on the device (one 256-entry table lookup; its verdict costs one small sync)."""
        from gc25d_core.vocab import valid_raw_ids

        a = ids[None] if ids.ndim == 3 else ids
        if a.ndim != 4 or a.shape[1] != frames or a.dtype != torch.uint8:
            raise ValueError(f"ids of a cell must be uint8 [{frames}, H, W], got {a.dtype} {list(a.shape)}")
        if a.device != self.device:
            raise ValueError(f"cell ids are on {a.device}, the session runs on {self.device}")
        if self._valid_lut is None:
            lut = torch.zeros(256, dtype=torch.bool)
            lut[list(valid_raw_ids(self.meta.vocab))] = True
            self._valid_lut = lut.to(self.device)
        if not bool(self._valid_lut[a.long()].all()):
            check_ids(a.cpu().numpy(), self.meta.vocab, "cell ids")  # raises, naming the values
        return a

    def set_decode_stream(self, on: bool) -> None:
        """The side-stream decode on or off, also mid-session (the page's switch): switched off,
        the cell in flight on the side stream comes out with the next cell's frames."""
        if on and not self.cuda:
            raise ValueError(
                f"decode_stream needs a CUDA device (a second stream); the session runs on {self.device}"
            )
        if on and self.decode_stream is None:
            self.decode_stream = torch.cuda.Stream(self.device)
        elif not on:
            self.decode_stream = None
        if self.options.decode_stream != on:
            self.options = self.options.model_copy(update={"decode_stream": on})

    def set_decoder(self, kind: str) -> None:
        """The page's decoder switch, between cells: the stream of ``kind`` replays the last
        ``REPLAY_CELLS`` latents the session decoded (their frames dropped) to take up its causal
        state, then decodes the next cell. Exact while the session is that short, and always for
        the fast decoder (it carries one cell); the VAE's deeper state is approximate past that.
        A switch to the VAE costs its decode of the replayed cells."""
        if kind not in self.decoders:
            raise ValueError(f"no {kind!r} decoder in this session (it has {sorted(self.decoders)})")
        if kind == self.options.decoder:
            return
        new = self.decoders[kind]
        new.reset()
        with torch.no_grad():
            for z in self._decoded:
                new.push(z)
        self.decoder = new
        self.options = self.options.model_copy(update={"decoder": kind})

    def _decode(self, z: torch.Tensor) -> list[np.ndarray]:
        """Frames ready now (in cell order): this cell's, or with the side stream the previous one's."""
        from gc25d_core.models.vae import video_to_frames

        if not self.options.decode:
            return []
        if len(self.decoders) > 1:  # a switch can replay it; z may be a graph's buffer, so a copy
            self._decoded.append(z.detach().clone())
        out = []
        if self._pending_decode is not None:
            out.append(self._resolve())
        if self.decode_stream is None:
            return [*out, video_to_frames(self.decoder.push(z)[0].clamp_(-1, 1))]
        self.decode_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.decode_stream):
            video = self.decoder.push(z)[0].clamp_(-1, 1)
            done = torch.cuda.Event()
            done.record(self.decode_stream)
        z.record_stream(self.decode_stream)
        self._pending_decode = (video, done)
        return out

    def _resolve(self) -> np.ndarray:
        from gc25d_core.models.vae import video_to_frames

        assert self._pending_decode is not None
        video, done = self._pending_decode
        done.synchronize()
        self._pending_decode = None
        return video_to_frames(video)

    @torch.no_grad()
    def decode_rows(self, rows: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """Several sessions' latents ``[48, N, h, w]`` (cell 0 the anchor; one N for all), played
        with ``options.decode`` off, decoded as one batch through a fresh stream of this runtime's
        VAE decoder (its weights and dtype): per row uint8 frames ``[1 + 4(N - 1), H, W, 3]``, what
        the session shows with its decode on up to the batched convolutions' rounding. Eval's live
        sweeps: on a CPU two rows decode in about 0.6 of the time of two single streams."""
        from gc25d_core.models.vae import StreamingDecoder, video_to_frames

        if not isinstance(self.decoder, StreamingDecoder):
            raise ValueError("decode_rows decodes through the VAE (options.decoder 'vae')")
        if len({r.shape for r in rows}) != 1:
            raise ValueError(f"rows of one shape only, got {[list(r.shape) for r in rows]}")
        z = torch.stack(list(rows)).to(self.device)
        stream = StreamingDecoder(self.decoder.vae, dtype=self.decoder.dtype)
        out: list[list[np.ndarray]] = [[] for _ in rows]
        for k in range(z.shape[2]):
            video = stream.push(z[:, :, k : k + 1]).clamp_(-1, 1)
            for b, frames in enumerate(out):
                frames.append(video_to_frames(video[b]))
        return [np.concatenate(frames) for frames in out]

    def flush(self) -> list[np.ndarray]:
        """Frames still in flight on the decode stream (the last cell's)."""
        return [self._resolve()] if self._pending_decode is not None else []

    # -- the session -------------------------------------------------------------------------------

    @torch.no_grad()
    def warm_up(self, anchor: torch.Tensor, ids0: np.ndarray, key0: str, cells: int | None = None) -> float:
        """Load-time, on a GPU: a throwaway session (the anchor, then ``cells`` cells of frame 0's
        ids; default: through every window fill level past the RoPE cap) so that a player's
        session runs the fast path from its first cell: the CUDA graphs of every fill level
        captured (``GraphedKVForward``, on the cache the next sessions reuse), the decode's
        convolutions autotuned, compiled kernels built. Its frames and latents are dropped; the
        next ``start`` reseeds the noise and resets the cache and the decoder. Returns seconds."""
        if not self.cuda:
            return 0.0
        t0 = time.perf_counter()
        spec = self.spec
        n = cells if cells is not None else max(spec.rope_cap or 0, spec.sink + (spec.window or 0) - 1) + 2
        ids = np.asarray(ids0)
        ids4 = np.repeat(ids.reshape(-1, *ids.shape[-2:])[-1:], 4, axis=0)
        self.start(anchor, ids, key0)
        for _ in range(n):
            self.step(ids4, key0)
        self.flush()
        self.sync()
        self.cell = 0
        self.warmup_s = time.perf_counter() - t0
        return self.warmup_s

    @torch.no_grad()
    def start(self, anchor: torch.Tensor, ids0: np.ndarray, key0: str) -> list[np.ndarray]:
        """Prefill the clean anchor latent ``[1, 48, 1, h, w]`` at t=0 (cell 0); returns its frame."""
        z_dim = self.vae.z_dim
        if anchor.ndim != 5 or anchor.shape[:3] != (1, z_dim, 1):
            raise ValueError(f"anchor latent must be [1, {z_dim}, 1, h, w], got {list(anchor.shape)}")
        self.decoder.reset()  # a decode graph captured by warm_up is kept: replayed from cell 3
        self._pending_decode = None
        self._decoded.clear()
        self.generator.manual_seed(self.options.seed)
        self.streamer.start(anchor.to(self.device, self.dtype), self.text_of(key0), self._ids(ids0, 1))
        cache = self.streamer.cache
        opts = self.options
        if (opts.rotate_compile or opts.rope_compile) and self.cuda and isinstance(cache, StaticKVCache):
            if self._rope_fns is None:
                if opts.rotate_compile:
                    cache.compile_rotation()
                if opts.rope_compile:
                    cache.compile_query_rotation()
                self._rope_fns = (cache.rotate_fn, cache.rotate_part_fn, cache.query_rotate_fn)
            cache.rotate_fn, cache.rotate_part_fn, cache.query_rotate_fn = self._rope_fns
        self.cell = 1
        return self._decode(anchor.to(self.device))

    @torch.no_grad()
    def step(self, ids4: np.ndarray | torch.Tensor, key: str, world_s: float = 0.0) -> CellOut:
        """Denoise + commit the next cell under its 4 frames of ids (host, or already on the
        device) and its prompt, then decode."""
        t0 = time.perf_counter()
        times = CellTimes(world=world_s)
        self.forward.on = self.timing
        self.forward.times = {"denoise": 0.0, "commit": 0.0}
        self.forward.each = []
        sem, text = self._ids(ids4, 4), self.text_of(key)
        if self.timing:
            self.sync()
            times.upload = time.perf_counter() - t0
        x0 = self.streamer.step(text, sem, generator=self.generator)
        self.sync()  # one sync per cell: the live page shows denoise and decode apart
        t1 = time.perf_counter()
        in_step = self.forward.times["commit"]  # the forwards before t1 (host time is what is left)
        beside = self.commit_stream
        if beside is not None:  # the commit reads x0 and writes the cache; the decode reads x0
            main = torch.cuda.current_stream(self.device)
            beside.wait_stream(main)
            with torch.cuda.stream(beside):
                self.streamer.commit()
            x0.record_stream(beside)
        frames = self._decode(x0)
        if self.timing:
            self.sync()
        t2 = time.perf_counter()
        # deferred: the commit is queued behind the decode (or beside it) and not waited for — the
        # frames go now; the next cell's forwards wait for it on the device
        if beside is not None:
            main.wait_stream(beside)
        else:
            self.streamer.commit()
        if self.timing:
            self.sync()
            times.denoise, times.commit = self.forward.times["denoise"], self.forward.times["commit"]
        else:  # forwards not timed one by one: the whole denoise + commit as denoise
            times.denoise = t1 - t0
        times.forwards = list(self.forward.each)
        times.decode = t2 - t1
        times.total = time.perf_counter() - t0 + world_s
        times.host = max(0.0, (t1 - t0) - times.upload - times.denoise - in_step) if self.timing else 0.0
        self.cell += 1
        return CellOut(self.cell - 1, frames, x0, times)
