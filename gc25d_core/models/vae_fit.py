"""Fit the tiny VAE to frames, so its latents keep the picture (as the real Wan2.2 VAE's do).

The tiny preset's ``TinyWanVideoVAE38`` is random: its latents are random features of the frames
(bench/quality/tiny_vae_content.py: R^2 of about 0 from the pooled RGB), so nothing trained on them can
learn what the picture depends on. ``fit_tiny_vae`` trains the same class as an autoencoder on
code-world frames for a few hundred CPU steps (MSE of decode(encode(x)); Adam 5e-4), then
sets the per-channel normalisation from the latents of the frames it saw, like the real VAE's mean /
std constants. Given a state file, the fit keeps its progress there (weights, Adam's moments, the
window draws' generator, the step) and continues from it: a fit killed part way, or one whose
``steps`` were raised, goes on where it stopped, to the same weights as a fit run in one go.
``save_tiny_vae`` writes safetensors (weights + ``norm.mean`` / ``norm.std``) and returns its
SHA256; ``load_tiny_vae`` checks that digest before building the model.

The ``tiny_vae`` asset's job (gc25d_core.preprocess.tiny_vae.run_fit) reads the train split's
frames and writes the weights and a record file (``<file>.json``: SHA256, the key of the inputs,
the fit's summary); a rerun whose inputs have the same key keeps the file. ``resolve_vae_file``
is how the VAE builder (gc25d_core.models.vae.build_vae_for) finds the weights to load: the
configured ``vae.path`` first, else the recorded fit.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gc25d_core.models.loading import WeightsError
from gc25d_core.models.vae import (
    TinyWanVideoVAE38,
    build_vae,
    count_conv3d,
    decode_video,
    encode_video,
    frames_to_video,
    lean_vae_ops,
    patchify,
    to_channels_last_3d,
    unpatchify,
)

if TYPE_CHECKING:
    from gc25d_core.config import Gc25dConfig

NORM_KEYS = ("norm.mean", "norm.std")
FIT_FORMAT = "gc25d_tiny_vae38"
FIT_VERSION = 3  # part of the inputs key: bump it when the fit's code changes what it produces
STATE_FORMAT = "gc25d_tiny_vae_fit_state"


def fit_step(
    opt: torch.optim.Optimizer,
    loss: torch.Tensor,
    losses: list[float],
    log: Callable[[int, float], None] | None,
    step: int,
) -> None:
    """One optimizer step of a small model's fit (the tiny VAE's, the fast decoder's): the loss
    recorded and handed to ``log`` with its 1-based step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(float(loss.detach()))
    if log is not None:
        log(step + 1, losses[-1])


def recon_warm(model: Any, x: torch.Tensor, scale: Any, warm: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """decode(encode(x)) of a ``VideoVAE38_`` with its first ``warm`` latent frames computed without
    gradients: (latent, reconstruction). The rest train where a whole clip's encode and decode run
    most of their frames, on causal feature caches that earlier frames filled, not on the zeros a
    window's first frames see; the warm frames cost a forward pass each and their outputs carry no
    gradient (the loss takes latent frames ``warm..`` and their image frames, ``warm_slices``).

    Written out here because DiffSynth's ``encode`` / ``decode`` have no such split: the same loops
    (the encoder over frame 0, then over 4-frame chunks, through one feature cache; ``conv1`` over all
    of it, the normalisation, ``conv2``; the decoder latent frame by latent frame through its own
    cache), so with ``warm = 0`` it gives their values bit for bit (tests/models/test_vae_fit.py)."""
    xp = patchify(x, patch_size=2)
    latents = 1 + (xp.shape[2] - 1) // 4
    grad = torch.is_grad_enabled()
    cache: list[Any] = [None] * count_conv3d(model.encoder)
    hs = []
    for i in range(latents):
        chunk = xp[:, :, :1] if i == 0 else xp[:, :, 1 + 4 * (i - 1) : 1 + 4 * i]
        with torch.set_grad_enabled(grad and i >= warm):
            h, cache, _ = model.encoder(chunk, feat_cache=cache, feat_idx=[0])
        hs.append(h)
    mu = model.conv1(torch.cat(hs, 2)).chunk(2, dim=1)[0]
    shape = (1, model.z_dim, 1, 1, 1)
    mean, inv_std = (s.to(dtype=mu.dtype, device=mu.device).view(shape) for s in scale)
    z = (mu - mean) * inv_std
    y = model.conv2(z / inv_std + mean)
    cache = [None] * count_conv3d(model.decoder)
    outs = []
    for i in range(latents):
        with torch.set_grad_enabled(grad and i >= warm):
            out, cache, _ = model.decoder(
                y[:, :, i : i + 1], feat_cache=cache, feat_idx=[0], first_chunk=i == 0
            )
        outs.append(out)
    return z, unpatchify(torch.cat(outs, 2), patch_size=2)


def warm_slices(warm: int) -> tuple[slice, slice]:
    """(latent frames, image frames) the loss takes after ``warm`` warm latent frames: latent frame
    0 is image frame 0, latent frame i > 0 image frames 4i - 3 .. 4i."""
    return slice(warm, None), slice(0 if warm == 0 else 4 * warm - 3, None)


def _draw(
    clips: Sequence[torch.Tensor], frames: int, crop: int | None, rng: np.random.Generator
) -> tuple[int, int, slice, slice]:
    """Where one random window lies: (clip, first frame, rows, columns); a random ``crop``² square of
    the frames, or all of them."""
    i = int(rng.integers(len(clips)))
    clip = clips[i]
    start = int(rng.integers(clip.shape[0] - frames + 1))
    h, w = clip.shape[1:3]
    if crop is None:
        return i, start, slice(0, h), slice(0, w)
    ch, cw = min(crop, h), min(crop, w)
    y0, x0 = int(rng.integers(h - ch + 1)), int(rng.integers(w - cw + 1))
    return i, start, slice(y0, y0 + ch), slice(x0, x0 + cw)


def _cut(
    tensors: Sequence[torch.Tensor], where: Sequence[tuple[int, int, slice, slice]], frames: int
) -> list[torch.Tensor]:
    """The windows ``_draw`` placed, cut where the tensors lie (on the fit's device, a window never
    crosses the bus: a batch of 64 cut and converted on the host costs as much as a GPU step)."""
    return [tensors[i][t : t + frames, ys, xs] for i, t, ys, xs in where]


def class_loss_weights(classes: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    """The loss weight of each raw id (float32 [256]) for ``vae.fit.class_weight`` = ``alpha``: a
    class seen in a fraction p of the pixels of ``classes`` weighs p^-alpha, scaled so that the mean
    weight over those pixels is 1 (the plain loss's scale); ids absent weigh 1. A squared error
    spends the code on the large flat regions (the ground alone is 59 % of the small world's
    pixels) while the scene's reading, a mean over classes, counts the player's 1.6 % as much."""
    counts = np.zeros(256, np.float64)
    for c in classes:
        counts += np.bincount(np.asarray(c, np.uint8).ravel(), minlength=256)
    p = counts / max(counts.sum(), 1.0)
    w = np.ones(256, np.float64)
    seen = p > 0
    w[seen] = p[seen] ** -alpha
    w[seen] /= float((p[seen] * w[seen]).sum())
    return w.astype(np.float32)


def fit_tiny_vae(
    clips: Sequence[np.ndarray],
    *,
    steps: int = 300,
    batch: int = 2,
    frames: int = 9,
    lr: float = 5e-4,
    latent_l2: float = 0.0,
    seed: int = 0,
    crop: int | None = None,
    norm_frames: int | None = None,
    log: Callable[[int, float], None] | None = None,
    device: str = "cpu",
    dim: int = 16,
    dec_dim: int = 16,
    compile: bool = False,
    fast_ops: bool = False,
    bf16: bool = False,
    seconds: float | None = None,
    state: Path | str | None = None,
    state_every_s: float = 60.0,
    state_must_match: bool = False,
    note: Callable[[str], None] | None = None,
    init: tuple[Path | str, str] | None = None,
    warm: int = 0,
    classes: Sequence[np.ndarray] | None = None,
    class_weight: float = 0.0,
) -> tuple[TinyWanVideoVAE38, dict[str, Any]]:
    """``clips``: uint8 ``[F, H, W, 3]`` arrays (F >= frames; frames = 1 + 4k). Returns the fitted
    VAE (eval, no grad, normalisation set) and a summary (first / last loss, steps). ``crop``: train
    on random square crops of that side (multiple of 16) instead of whole frames. ``norm_frames``:
    the normalisation statistics come from the first that many frames of every clip (None: all;
    encoding whole 81-frame clips costs as much as dozens of fit steps and moves them little).
    ``dim`` / ``dec_dim``: the encoder's / decoder's base widths. ``compile``: the loss through
    ``torch.compile`` (one graph, no breaks), on CUDA as CUDA graphs ("reduce-overhead").
    ``fast_ops``: the encode path's speed-ups in the fit (``lean_vae_ops``; on CUDA channels-last-3d
    conv weights and cuDNN autotuning): the same math, other rounding. ``bf16``: the loss under
    bfloat16 autocast (the weights, Adam and the loss's reduction stay float32), for the GPU's
    tensor cores: other rounding, a fit of its own key.
    ``seconds``: a time budget; the fit stops after the first step that ends past it (at most
    ``steps``), and the summary's ``steps`` says how many the weights have had.

    ``state``: the fit's progress file (``FitState``), written atomically every ``state_every_s``
    seconds of fitting and when the fit ends. One written by a fit of the same trajectory (clips,
    settings, device kind, threads: ``trajectory_key``; not ``steps``) at a step ≤ ``steps`` is
    continued: the weights equal an uninterrupted fit's, bit for bit where the fit itself is
    deterministic (the CPU; cuDNN's conv backward is not, run to run). Any other (another
    trajectory, further than ``steps``, bytes that fail its digest) is an error naming the file
    with ``state_must_match``, else the fit starts over and ``note`` says why. The summary's
    ``resumed_from`` is the step it continued from (0: a fresh fit).

    ``init``: (file, SHA256) of a fitted tiny VAE of these widths whose weights the fit starts from
    (Adam's moments fresh), to go on from another fit under other settings (longer windows: a VAE
    fitted on short ones reconstructs the later latent frames of a long clip worse). Its SHA256 is
    in the trajectory key; the file is read only by a fit that starts from step 0.

    ``warm``: each window's first ``warm`` latent frames (``1 + 4 (warm - 1)`` image frames) are
    encoded and decoded without gradients and left out of the loss (``recon_warm``), so the fit trains
    the later frames on filled feature caches, the state most of a whole clip is coded in, for a
    forward pass of the warm ones; ``frames`` counts them (``warm`` < ``1 + (frames - 1) / 4``).

    ``class_weight`` > 0 with ``classes`` (uint8 ``[F, H, W]`` per clip: each pixel's id, as
    ``collapse_parts`` gives them): each pixel's squared error weighs ``class_loss_weights`` of its
    id, so the rare classes (the player, the boss, the crates) get more of the code than their area;
    the weights and the ids are part of the trajectory key."""
    if class_weight < 0:
        raise ValueError(f"class_weight = {class_weight}: 0 (off) or more")
    if class_weight > 0:
        if classes is None or len(classes) != len(clips):
            raise ValueError("class_weight > 0 needs classes: one uint8 [F, H, W] array per clip")
        for i, (c, clip) in enumerate(zip(classes, clips, strict=True)):
            if c.shape != clip.shape[:3] or c.dtype != np.uint8:
                raise ValueError(
                    f"classes[{i}]: {c.dtype} {c.shape}, expected uint8 {tuple(clip.shape[:3])} (clip {i}'s frames)"
                )
    else:
        classes = None
    if (frames - 1) % 4 or not clips or min(c.shape[0] for c in clips) < frames:
        raise ValueError(f"need clips of at least {frames} frames and frames = 1 + 4k")
    latents = 1 + (frames - 1) // 4
    if not 0 <= warm < latents:
        raise ValueError(f"warm = {warm}: a {frames}-frame window has {latents} latent frames")
    if crop is not None and crop % 16:
        raise ValueError(f"crop = {crop}: must be a multiple of 16")
    torch.manual_seed(seed)
    vae = build_vae(tiny=True, dim=dim, dec_dim=dec_dim)
    model = vae.model.to(device).train().requires_grad_(True)
    if fast_ops:
        lean_vae_ops(model)
        if torch.device(device).type == "cuda":
            to_channels_last_3d(model)
            torch.backends.cudnn.benchmark = True  # process-wide, as the live decode sets it
    scale = [s.to(device) for s in vae.scale] if isinstance(vae.scale, (list, tuple)) else vae.scale
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    saver, start, loss_first = None, 0, None
    if state is not None:
        key = trajectory_key(
            clips, batch=batch, frames=frames, lr=lr, latent_l2=latent_l2, seed=seed, crop=crop,
            dim=dim, dec_dim=dec_dim, device=device, compile=compile, fast_ops=fast_ops, bf16=bf16,
            init=None if init is None else init[1], warm=warm, classes=classes, class_weight=class_weight,
        )  # fmt: skip
        saver = FitState(Path(state), key)
        try:
            start, loss_first = saver.restore(model, opt, rng, steps)
        except FitStateError as e:
            if state_must_match:
                raise
            if note is not None:
                note(f"{e}: the fit starts from step 0 and replaces it")
        if start and note is not None:
            note(f"the fit continues from step {start} of {saver.path}")
    if init is not None and start == 0:
        start_from_weights(model, Path(init[0]), init[1])

    latent_part, image_part = warm_slices(warm)

    on_device = [torch.from_numpy(np.ascontiguousarray(c)).to(device) for c in clips]
    cls_on_device = (
        [] if classes is None else [torch.from_numpy(np.ascontiguousarray(c)).to(device) for c in classes]
    )
    table = (
        None if classes is None else torch.from_numpy(class_loss_weights(classes, class_weight)).to(device)
    )

    def loss_of(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            z, recon = recon_warm(model, x, scale, warm)
        z, recon = z[:, :, latent_part].float(), recon[:, :, image_part].float()  # float: a no-op unless bf16
        err = (recon - x[:, :, image_part]).pow(2)
        if w is not None:  # [B, T, H, W] per pixel, over the colour channels
            err = err * w[:, None, image_part]
        return err.mean() + latent_l2 * z.pow(2).mean()

    step_loss = loss_of
    if compile:  # every window has one shape: one graph, compiled once
        mode = "reduce-overhead" if torch.device(device).type == "cuda" else None
        step_loss = torch.compile(loss_of, mode=mode, dynamic=False)
    t0 = saved_at = time.perf_counter()
    for step in range(start, steps):
        where = [_draw(on_device, frames, crop, rng) for _ in range(batch)]
        x = torch.stack([frames_to_video(v) for v in _cut(on_device, where, frames)])
        w = None if table is None else table[torch.stack(_cut(cls_on_device, where, frames)).long()]
        fit_step(opt, step_loss(x, w), losses, log, step)
        loss_first = losses[0] if loss_first is None else loss_first
        now = time.perf_counter()
        if saver is not None and now - saved_at > state_every_s:
            saver.save(model, opt, rng, step + 1, loss_first)
            saved_at = now
        if seconds is not None and now - t0 > seconds:
            break
    done = start + len(losses)
    if saver is not None:
        saver.save(model, opt, rng, done, loss_first)
    model.eval().requires_grad_(False)
    set_norm(vae, *measure_norm(model, on_device, norm_frames, scale))
    model.cpu()
    return vae, {
        "steps": done,
        "resumed_from": start,
        "loss_first": loss_first,
        "loss_last": losses[-1] if losses else None,
    }


class FitStateError(ValueError):
    """A state file that cannot be continued (another trajectory, further than asked, bad bytes)."""


def _digest(head: dict[str, Any], arrays: Sequence[np.ndarray]) -> str:
    """SHA256 of ``head`` as sorted JSON, then of each array's bytes in turn (the fit's keys)."""
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def trajectory_key(
    clips: Sequence[np.ndarray],
    *,
    batch: int,
    frames: int,
    lr: float,
    latent_l2: float,
    seed: int,
    crop: int | None,
    dim: int,
    dec_dim: int,
    device: str,
    compile: bool,
    fast_ops: bool,
    bf16: bool = False,
    init: str | None = None,
    warm: int = 0,
    classes: Sequence[np.ndarray] | None = None,
    class_weight: float = 0.0,
) -> str:
    """SHA256 of what decides a fit's weights step by step, the clips' bytes included, and of what
    sets their rounding (the device's kind, the compile, fast ops and bf16, a CPU fit's threads), so a
    continued fit is the fit run in one go (bit for bit on the CPU). ``steps`` is not in it: a
    longer fit continues a shorter one."""
    kind = torch.device(device).type
    head = {
        "format": STATE_FORMAT, "version": FIT_VERSION, "batch": batch, "frames": frames, "lr": lr,
        "latent_l2": latent_l2, "seed": seed, "crop": crop, "dim": dim, "dec_dim": dec_dim,
        "clips": [list(c.shape) for c in clips], "device": kind, "compile": compile, "fast_ops": fast_ops,
        "threads": torch.get_num_threads() if kind == "cpu" else None,
        **({"bf16": True} if bf16 else {}),  # off, out of the key: the states written before keep theirs
        **({"init": init} if init else {}),
        **({"warm": warm} if warm else {}),
        **({"class_weight": class_weight} if class_weight else {}),
    }  # fmt: skip
    return _digest(head, [*clips, *(classes if class_weight and classes is not None else [])])


class FitState:
    """A fit's progress in one safetensors file: ``model.<name>`` (the weights), ``adam.<i>.<name>``
    (Adam's per-parameter state, ``step`` included) and metadata (the trajectory key, the step, the
    window generator's state, the first loss, and ``digest``: SHA256 of every tensor's name and
    bytes, checked before anything is used, since the file may have travelled in pieces)."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key

    @staticmethod
    def digest(tensors: dict[str, torch.Tensor]) -> str:
        h = hashlib.sha256()
        for name in sorted(tensors):
            h.update(name.encode() + b"\0")
            h.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def save(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator, step: int,
        loss_first: float | None,
    ) -> None:  # fmt: skip
        from gc25d_core.models.safetensors_file import save_safetensors

        tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        for i, per_param in opt.state_dict()["state"].items():
            for name, v in per_param.items():
                tensors[f"adam.{i}.{name}"] = v.detach().cpu().contiguous()
        meta = {
            "format": STATE_FORMAT,
            "key": self.key,
            "step": str(step),
            "rng": json.dumps(rng.bit_generator.state),
            "loss_first": json.dumps(loss_first),
            "digest": self.digest(tensors),
        }
        save_safetensors(tensors, self.path, meta)

    def restore(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator, steps: int
    ) -> tuple[int, float | None]:
        """(step, first loss) of the state file loaded into ``model`` / ``opt`` / ``rng``; (0, None)
        and nothing touched when there is no file; FitStateError when it cannot be continued."""
        from safetensors import SafetensorError, safe_open

        if not self.path.is_file():
            return 0, None
        try:
            with safe_open(str(self.path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no mapping)
        except (SafetensorError, OSError) as e:
            raise FitStateError(f"{self.path}: not a readable state file ({e})") from None
        if meta.get("format") != STATE_FORMAT:
            raise FitStateError(f"{self.path}: field 'format' is {meta.get('format')!r}, not {STATE_FORMAT}")
        if meta.get("digest") != self.digest(tensors):
            raise FitStateError(f"{self.path}: its tensors do not match its field 'digest' (damaged?)")
        if meta.get("key") != self.key:
            raise FitStateError(f"{self.path}: field 'key' is another fit's (other clips or settings)")
        step = int(meta["step"]) if meta.get("step", "").isdigit() else -1
        if not 0 <= step <= steps:
            raise FitStateError(f"{self.path}: field 'step' {meta.get('step')!r} is not in 0..{steps}")
        weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("adam."):
                _, i, name = k.split(".", 2)
                per_param.setdefault(int(i), {})[name] = v
        try:
            model.load_state_dict(weights, strict=True)
            opt.load_state_dict({"state": per_param, "param_groups": opt.state_dict()["param_groups"]})
            rng.bit_generator.state = json.loads(meta["rng"])
            loss_first = json.loads(meta["loss_first"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise FitStateError(f"{self.path}: does not fit this model ({e})") from None
        return step, loss_first


def start_from_weights(model: torch.nn.Module, path: Path, sha256: str) -> None:
    """``model`` (a fit's inner VideoVAE38_) takes the weights of the fitted tiny VAE at ``path``,
    once its SHA256 is ``sha256``; another width is an error naming the file."""
    src = load_tiny_vae(path, expected_sha256=sha256, field="init sha256")
    try:
        model.load_state_dict(src.model.state_dict(), strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: its weights do not fit this fit's model (another width?): {e}") from None


def measure_norm(
    model: Any, clips: Sequence[torch.Tensor], norm_frames: int | None, scale: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean / std (CPU) of ``model.encode`` over the first ``norm_frames`` frames of each
    uint8 clip (None: whole clips) on the model's device; ``scale`` is the identity normalisation."""
    with torch.no_grad():
        zs = torch.cat(
            [model.encode(frames_to_video(c[:norm_frames])[None], scale).cpu() for c in clips]
        )  # [N, 48, T, h, w]
    return zs.mean(dim=(0, 2, 3, 4)), zs.std(dim=(0, 2, 3, 4)).clamp_min(1e-6)


def renormalise_tiny_vae(
    vae: TinyWanVideoVAE38, clips: Sequence[np.ndarray], norm_frames: int | None, device: Any = "cpu"
) -> None:
    """Measure ``vae``'s latent normalisation again on ``clips`` (uint8 ``[F, H, W, 3]``), by the
    rule the fit uses (``norm_frames``: the tiny_vae job's ``vae.fit.norm_frames``), in place: for a
    VAE whose normalisation was measured on other frames. The weights are unchanged."""
    model = vae.model.to(device)
    identity = [torch.zeros(vae.z_dim, device=device), torch.ones(vae.z_dim, device=device)]
    on_device = [torch.from_numpy(np.ascontiguousarray(c)).to(device) for c in clips]
    try:
        set_norm(vae, *measure_norm(model, on_device, norm_frames, identity))
    finally:
        model.cpu()


def set_norm(vae: TinyWanVideoVAE38, mean: torch.Tensor, std: torch.Tensor) -> None:
    """The latent normalisation (encode returns (mu - mean) / std), as WanVideoVAE38 keeps it."""
    vae.mean, vae.std = mean.float().clone(), std.float().clone()
    vae.scale = [vae.mean, 1.0 / vae.std]


def save_tiny_vae(vae: TinyWanVideoVAE38, path: Path | str) -> str:
    """Atomic safetensors write of the inner model + normalisation; returns the file's SHA256."""
    from gc25d_core.hashing import sha256_file
    from gc25d_core.models.safetensors_file import save_safetensors

    tensors = {k: v.contiguous() for k, v in vae.model.state_dict().items()}
    tensors[NORM_KEYS[0]], tensors[NORM_KEYS[1]] = vae.mean.contiguous(), vae.std.contiguous()
    meta = {"format": FIT_FORMAT, "dim": str(vae.dim)}
    if vae.dec_dim != vae.dim:  # one width: the file as before the decoder's could differ (same SHA256)
        meta["dec_dim"] = str(vae.dec_dim)
    return sha256_file(save_safetensors(tensors, path, meta))


def load_tiny_vae(
    path: Path | str, *, expected_sha256: str, device: Any = "cpu", field: str = "vae.sha256"
) -> TinyWanVideoVAE38:
    """A fitted tiny VAE, after its SHA256 matches ``field`` (safetensors only: nothing unverified
    is parsed)."""
    from safetensors import safe_open

    from gc25d_core.models.vae import check_vae_sha256

    path = Path(path)
    check_vae_sha256(path, expected_sha256, field)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no mapping)
    missing = [k for k in NORM_KEYS if k not in tensors]
    if missing:
        raise ValueError(f"{path}: not a fitted tiny VAE (missing {missing})")
    widths = {}
    for key in ("dim", "dec_dim"):  # no dec_dim: the encoder's; no dim (the first files): 16
        value = meta.get(key, meta.get("dim", "16"))
        if not value.isdigit() or int(value) < 4:
            raise ValueError(f"{path}: metadata {key}={value!r} is not a width")
        widths[key] = int(value)
    mean, std = tensors.pop(NORM_KEYS[0]), tensors.pop(NORM_KEYS[1])
    vae = build_vae(tiny=True, **widths)
    vae.model.load_state_dict(tensors, strict=True)
    set_norm(vae, mean, std)
    return vae.to(device).eval().requires_grad_(False)


@torch.no_grad()
def recon_mse(vae: TinyWanVideoVAE38, clips: Sequence[np.ndarray]) -> float:
    """Mean squared error of decode(encode(clip)) in the [-1, 1] pixel range over the given clips
    (``[T, H, W, 3]`` uint8, T = 1 + 4k; PSNR in dB = 10·log10(4 / mse))."""
    total, n = 0.0, 0
    for clip in clips:
        x = frames_to_video(clip)[None]
        r = decode_video(vae, encode_video(vae, x))
        total += float((r.clamp(-1, 1) - x).pow(2).sum())
        n += x.numel()
    return total / max(n, 1)


# -- the tiny_vae asset's job ---------------------------------------------------------------------


def fit_file(cfg: Gc25dConfig) -> Path:
    return Path(cfg.paths.data_root) / cfg.vae.fit.file


def state_file(cfg: Gc25dConfig) -> Path:
    """The fit's progress (FitState) beside the weights: a killed fit continues from it, and so
    does a fit whose ``steps`` were raised."""
    return fit_file(cfg).with_suffix(".state.safetensors")


def first_phase_files(cfg: Gc25dConfig) -> tuple[Path, Path, Path]:
    """(weights, state, record) of the first phase of a fit with ``vae.fit.then``: its weights are the
    second phase's start, kept so that a rerun (killed in the second phase, or its steps raised) does
    not fit the first again."""
    stem = fit_file(cfg).with_suffix("")
    return (
        stem.with_suffix(".first.safetensors"),
        stem.with_suffix(".first.state.safetensors"),
        stem.with_suffix(".first.json"),
    )


def record_file(cfg: Gc25dConfig) -> Path:
    """The fit's record: ``{"path", "sha256", "inputs_key", ...summary}`` (JSON) beside the weights."""
    return fit_file(cfg).with_suffix(".json")


def read_record(cfg: Gc25dConfig, path: Path | None = None) -> dict[str, Any] | None:
    path = record_file(cfg) if path is None else path
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except ValueError as e:
        raise WeightsError(f"{path}: not a tiny VAE record ({e})") from None
    if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("sha256", "inputs_key")):
        raise WeightsError(f"{path}: a tiny VAE record needs the fields 'sha256' and 'inputs_key'")
    return rec


def inputs_key(
    cfg: Gc25dConfig,
    clip_ids: Sequence[str],
    clips: Sequence[np.ndarray],
    classes: Sequence[np.ndarray] | None = None,
) -> str:
    """SHA256 of what the fit depends on: its settings (threads included: they set the reduction
    order), the clips and their frames' bytes (and their pixels' ids with ``vae.fit.class_weight``),
    so an unchanged rerun is recognised and any change refits. Where the file goes is not an input."""
    # the widths, the speed levers, warm and then joined the settings later: at their defaults (16 / 16,
    # off, 0, None) they stay out of the key, so the fits made before keep theirs and are not fitted again
    default_widths = (cfg.vae.fit.dim, cfg.vae.fit.dec_dim) == (16, 16)
    settings = cfg.vae.fit.model_dump(
        exclude={"file", "enabled", "state_every_s"}
        | ({"dim", "dec_dim"} if default_widths else set())
        | {
            k
            for k in ("compile", "fast_ops", "bf16", "warm", "then", "class_weight")
            if not getattr(cfg.vae.fit, k)
        }
    )
    head = {"format": FIT_FORMAT, "version": FIT_VERSION, "fit": settings, "clips": list(clip_ids)}
    ids: Sequence[np.ndarray] = []
    if cfg.vae.fit.class_weight > 0:
        if classes is None:
            raise ValueError("vae.fit.class_weight > 0: the key needs the clips' pixel ids (classes)")
        ids = classes
    return _digest(head, [*clips, *ids])


def uses_fitted_vae(cfg: Gc25dConfig) -> bool:
    """The tiny preset's default: a tiny VAE, no configured weights, the fit enabled."""
    return cfg.vae.tiny and cfg.vae.path is None and cfg.vae.fit.enabled


def resolve_vae_file(cfg: Gc25dConfig) -> tuple[Path, str, str] | None:
    """(weights, expected SHA256, where the digest comes from) of the VAE the config names, or None
    for the tiny random one. A configured ``vae.path`` wins; else the tiny_vae asset's record."""
    if cfg.vae.path is not None:
        if not cfg.vae.sha256:
            raise WeightsError(f"vae.path {cfg.vae.path} needs vae.sha256 (the weights are checked)")
        return Path(cfg.vae.path), cfg.vae.sha256, "vae.sha256"
    if not uses_fitted_vae(cfg):
        return None
    rec = read_record(cfg)
    if rec is None:
        raise WeightsError(
            f"{record_file(cfg)} does not exist: vae.fit.enabled needs the tiny_vae asset "
            "(materialize tiny_vae first, or set vae.path / vae.sha256)"
        )
    return fit_file(cfg), rec["sha256"], f"'sha256' in {record_file(cfg)}"
