"""The fast decoder: a small causal video decoder (one latent cell -> its 4 frames) distilled from the
configured VAE's decoder on the project's own latents (issue 34 item 2).

The Wan2.2 VAE decoder is most of a live cell's decode time (≈ 70-80 ms of bf16 convolutions at
832×480 on an H200). Public streaming models swap in a tiny decoder (TAEHV-style); this one is trained
here, from the latents the cache holds and the frames they came from, with nothing downloaded:

    dec = FastDecoder(width=64)                       # random; fit_fast_decoder trains one
    stream = StreamingFastDecoder(dec)                # StreamingDecoder's interface (push / reset)
    stream.push(z_cell)                               # [B, 48, 1, h, w] -> [B, 3, T, 16h, 16w]

Causality: a cell is decoded from its own latent and the previous cell's (zeros before the first
cell), the only state carried between cells. A cell's 4 frames come out of one pass: the cell's
features grow into 4 frame feature maps (a 1×1 conv, "temporal grow"), each upsampled 16× by 4
pixel-shuffle stages. Cell 0 (the anchor, one image frame in the VAE) keeps the last of its 4
output frames, as the VAE's first cell yields one frame.

Training (``fit_fast_decoder``): random cells of the train clips, MSE to the VAE's decoded frames
(the teacher) plus ``gt_weight`` × MSE to the raw frames (the second reference); Adam; every step's
cells drawn from a generator seeded by (seed, step), so a run resumed from its checkpoint (every
``ckpt_every`` steps, the inputs key inside) ends with the same weights as one never stopped (CPU,
fixed threads). The file is safetensors with its SHA256 in a record beside it, like the tiny VAE's
(gc25d_core.models.vae_fit).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from gc25d_core.config import LATENT_CHANNELS
from gc25d_core.models.loading import WeightsError
from gc25d_core.models.vae_fit import fit_step

if TYPE_CHECKING:
    from gc25d_core.config import Gc25dConfig

FORMAT = "gc25d_fast_decoder"
META_KEY = "gc25d"
VERSION = 1  # part of the inputs key: bump it when the fit's code changes what it produces
FRAMES_PER_CELL = 4
UPSAMPLE_STAGES = 4  # 2^4 = 16: the VAE's spatial stride


class _Res(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class FastDecoder(nn.Module):
    """``forward(z, z_prev)``: normalised latents ``[B, 48, h, w]`` of a cell and of the cell before
    it -> ``[B, 3, 4, 16h, 16w]`` frames in about [-1, 1]."""

    def __init__(self, z_dim: int = LATENT_CHANNELS, width: int = 64):
        super().__init__()
        if width % 4:
            raise ValueError(f"fast decoder width = {width}: must be a multiple of 4")
        self.z_dim, self.width = z_dim, width
        self.inp = nn.Conv2d(2 * z_dim, width, 3, padding=1)
        self.body = nn.Sequential(_Res(width), _Res(width))
        self.grow = nn.Conv2d(width, FRAMES_PER_CELL * width, 1)  # one feature map per frame
        chans = [width, width, width // 2, width // 4, width // 4]
        ups: list[nn.Module] = []
        for c_in, c_out in zip(chans[:-1], chans[1:], strict=True):
            ups += [
                nn.Conv2d(c_in, 4 * c_out, 3, padding=1),
                nn.PixelShuffle(2),
                nn.ReLU(),
                nn.Conv2d(c_out, c_out, 3, padding=1),
                nn.ReLU(),
            ]
        self.up = nn.Sequential(*ups)
        self.out = nn.Conv2d(chans[-1], 3, 3, padding=1)

    def forward(self, z: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        b, _, h, w = z.shape
        x = self.body(torch.relu(self.inp(torch.cat([z, z_prev], dim=1))))
        x = torch.relu(self.grow(x)).reshape(b * FRAMES_PER_CELL, self.width, h, w)
        y = self.out(self.up(x))  # [B*4, 3, 16h, 16w]
        return y.reshape(b, FRAMES_PER_CELL, 3, *y.shape[-2:]).transpose(1, 2)


class StreamingFastDecoder:
    """``StreamingDecoder``'s interface over a ``FastDecoder``: ``push(z_cell)`` -> that cell's frames
    (1 for the first cell, 4 after), the previous cell's latent carried. ``dtype``: the compute
    dtype (the decoder's weights are cast to it, channels-last on a GPU)."""

    def __init__(self, decoder: FastDecoder, dtype: torch.dtype = torch.float32):
        self.decoder = decoder.to(dtype).eval().requires_grad_(False)
        self.dtype = dtype
        self.z_dim = decoder.z_dim
        self.device = next(decoder.parameters()).device
        if self.device.type == "cuda":
            self.decoder.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._prev: torch.Tensor | None = None
        self.cells = 0
        self.replays = 0  # StreamingDecoder's counters, read by the benches: no graph here
        self.graph_disabled: str | None = None

    def reset(self) -> None:
        self._prev, self.cells = None, 0

    @torch.no_grad()
    def push(self, z_cell: torch.Tensor) -> torch.Tensor:
        """``[B, 48, 1, h, w]`` (or ``[48, 1, h, w]``) normalised latent -> float32 frames
        ``[B, 3, T, 16h, 16w]``, T = 1 for the first cell, 4 for later ones."""
        if z_cell.ndim == 4:
            z_cell = z_cell.unsqueeze(0)
        if z_cell.ndim != 5 or z_cell.shape[1] != self.z_dim or z_cell.shape[2] != 1:
            raise ValueError(f"a latent cell must be [B, {self.z_dim}, 1, h, w], got {tuple(z_cell.shape)}")
        z = z_cell[:, :, 0].to(device=self.device, dtype=self.dtype)
        if self.device.type == "cuda":
            z = z.contiguous(memory_format=torch.channels_last)
        prev = torch.zeros_like(z) if self._prev is None else self._prev
        with torch.autocast(device_type=self.device.type, enabled=False):
            out = self.decoder(z, prev)
        first = self.cells == 0
        self._prev = z
        self.cells += 1
        return (out[:, :, -1:] if first else out).float()


@torch.no_grad()
def decode_clip(decoder: FastDecoder, z: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A whole latent clip ``[48, T', h, w]`` cell by cell -> float ``[3, 1 + 4(T'-1), 16h, 16w]``."""
    stream = StreamingFastDecoder(decoder, dtype)
    return torch.cat([stream.push(z[:, k : k + 1])[0] for k in range(z.shape[1])], dim=1)


# -- fitting --------------------------------------------------------------------------------------


@dataclass
class FitClip:
    """One clip for the fit: normalised latents ``[48, T', h, w]`` (float32), the VAE's decode of
    them and the raw frames, both uint8 ``[1 + 4(T'-1), 16h, 16w, 3]``."""

    clip_id: str
    latent: torch.Tensor
    vae_frames: np.ndarray
    gt_frames: np.ndarray

    def check(self) -> None:
        t = self.latent.shape[1] if self.latent.ndim == 4 else -1
        want = (1 + FRAMES_PER_CELL * (t - 1), 16 * self.latent.shape[-2], 16 * self.latent.shape[-1], 3)
        for name, arr in (("vae_frames", self.vae_frames), ("gt_frames", self.gt_frames)):
            if arr.dtype != np.uint8 or arr.shape != want:
                raise ValueError(
                    f"clip {self.clip_id}: {name} must be uint8 {list(want)} for latent "
                    f"{list(self.latent.shape)}, got {arr.dtype} {list(arr.shape)}"
                )


def _cell_frames(frames: np.ndarray, k: int) -> np.ndarray:
    """The frames of cell ``k`` in the decoder's 4 output slots: cell 0's one frame in the last."""
    if k == 0:
        return np.repeat(frames[:1], FRAMES_PER_CELL, axis=0)
    return frames[1 + FRAMES_PER_CELL * (k - 1) : 1 + FRAMES_PER_CELL * k]


def _to_video(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[B, T, H, W, 3]`` -> float ``[B, 3, T, H, W]`` in [-1, 1]."""
    return torch.from_numpy(frames).permute(0, 4, 1, 2, 3).float().div_(127.5).sub_(1.0)


def _batch(
    clips: Sequence[FitClip], rng: np.random.Generator, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    zs, prevs, vae, gt, mask = [], [], [], [], []
    for _ in range(size):
        c = clips[int(rng.integers(len(clips)))]
        k = int(rng.integers(c.latent.shape[1]))
        zs.append(c.latent[:, k])
        prevs.append(c.latent[:, k - 1] if k > 0 else torch.zeros_like(c.latent[:, 0]))
        vae.append(_cell_frames(c.vae_frames, k))
        gt.append(_cell_frames(c.gt_frames, k))
        m = torch.ones(FRAMES_PER_CELL)
        if k == 0:
            m[:-1] = 0  # the anchor cell's one frame: only the last slot is trained
        mask.append(m)
    mask_t = torch.stack(mask).view(size, 1, FRAMES_PER_CELL, 1, 1)
    return torch.stack(zs), torch.stack(prevs), _to_video(np.stack(vae)), _to_video(np.stack(gt)), mask_t


def fit_fast_decoder(
    clips: Sequence[FitClip],
    *,
    steps: int,
    batch: int = 8,
    lr: float = 2e-3,
    width: int = 64,
    gt_weight: float = 0.25,
    seed: int = 0,
    device: str = "cpu",
    checkpoint: Path | None = None,
    ckpt_every: int = 50,
    key: str = "",
    log: Callable[[int, float], None] | None = None,
) -> tuple[FastDecoder, dict[str, Any]]:
    """Train a ``FastDecoder`` on ``clips``. With ``checkpoint``: its state (weights, optimiser, step,
    ``key``) is written there every ``ckpt_every`` steps and a checkpoint of the same ``key`` is
    resumed from; the file is removed at the end. Returns the decoder (eval) and a summary."""
    if not clips:
        raise ValueError("the fast decoder needs at least one clip to fit on")
    for c in clips:
        c.check()
    torch.manual_seed(seed)
    dec = FastDecoder(clips[0].latent.shape[0], width).to(device)
    opt = torch.optim.Adam(dec.parameters(), lr=lr)
    start, losses = 0, []
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        if state.get("key") == key:
            dec.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start, losses = int(state["step"]), list(state["losses"])
    resumed = start
    dec.train()
    for step in range(start, steps):
        rng = np.random.default_rng([seed, step])
        z, prev, vae, gt, mask = (t.to(device) for t in _batch(clips, rng, batch))
        out = dec(z, prev)
        denom = mask.sum() * 3 * out.shape[-1] * out.shape[-2]
        loss = ((out - vae).pow(2) * mask).sum() / denom
        if gt_weight:
            loss = loss + gt_weight * ((out - gt).pow(2) * mask).sum() / denom
        fit_step(opt, loss, losses, log, step)
        if checkpoint is not None and (step + 1) % ckpt_every == 0 and step + 1 < steps:
            from gc25d_core.atomic import atomic_path

            with atomic_path(checkpoint) as tmp:
                torch.save(
                    {
                        "key": key,
                        "step": step + 1,
                        "losses": losses,
                        "model": dec.state_dict(),
                        "opt": opt.state_dict(),
                    },
                    tmp,
                )
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    dec.eval().requires_grad_(False).cpu()
    return dec, {
        "steps": steps,
        "resumed_from_step": resumed,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays (peak 255)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """float ``[3, T, H, W]`` in [-1, 1] -> uint8 ``[T, H, W, 3]`` (as the live loop shows it)."""
    return ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()


def heldout_psnr(decoder: FastDecoder, clips: Sequence[FitClip]) -> dict[str, float]:
    """Mean over ``clips`` of the PSNR (dB, uint8 frames) of the fast decoder's frames against the
    VAE decoder's and against the ground truth, and of the VAE decoder's against the ground truth."""
    if not clips:
        nan = float("nan")
        return {"psnr_vs_vae_db": nan, "psnr_vs_gt_db": nan, "vae_psnr_vs_gt_db": nan, "gap_db": nan}
    vs_vae, vs_gt, vae_gt = [], [], []
    for c in clips:
        frames = to_uint8(decode_clip(decoder, c.latent))
        vs_vae.append(psnr(frames, c.vae_frames))
        vs_gt.append(psnr(frames, c.gt_frames))
        vae_gt.append(psnr(c.vae_frames, c.gt_frames))
    out = {
        "psnr_vs_vae_db": float(np.mean(vs_vae)),
        "psnr_vs_gt_db": float(np.mean(vs_gt)),
        "vae_psnr_vs_gt_db": float(np.mean(vae_gt)),
    }
    out["gap_db"] = out["vae_psnr_vs_gt_db"] - out["psnr_vs_gt_db"]  # the default rule: DEFAULT_GAP_DB
    return out


def time_cells(push: Callable[[], Any], device: torch.device, cells: int, warmup: int) -> float:
    """Median seconds of ``push()`` over ``cells`` calls after ``warmup`` (device-synchronised)."""
    times = []
    for i in range(warmup + cells):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        push()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


@torch.no_grad()
def cell_seconds(
    decoder: FastDecoder,
    latent_hw: tuple[int, int],
    *,
    device: Any = "cpu",
    dtype: torch.dtype = torch.float32,
    cells: int = 20,
    warmup: int = 3,
) -> float:
    """Median seconds of one steady-state cell (latent to float frames on the device, synchronised)."""
    import copy

    dev = torch.device(device)
    stream = StreamingFastDecoder(copy.deepcopy(decoder).to(dev), dtype)
    z = torch.randn(1, stream.z_dim, 1, *latent_hw, generator=torch.Generator().manual_seed(0)).to(dev)
    return time_cells(lambda: stream.push(z), dev, cells, warmup)


# -- the file and its record ------------------------------------------------------------------------


def save_fast_decoder(decoder: FastDecoder, path: Path | str) -> str:
    """Atomic safetensors write; returns the file's SHA256."""
    from gc25d_core.hashing import sha256_file
    from gc25d_core.models.safetensors_file import save_safetensors

    tensors = {k: v.detach().float().cpu().contiguous() for k, v in decoder.state_dict().items()}
    meta = {META_KEY: json.dumps({"format": FORMAT, "z_dim": decoder.z_dim, "width": decoder.width})}
    return sha256_file(save_safetensors(tensors, path, meta))


def load_fast_decoder(
    path: Path | str, *, expected_sha256: str, device: Any = "cpu", field: str = "sha256"
) -> FastDecoder:
    """A saved fast decoder, after its SHA256 matches ``field`` (nothing unverified is parsed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from gc25d_core.hashing import sha256_file

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"fast decoder weights {path} do not exist ({field} = {expected_sha256})")
    got = sha256_file(path)
    if got != expected_sha256.lower():
        raise WeightsError(
            f"fast decoder weights {path}: sha256 {got} does not match {field} = {expected_sha256}"
        )
    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(META_KEY, "{}")
    try:
        meta = json.loads(raw)
    except ValueError:
        meta = {}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise WeightsError(f"{path}: metadata {META_KEY}={raw!r} is not a {FORMAT} file's")
    try:
        dec = FastDecoder(int(meta["z_dim"]), int(meta["width"]))
    except (KeyError, TypeError, ValueError) as e:
        raise WeightsError(f"{path}: metadata {META_KEY} field z_dim / width missing or bad ({e})") from None
    dec.load_state_dict(load_file(str(path)), strict=True)
    return dec.to(device).eval().requires_grad_(False)


def weights_file(cfg: Gc25dConfig) -> Path:
    return Path(cfg.paths.data_root) / cfg.fast_decoder.file


def record_file(cfg: Gc25dConfig) -> Path:
    """The fit's record: SHA256, the inputs key, held-out PSNRs, speed (JSON beside the weights)."""
    return weights_file(cfg).with_suffix(".json")


class _RecordHead(BaseModel):
    """What the loader needs of a record; the rest (the fit's numbers) is kept as it is."""

    model_config = ConfigDict(extra="allow")
    sha256: str
    inputs_key: str


# issue 34: deploy decodes with the fast decoder by default (on CUDA) where its held-out PSNR against
# the frames is at most this far below the VAE decoder's
DEFAULT_GAP_DB = 1.5


def default_worthy(record: dict[str, Any] | None) -> bool:
    """Whether a fit's record earns the fast decoder the default: its held-out ``gap_db`` (the VAE
    decoder's PSNR vs the frames minus the fast decoder's) is at most ``DEFAULT_GAP_DB``."""
    gap = None if record is None else record.get("gap_db")
    return isinstance(gap, int | float) and gap <= DEFAULT_GAP_DB


def read_record(cfg: Gc25dConfig) -> dict[str, Any] | None:
    """The record, or None when there is none; an error naming the file and the field otherwise."""
    path = record_file(cfg)
    if not path.is_file():
        return None
    try:
        return _RecordHead.model_validate_json(path.read_bytes()).model_dump()
    except ValidationError as e:
        why = "; ".join(f"field {'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}" for x in e.errors())
        raise WeightsError(f"{path}: not a fast decoder record ({why})") from None


def load_fast_decoder_for(cfg: Gc25dConfig, device: Any = "cpu") -> FastDecoder:
    """The fast_decoder asset's fit of this config, checked against its record's SHA256."""
    rec = read_record(cfg)
    if rec is None:
        raise WeightsError(
            f"{record_file(cfg)} does not exist: --decoder fast needs the fast_decoder asset "
            "(materialize fast_decoder first)"
        )
    return load_fast_decoder(
        weights_file(cfg),
        expected_sha256=rec["sha256"],
        device=device,
        field=f"'sha256' in {record_file(cfg)}",
    )
