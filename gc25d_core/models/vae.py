"""The Wan2.2 VAE (DiffSynth ``WanVideoVAE38``): build, verified load, fp32 encode (SPEC §5).

The VAE interface, the one way every other room (preprocessing, previews, eval, deploy) uses a VAE;
nothing outside ``models/`` reaches into DiffSynth's VAE:

    vae = build_vae_for(cfg, device)      # the VAE the config names, its weights checked
    vae.z_dim                             # latent channels (48: gc25d_core.config.LATENT_CHANNELS)
    encode_video / encode_frames          # [B, 3, T, H, W] in [-1, 1] / uint8 frames -> latents
    encode_on_device                      # the latents job's batched encode, where the batch is
    decode_video / decode_frames          # whole clips: latents -> [B, 3, T, H, W] / uint8 frames
    StreamingDecoder(vae).push(z_cell)    # cell by cell, the decoder's causal cache carried

Latents are made with fp32 weights (PyTorch's default TF32 convolutions on GPU), non-tiled, from
RGB uint8 mapped to [-1, 1]; they are stored bf16 by the caller. Decoding goes the other way, for
whole clips (``decode_video``) or one latent cell at a time (``StreamingDecoder``: the live runtime
decodes the 4 frames of each new cell, carrying the decoder's causal cache between cells). ``TinyWanVideoVAE38`` is the same
class with a small random inner model (dim 16) and identity normalisation, for CPU tests: identical
encode/decode code, 16x spatial and 4x temporal compression, 48 channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gc25d_core.compat import import_diffsynth
from gc25d_core.config import LATENT_CHANNELS

if TYPE_CHECKING:
    from gc25d_core.config import Gc25dConfig

import_diffsynth()
from diffsynth.models.wan_video_vae import (  # noqa: E402
    CausalConv3d,
    RMS_norm,
    VideoVAE38_,
    WanVideoVAE38,
    count_conv3d,
    unpatchify,
)
from diffsynth.models.wan_video_vae import (  # noqa: E402
    patchify as patchify,  # re-exported: vae_fit walks the encode loop itself
)

VAE38_KEY_HASH = "e1de6c02cdac79f8b739f4d3698cd216"
Z_DIM = LATENT_CHANNELS  # Wan2.2 VAE38's latent width (the stored latents' width, gc25d_core.config)
SPATIAL_STRIDE = 16
TEMPORAL_STRIDE = 4


class TinyWanVideoVAE38(WanVideoVAE38):
    """``WanVideoVAE38`` with ``VideoVAE38_(dim, dec_dim)`` small and mean 0 / std 1 (random weights)."""

    def __init__(self, z_dim: int = Z_DIM, dim: int = 16, dec_dim: int = 16):
        torch.nn.Module.__init__(self)  # skip WanVideoVAE38.__init__: it builds the full-size model
        self.dim, self.dec_dim = dim, dec_dim  # the encoder's and decoder's base widths (the file keeps them)
        self.mean = torch.zeros(z_dim)
        self.std = torch.ones(z_dim)
        self.scale = [self.mean, 1.0 / self.std]
        self.model = VideoVAE38_(dim=dim, dec_dim=dec_dim, z_dim=z_dim).eval().requires_grad_(False)
        self.upsampling_factor = SPATIAL_STRIDE
        self.z_dim = z_dim


class LeanCausalConv3d(CausalConv3d):
    """DiffSynth's ``CausalConv3d`` with the same result and fewer full-tensor copies.

    DiffSynth concatenates the time cache and then ``F.pad``s time *and* space: two copies of every
    conv input. Here the spatial zero padding is the convolution's own (cuDNN pads on the fly) and the
    causal time prefix (zeros, then cached frames) is written into one buffer with ``x``: one copy,
    none for 1x1x1 convs. Written by hand because the layer is DiffSynth's; the class swap keeps
    its weights, its isinstance checks and its state-dict keys.
    """

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        pad_w, _, pad_h, _, pad_t, _ = self._padding
        n_cache = cache_x.shape[2] if cache_x is not None and pad_t > 0 else 0
        if n_cache > pad_t:  # DiffSynth then crops the front with a negative pad: keep its path
            return super().forward(x, cache_x)
        n_zero = pad_t - n_cache
        if pad_t > 0:
            b, c, t, h, w = x.shape
            cl3d = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)
            fmt = torch.channels_last_3d if cl3d else torch.contiguous_format
            buf = torch.empty(
                (b, c, n_zero + n_cache + t, h, w), dtype=x.dtype, device=x.device, memory_format=fmt
            )
            buf[:, :, :n_zero].zero_()
            if n_cache:
                assert cache_x is not None
                buf[:, :, n_zero : n_zero + n_cache].copy_(cache_x)
            buf[:, :, n_zero + n_cache :].copy_(x)
            x = buf
        return self._conv3d(x, (0, pad_h, pad_w))

    def _conv3d(self, x: torch.Tensor, padding: tuple[int, int, int]) -> torch.Tensor:
        return torch.nn.functional.conv3d(
            x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups
        )


class OneDnnCausalConv3d(LeanCausalConv3d):
    """``LeanCausalConv3d`` whose convolution on a CPU is always oneDNN's. For a single clip PyTorch
    picks its native conv3d by a size rule (batch 1 and a small channels × frames × height), and on
    the tiny VAE's decoder that kernel is about 3× slower than oneDNN's
    (``bench/speed/fast_decoder.py --vae-layouts``); a batch of two already takes oneDNN's. The same
    results up to fp32 rounding. Written by hand: PyTorch has no switch for that choice."""

    def _conv3d(self, x: torch.Tensor, padding: tuple[int, int, int]) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            return torch.ops.aten.mkldnn_convolution(
                x, self.weight, self.bias, list(padding), list(self.stride), list(self.dilation), self.groups
            )
        return super()._conv3d(x, padding)


class LeanRMSNorm(RMS_norm):
    """DiffSynth's channel-first ``RMS_norm`` (``normalize(x, dim=1) * sqrt(C) * gamma + bias``) as one
    fused ``F.rms_norm(x) * gamma`` over the innermost dim when ``x`` is channels-last-3d (a free
    permute): x * sqrt(C) / ||x|| = x / rms(x), so only rounding differs (and the eps: 1e-12 on the
    norm there, 1e-24 on the mean square here). Other layouts take DiffSynth's path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (
            self.channel_first
            and x.ndim == 5
            and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last_3d)
        ):
            return super().forward(x)
        weight = self.gamma.reshape(-1).to(x.dtype)  # under autocast x is bf16: one dtype, the fused kernel
        y = torch.nn.functional.rms_norm(x.permute(0, 2, 3, 4, 1), weight.shape, weight, eps=1e-24)
        if isinstance(self.bias, torch.Tensor):
            y = y + self.bias.reshape(-1)
        return y.permute(0, 4, 1, 2, 3)


def lean_vae_ops(vae: torch.nn.Module) -> torch.nn.Module:
    """Swap DiffSynth's causal convs and RMS norms for the lean versions above (in place; weights,
    keys and results unchanged up to rounding)."""
    for m in vae.modules():
        if type(m) is CausalConv3d:
            m.__class__ = LeanCausalConv3d
        elif type(m) is RMS_norm:
            m.__class__ = LeanRMSNorm
    return vae


def decode_copy(vae: WanVideoVAE38, dtype: torch.dtype = torch.float32, fast: bool = False) -> WanVideoVAE38:
    """A copy of ``vae`` for the live decode: ``dtype`` weights; ``fast`` adds the lean ops, and on a
    GPU channels-last-3d conv weights and cuDNN autotuning (``torch.backends.cudnn.benchmark``, a
    process-wide switch). The input VAE is left as it is."""
    import copy

    out = copy.deepcopy(vae).to(dtype)
    if fast:
        lean_vae_ops(out)
        if next(out.parameters()).is_cuda:
            for m in out.modules():
                if isinstance(m, torch.nn.Conv3d):
                    m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
            torch.backends.cudnn.benchmark = True
    return out


def build_vae(tiny: bool = False, device: Any = "cpu", dim: int = 16, dec_dim: int = 16) -> WanVideoVAE38:
    """A randomly initialised VAE (``device='meta'`` for key checks of the full one); ``dim`` /
    ``dec_dim``: the tiny one's encoder / decoder widths."""
    with torch.device(device):
        vae = TinyWanVideoVAE38(dim=dim, dec_dim=dec_dim) if tiny else WanVideoVAE38()
    return vae.eval()


def vae_key_hash(vae: WanVideoVAE38) -> str:
    """DiffSynth's key+shape hash of the checkpoint layout (inner keys without ``model.``)."""
    from diffsynth.core.loader.file import hash_state_dict_keys

    return hash_state_dict_keys(dict(vae.model.state_dict()))


def check_vae_sha256(path: Path, expected: str, field: str = "vae.sha256") -> None:
    """Refuse weights whose SHA256 is not the configured one; the error names the file and the
    config field the digest came from (before anything of the file is parsed)."""
    from gc25d_core.hashing import sha256_file
    from gc25d_core.models.loading import WeightsError

    if not path.is_file():
        raise WeightsError(f"VAE weights {path} do not exist ({field} = {expected})")
    got = sha256_file(path)
    if got != expected.lower():
        raise WeightsError(f"VAE weights {path}: sha256 {got} does not match {field} = {expected}")


def load_vae(
    path: Path | str,
    *,
    expected_sha256: str,
    device: Any = "cpu",
    expected_key_hash: str = VAE38_KEY_HASH,
    field: str = "vae.sha256",
) -> WanVideoVAE38:
    """Wan2.2_VAE.pth (or .safetensors): sha256 check (against ``field``), registry key-hash check,
    fp32 weights."""
    from diffsynth.core.loader.file import hash_state_dict_keys, load_state_dict

    from gc25d_core.models.loading import WeightsError

    path = Path(path)
    check_vae_sha256(path, expected_sha256, field)
    sd: Mapping[str, torch.Tensor] = load_state_dict(str(path), torch_dtype=torch.float32)
    got = hash_state_dict_keys(dict(sd))
    if got != expected_key_hash:
        raise WeightsError(f"{path}: VAE key hash {got} != expected {expected_key_hash}")
    converted = WanVideoVAE38.state_dict_converter().from_civitai(dict(sd))
    with torch.device("meta"):
        vae = WanVideoVAE38()
    vae.load_state_dict(converted, strict=True, assign=True)
    return vae.to(device).eval().requires_grad_(False)


def to_channels_last_3d(vae: torch.nn.Module) -> None:
    """NDHWC layout for every 5-D conv weight (cuDNN's fast 3-D conv path); numerics unchanged."""
    for m in vae.modules():
        if isinstance(m, torch.nn.Conv3d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)


def speed_up_vae(vae: WanVideoVAE38, cfg: Gc25dConfig, device: torch.device) -> WanVideoVAE38:
    """The speed options of ``cfg.vae`` that keep the SPEC's numerics (fp32, TF32 convs). On a CPU
    they touch the decoder alone, within fp32 rounding (bench/speed/fast_decoder.py --vae-layouts):
    its lean convolutions are oneDNN's for a single clip too (``OneDnnCausalConv3d``), and its
    channels-last weights let the lean RMS norms take the fused kernel. The encode, which makes the
    training data, would move by rounding under either, so it keeps its kernels."""
    if cfg.vae.lean_ops:
        lean_vae_ops(vae)
        if device.type == "cpu":
            decoder_on_onednn(vae)
    if cfg.vae.channels_last_3d:
        if device.type == "cuda":
            to_channels_last_3d(vae)
        else:
            for part in decoder_parts(vae):
                to_channels_last_3d(part)
    return vae


def decoder_parts(vae: WanVideoVAE38) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The modules the decode runs (the latent's 1x1x1 conv, then the decoder), none the encode does."""
    return vae.model.conv2, vae.model.decoder


def decoder_on_onednn(vae: WanVideoVAE38) -> WanVideoVAE38:
    """The decoder's lean causal convolutions as ``OneDnnCausalConv3d`` (in place; weights and keys
    unchanged)."""
    for part in decoder_parts(vae):
        for m in part.modules():
            if type(m) is LeanCausalConv3d:
                m.__class__ = OneDnnCausalConv3d
    return vae


def build_vae_for(cfg: Gc25dConfig, device: torch.device) -> WanVideoVAE38:
    """The VAE ``cfg`` names, its weights checked: ``vae.path`` (real, or a fitted tiny one with
    ``vae.tiny``), else the tiny_vae asset's fit (tiny preset), else the seeded tiny random one."""
    from gc25d_core.models.vae_fit import load_tiny_vae, resolve_vae_file

    found = resolve_vae_file(cfg)
    if found is not None and cfg.vae.tiny:
        path, sha, field = found
        vae: WanVideoVAE38 = load_tiny_vae(path, expected_sha256=sha, device=device, field=field)
    elif found is not None:
        path, sha, field = found
        vae = load_vae(path, expected_sha256=sha, device=device, field=field)
    elif cfg.vae.tiny:
        torch.manual_seed(cfg.seed)  # the tiny random VAE must be the same on every rank and rerun
        vae = build_vae(tiny=True, device="cpu").to(device)
    else:
        raise ValueError("vae.path and vae.sha256 must be set to encode with real weights")
    return speed_up_vae(vae, cfg, device)


def frames_to_video(frames_THWC: np.ndarray | torch.Tensor) -> torch.Tensor:
    """RGB uint8 ``[T, H, W, 3]`` -> float32 ``[3, T, H, W]`` in [-1, 1]."""
    x = torch.as_tensor(np.asarray(frames_THWC)) if not isinstance(frames_THWC, torch.Tensor) else frames_THWC
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {x.dtype} {tuple(x.shape)}")
    return x.permute(3, 0, 1, 2).float().div_(127.5).sub_(1.0)  # float() made a new tensor


@torch.no_grad()
def encode_video(vae: WanVideoVAE38, video: torch.Tensor, device: Any = None) -> torch.Tensor:
    """fp32, non-tiled encode: ``[3, T, H, W]`` or ``[B, 3, T, H, W]`` in [-1, 1] ->
    float32 ``[B, 48, 1 + (T-1)/4, H/16, W/16]`` (T = 1 + 4k; H, W multiples of 16)."""
    if video.ndim == 4:
        video = video.unsqueeze(0)
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"video must be [B, 3, T, H, W], got {tuple(video.shape)}")
    t, h, w = video.shape[2:]
    if (t - 1) % TEMPORAL_STRIDE or h % SPATIAL_STRIDE or w % SPATIAL_STRIDE:
        raise ValueError(f"video T, H, W = {t}, {h}, {w}: need T = 1 + 4k and H, W multiples of 16")
    device = device or next(vae.parameters()).device
    with torch.autocast(device_type=torch.device(device).type, enabled=False):
        return encode_on_device(vae, video.float(), device).float()


def encode_on_device(vae: WanVideoVAE38, video: torch.Tensor, device: Any) -> torch.Tensor:
    """``WanVideoVAE38.encode(videos, device, tiled=False)`` without its host round trip: DiffSynth
    moves every clip to (pageable) CPU memory and back, then encodes clip by clip (0.34 s of a 1.0 s
    clip on H200 is that copy). The inner model takes the whole batch where it already is; same
    ``single_encode`` math (``model.encode(video, scale)``), batched."""
    return vae.model.encode(video.to(device), vae.scale)


def encode_frames(
    vae: WanVideoVAE38, frames_THWC: np.ndarray | torch.Tensor, device: Any = None
) -> torch.Tensor:
    """RGB uint8 ``[T, H, W, 3]`` -> float32 latent ``[48, T', H/16, W/16]``."""
    return encode_video(vae, frames_to_video(frames_THWC), device)[0]


def _denormalise(vae: WanVideoVAE38, z: torch.Tensor) -> torch.Tensor:
    """Undo the latent normalisation of ``encode``: mu = z * std + mean (per channel)."""
    mean = vae.mean.to(dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
    std = vae.std.to(dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
    return z * std + mean


class StreamingDecoder:
    """Decode a latent clip cell by cell: ``push(z_cell)`` returns that cell's frames (1 for cell 0,
    4 after). DiffSynth's ``VideoVAE38_.decode`` already walks the cells one by one through the
    decoder's causal feature cache; here that cache lives in this object rather than in the model, so
    the cells can arrive over time and several streams can share one VAE. The result equals the
    whole-clip decode (tests/models/test_vae.py)."""

    def __init__(self, vae: WanVideoVAE38, dtype: torch.dtype = torch.float32, graph: bool = False):
        """``dtype``: the decode's compute dtype; the VAE's weights must already be in it (the deploy
        runtime's bf16 decode keeps a bf16 copy; the default fp32 is the reference). ``graph`` (GPU):
        from the third cell on, when every cache entry is a tensor of a fixed shape (or stays unused,
        None: the decoder's last two convs never cache), the cell's
        decode is captured once as a CUDA graph over static inputs and replayed (the same kernels on
        the same values); a capture that fails says why in ``graph_disabled`` and stays eager."""
        self.vae = vae
        self.model = vae.model
        self.dtype = dtype
        self._cache: list[Any] = [None] * count_conv3d(self.model.decoder)
        self.cells = 0
        self.graph = graph
        self.graph_disabled: str | None = None
        self.replays = 0
        self._graph: Any = None
        self._static: dict[str, Any] = {}
        self._norm: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset(self) -> None:
        """A new clip from its first cell; a captured graph is kept (a new session replays it)."""
        self._cache = [None] * len(self._cache)
        self.cells = 0

    def _denormalise(self, z: torch.Tensor) -> torch.Tensor:
        """``_denormalise`` with the VAE's mean / std kept on ``z``'s device: DiffSynth holds them as
        CPU tensors, a host copy per cell that a CUDA graph capture refuses (the same values)."""
        if self._norm is None or self._norm[0].device != z.device or self._norm[0].dtype != z.dtype:
            shape = (1, -1, 1, 1, 1)
            mean = self.vae.mean.to(dtype=z.dtype, device=z.device).view(shape)
            self._norm = (mean, self.vae.std.to(dtype=z.dtype, device=z.device).view(shape))
        mean, std = self._norm
        return z * std + mean

    def _graphable(self, z: torch.Tensor) -> bool:
        return (
            self.graph
            and self.graph_disabled is None
            and z.is_cuda
            and self.cells >= 2
            and all(c is None or isinstance(c, torch.Tensor) for c in self._cache)
        )

    def _push_graphed(self, z: torch.Tensor) -> torch.Tensor:
        st = self._static
        if self._graph is None:
            st["z"] = z.clone()
            st["cache_in"] = [None if c is None else c.clone() for c in self._cache]

            def body() -> tuple[torch.Tensor, list[Any]]:
                x = self.model.conv2(self._denormalise(st["z"]))
                out, new, _ = self.model.decoder(
                    x, feat_cache=list(st["cache_in"]), feat_idx=[0], first_chunk=False
                )
                return unpatchify(out, patch_size=2).float(), new

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    body()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                st["out"], st["cache_out"] = body()
            if len(st["cache_out"]) != len(st["cache_in"]) or not all(
                (a is None and b is None)
                or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape)
                for a, b in zip(st["cache_out"], st["cache_in"], strict=True)
            ):
                raise RuntimeError("the decoder's cache changed shape between cells")
            self._graph = graph
        st["z"].copy_(z)
        for a, c in zip(st["cache_in"], self._cache, strict=True):
            if a is not None and c is not a:  # the eager cells of a new clip (reset) fill the graph's
                a.copy_(c)
        self._graph.replay()
        for a, b in zip(st["cache_in"], st["cache_out"], strict=True):
            if a is not None:
                a.copy_(b)
        self._cache = list(st["cache_in"])
        self.replays += 1
        return st["out"].clone()

    @torch.no_grad()
    def push(self, z_cell: torch.Tensor) -> torch.Tensor:
        """``[B, 48, 1, h, w]`` (or ``[48, 1, h, w]``) normalised latent -> float32 frames
        ``[B, 3, T, 16h, 16w]`` in about [-1, 1], T = 1 for the first cell, 4 for later ones."""
        if z_cell.ndim == 4:
            z_cell = z_cell.unsqueeze(0)
        z_dim = self.vae.z_dim
        if z_cell.ndim != 5 or z_cell.shape[1] != z_dim or z_cell.shape[2] != 1:
            raise ValueError(f"a latent cell must be [B, {z_dim}, 1, h, w], got {tuple(z_cell.shape)}")
        device = next(self.model.parameters()).device
        z_cell = z_cell.to(device=device, dtype=self.dtype)
        if self._graphable(z_cell):
            try:
                with torch.autocast(device_type=device.type, enabled=False):
                    out = self._push_graphed(z_cell)
                self.cells += 1
                return out
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:  # capture trouble: stay eager, say why
                self.graph_disabled = f"{type(e).__name__}: {e}"
                self._graph, self._static = None, {}
        with torch.autocast(device_type=device.type, enabled=False):
            x = self.model.conv2(self._denormalise(z_cell.to(device=device, dtype=self.dtype)))
            out, self._cache, _ = self.model.decoder(
                x, feat_cache=self._cache, feat_idx=[0], first_chunk=self.cells == 0
            )
        self.cells += 1
        return unpatchify(out, patch_size=2).float()


@torch.no_grad()
def decode_video(vae: WanVideoVAE38, z: torch.Tensor) -> torch.Tensor:
    """Whole-clip fp32 decode: ``[B, 48, T', h, w]`` (or ``[48, T', h, w]``) -> ``[B, 3, 1 + 4(T'-1),
    16h, 16w]`` in about [-1, 1] (DiffSynth's own ``decode``: the reference the stream must match)."""
    if z.ndim == 4:
        z = z.unsqueeze(0)
    if z.ndim != 5 or z.shape[1] != vae.z_dim:
        raise ValueError(f"latents must be [B, {vae.z_dim}, T, h, w], got {tuple(z.shape)}")
    device = next(vae.model.parameters()).device
    with torch.autocast(device_type=device.type, enabled=False):
        return vae.model.decode(z.to(device).float(), vae.scale).float()


def video_to_frames(video: torch.Tensor) -> np.ndarray:
    """float ``[3, T, H, W]`` in [-1, 1] -> RGB uint8 ``[T, H, W, 3]`` (clipped, rounded)."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"video must be [3, T, H, W], got {tuple(video.shape)}")
    # the arithmetic and the interleave on the video's device: a GPU copies back a quarter of the
    # bytes (uint8) and the host does no per-pixel work (the live loop's decode, ~10 ms at 832x480)
    x = ((video.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def decode_frames(vae: WanVideoVAE38, z: torch.Tensor) -> np.ndarray:
    """One latent clip ``[48, T', h, w]`` -> RGB uint8 ``[1 + 4(T'-1), 16h, 16w, 3]``."""
    return video_to_frames(decode_video(vae, z)[0])
