"""A live session: the code world (``world.LiveWorld``) feeding the runtime (``runtime.DeployRuntime``).

    session = open_session(export, cfg, ...)   # export, text table and VAE of a preset, verified
    frames0 = session.start()                  # anchor: the world's frame 0 render, or an image
    out = session.step(block)                  # one 0.25 s action block -> that cell's frames + ids

The anchor is encoded by the VAE (fp32, as the latents were) as the clean TI2V cell 0; its ids
are the world's frame 0. ``step`` validates the block (``text.check_block``: a value out of range
fails naming the field), advances the world by it, and runs the cell.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.deploy.runtime import CellOut, DeployRuntime, RuntimeOptions
from gc25d_core.deploy.world import LiveWorld, WorldConfig
from gc25d_core.models.loading import WeightsError


def read_anchor_image(path: Path | str, cfg: Gc25dConfig) -> np.ndarray:
    """An image file -> RGB uint8 [dst_h, dst_w, 3] (area-resized to the preset's frames)."""
    import cv2

    path = Path(path)
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"anchor image {path} cannot be read (missing or not an image)")
    g = cfg.geometry
    img = cv2.resize(img, (g.dst_width, g.dst_height), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))


@dataclass
class StepOut:
    cell: int
    block: np.ndarray
    key: str
    cond: np.ndarray | torch.Tensor  # uint8 [4, H, W] the cell's condition (host, or on its way there)
    out: CellOut
    ready: Any = None  # the CUDA event after which ``cond``, a pinned host copy, is filled

    @property
    def ids(self) -> np.ndarray:
        """The condition on the host (the page shows it)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        if isinstance(self.cond, torch.Tensor):
            self.cond = self.cond.cpu().numpy()
        return self.cond


def host_copy(ids: np.ndarray | torch.Tensor, stream: Any = None) -> tuple[np.ndarray | torch.Tensor, Any]:
    """Ids rendered on a GPU start their way to the host now, queued right behind their render on
    ``stream`` (the world's; default the current one): a copy asked for later, or on the stream of
    the cell's work, would queue behind that work — and behind a deferred commit, which would hold
    the cell's message back by that commit. (host tensor, its CUDA event)."""
    if not isinstance(ids, torch.Tensor) or not ids.is_cuda:
        return ids, None
    stream = stream if stream is not None else torch.cuda.current_stream(ids.device)
    host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
    with torch.cuda.stream(stream):
        host.copy_(ids, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    return host, done


class LiveSession:
    def __init__(
        self, runtime: DeployRuntime, world: LiveWorld, encoder: Any, anchor_rgb: np.ndarray | None = None
    ):
        self.runtime, self.world, self.encoder = runtime, world, encoder
        self.anchor_rgb = anchor_rgb
        self.ids0: np.ndarray | None = None
        self._latent: torch.Tensor | None = None

    def prepare(self) -> None:
        """Load-time work of ``start``: the world's frame 0 (its RGB is a CPU ray cast of seconds at
        832×480), the anchor's VAE encode (both depend on the config alone, so they are kept and
        every ``start`` after this only resets the world and prefills the anchor), the world's
        compile and the runtime's warm-up (``DeployRuntime.warm_up``: graphs, autotune)."""
        from gc25d_core.models.vae import encode_frames

        if self._latent is not None:
            return
        self.world.warm_up()
        rgb, ids0, key0 = self.world.reset(with_rgb=self.anchor_rgb is None)
        anchor = self.anchor_rgb if self.anchor_rgb is not None else rgb
        assert anchor is not None
        self._latent = encode_frames(self.encoder, anchor[None])[None]  # [1, 48, 1, h, w]
        self.runtime.warm_up(self._latent, ids0, key0)  # graphs + autotune (GPU), before any frame

    @property
    def anchor_latent(self) -> torch.Tensor:
        """The anchor's VAE encode ``[1, 48, 1, h, w]``, every ``start``'s cell 0."""
        self.prepare()
        assert self._latent is not None
        return self._latent

    def start(self) -> list[np.ndarray]:
        self.prepare()
        rgb, ids0, key0 = self.world.reset(with_rgb=self.anchor_rgb is None)  # frame 0 is kept
        anchor = self.anchor_rgb if self.anchor_rgb is not None else rgb
        assert anchor is not None and self._latent is not None
        self.anchor_frame = anchor
        self.ids0 = ids0
        return self.runtime.start(self._latent, ids0, key0)

    def step(self, block: Any) -> StepOut:
        t0 = time.perf_counter()
        block = np.asarray(block)
        ids4, key = self.world.advance(block)
        if self.runtime.timing:  # the world's device work counted as the world's, not the denoise's
            self.runtime.sync()
        world_s = time.perf_counter() - t0
        cond, ready = host_copy(ids4, self.world.stream)
        out = self.runtime.step(ids4, key, world_s=world_s)
        return StepOut(out.cell, block.astype(np.uint8), key, cond, out, ready)


def resolve_decoder(wanted: str, device: torch.device, record: dict[str, Any] | None) -> str:
    """``RuntimeOptions.decoder``'s ``auto`` (the CLI's default) for a session on ``device``: the fast
    decoder on CUDA where the fast_decoder asset's record earns it the default (issue 34: its held-out
    PSNR vs the frames within ``models.fast_decoder.DEFAULT_GAP_DB`` of the VAE decoder's), else the
    VAE (on a CPU the VAE stays: the levers' defaults are the GPU's). ``vae`` / ``fast`` stay."""
    from gc25d_core.models.fast_decoder import default_worthy

    if wanted != "auto":
        return wanted
    return "fast" if device.type == "cuda" and default_worthy(record) else "vae"


def open_session(
    export: Path | str,
    cfg: Gc25dConfig,
    *,
    world: WorldConfig | None = None,
    options: RuntimeOptions | None = None,
    anchor_image: Path | str | None = None,
    device: str | torch.device | None = None,
    expected_sha256: str | None = None,
) -> LiveSession:
    """The session of a preset: its text table, its VAE (weights verified), the export."""
    from gc25d_core.models.vae import build_vae_for
    from gc25d_core.text import load_text_table

    dev = torch.device(device or ("cuda" if cfg.device == "cuda" and torch.cuda.is_available() else "cpu"))
    vae = build_vae_for(cfg, dev)
    table = load_text_table(cfg)
    from gc25d_core.models.fast_decoder import load_fast_decoder_for, read_record

    fast, record = None, read_record(cfg)
    if options is not None and options.decoder == "auto":
        options = options.model_copy(update={"decoder": resolve_decoder("auto", dev, record)})
    asked = options is not None and options.decoder == "fast"
    if asked or record is not None:  # the fast_decoder asset's, SHA256 checked
        try:
            fast = load_fast_decoder_for(cfg, dev)
        except WeightsError:
            if asked:
                raise  # else the session decodes with the VAE, without the page's switch to it
    runtime = DeployRuntime.load(
        export,
        table,
        vae,
        vocab=cfg.vocab,
        device=dev,
        expected_sha256=expected_sha256,
        options=options,
        fast_decoder=fast,
    )
    anchor = read_anchor_image(anchor_image, cfg) if anchor_image is not None else None
    # the world renders its ids where the model reads them (torch renderer) or on the CPU (numpy)
    session = LiveSession(runtime, LiveWorld(world or WorldConfig(), cfg.geometry, device=dev), vae, anchor)
    session.prepare()
    return session
