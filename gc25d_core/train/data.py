"""Training data from the cache: samples after the SPEC §7 dropouts, micro-batches, rank lockstep.

The consumer (``StreamingCache``, split ``train``) stays pinned to one snapshot for the whole run. Per-
sample dropouts (masking.py: text → NULL ×21, cond → ids all 255, UNKNOWN masking) run in the
DataLoader worker with a generator seeded by (seed, epoch, sample id), so a sample gets the same
draw whichever worker or rank reads it and however often a restart re-reads its shard. Ranks stay in
lockstep: at each epoch start every rank takes min over ranks of ⌊remaining / micro_batch⌋ micro-
batches, then all advance the epoch together (a drop-last of at most a few samples per epoch).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import all_reduce, world_size
from gc25d_core.hashing import seed_int
from gc25d_core.stage_config import DataConfig, DropoutConfig
from gc25d_core.text import prompt_keys
from gc25d_core.vocab import UNKNOWN, check_ids


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed_int(*parts))


# ============================================================================== samples


@dataclass
class TrainingSample:
    """One training clip after the dropouts: latent bf16 [48,21,H,W], ids uint8 [81,h,w], 21 text keys."""

    sample_id: str
    latent: torch.Tensor
    ids: torch.Tensor
    keys: list[str]
    text_dropped: bool = False
    cond_dropped: bool = False
    masked: bool = False
    masked_frac: float = 0.0
    # the rollout extension (cells 21..27) where the clip has one: ids uint8 [28,h,w], 7 text keys
    ext_ids: torch.Tensor | None = None
    ext_keys: list[str] | None = None

    def pin_memory(self) -> TrainingSample:
        """Called by the DataLoader's pin thread (``pin_memory=True``), so the trainer's host-to-device
        copies can be non-blocking."""
        ext = None if self.ext_ids is None else self.ext_ids.pin_memory()
        return dataclasses.replace(
            self, latent=self.latent.pin_memory(), ids=self.ids.pin_memory(), ext_ids=ext
        )

    def all_ids(self) -> torch.Tensor:
        """The clip's ids for every cell it has: [81 (+28), h, w] (cells 0..20, then 21..27)."""
        return self.ids if self.ext_ids is None else torch.cat([self.ids, self.ext_ids])

    def all_keys(self) -> list[str]:
        return self.keys if self.ext_keys is None else [*self.keys, *self.ext_keys]


class SampleTransform:
    """The consumer's collate_fn: runs in the DataLoader worker, one seeded draw per sample.
    ``dataset`` is the StreamingCache (set by ``attach``) whose epoch the worker copy carries."""

    def __init__(
        self,
        *,
        seed: int,
        dropout: DropoutConfig,
        prompt_to_key: dict[str, str],
        cfg: Gc25dConfig,
        meta_root: Path,
        on_missing_meta: str,
    ):
        self.seed = seed
        self.dropout = dropout
        self.prompt_to_key = prompt_to_key
        self.geometry = cfg.geometry
        self.timeline = cfg.timeline
        self.vocab = cfg.vocab
        self.meta_root = meta_root
        self.on_missing_meta = on_missing_meta
        self.dataset: Any = None

    def attach(self, dataset: Any) -> SampleTransform:
        self.dataset = dataset
        dataset.collate_fn = self
        return self

    def key_of(self, prompt: str) -> str:
        try:
            return self.prompt_to_key[prompt]
        except KeyError:
            raise ValueError(f"prompt {prompt!r} is not in the text table (configs/text)") from None

    def ground_xy(self, sample: Any) -> np.ndarray | None:
        """Pooled ground points of the clip frames: from the meta the cache sample carries
        (world_to_clip, world_to_view, ground_z), else from ``meta_root``'s meta/<clip>.npz."""
        from gc25d_core.cache.samples import MASKING_META
        from gc25d_core.layout import Layout, Shapes, read_meta
        from gc25d_core.masking import masking_ground_xy

        carried = sample.tensors
        if all(k in carried for k in MASKING_META):
            meta = {k: carried[k].numpy() for k in MASKING_META}
            return masking_ground_xy(meta, self.geometry, self.timeline.num_frames)
        layout = Layout(self.meta_root)
        cid = str(sample.meta["clip_id"])
        if not layout.meta(cid).is_file():
            if self.on_missing_meta == "skip_masking":
                return None
            raise FileNotFoundError(
                f"UNKNOWN masking needs {layout.meta(cid)} (set <stage>.data.meta_root, or "
                "<stage>.data.on_missing_meta=skip_masking)"
            )
        shapes = Shapes(self.geometry, self.timeline)
        meta = read_meta(layout, cid, shapes, bool(sample.meta.get("has_ext", False)))
        return masking_ground_xy(meta, self.geometry, self.timeline.num_frames)

    def prepare(self, sample: Any) -> TrainingSample:
        from gc25d_core.masking import NUM_STATIC, DropoutRates, apply_unknown_masking, draw_dropouts
        from gc25d_core.text import NULL_KEY

        tensors = sample.tensors
        if "cond_ids" not in tensors:
            raise ValueError(
                f"{sample.key.sample_id}: the cache sample has no cond_ids (training needs the cond)"
            )
        ids = tensors["cond_ids"].numpy()
        check_ids(ids, self.vocab, f"{sample.key.sample_id}: cond_ids")  # the model skips its check
        keys = [self.key_of(p) for p in sample.meta["prompts"]]
        out = TrainingSample(sample.key.sample_id, tensors["latent"], tensors["cond_ids"], keys)
        if "cond_ext_ids" in tensors:
            out.ext_ids = tensors["cond_ext_ids"]
            check_ids(out.ext_ids.numpy(), self.vocab, f"{sample.key.sample_id}: cond_ext_ids")
            out.ext_keys = [self.key_of(p) for p in sample.meta["ext_prompts"]]
        if not self.dropout.enabled:
            return out
        epoch = int(getattr(self.dataset, "epoch", 0))
        rng = np.random.default_rng(seed_int(self.seed, "dropout", epoch, sample.key.sample_id))
        rates = DropoutRates(self.dropout.text, self.dropout.cond, self.dropout.unknown_mask)
        d = draw_dropouts(rng, rates)
        if d.text:
            out.keys, out.text_dropped = [NULL_KEY] * len(keys), True
        if d.cond:
            out.ids, out.cond_dropped = torch.full_like(out.ids, UNKNOWN), True
        elif d.unknown_mask:
            xy = self.ground_xy(sample)
            if xy is not None:
                masked, _ = apply_unknown_masking(ids, xy, rng)
                changed = masked != ids
                out.ids, out.masked = torch.from_numpy(masked), True
                out.masked_frac = float(changed.sum() / max(1, (ids < NUM_STATIC).sum()))
        return out

    def __call__(self, samples: list[Any]) -> list[TrainingSample]:
        prepared = [self.prepare(s) for s in samples]
        for s in samples:
            s.tensors = {}  # only the prepared tensors travel back from the worker
        return prepared


class MicroBatches:
    """Exactly ``micro_batch`` prepared samples (with their cache keys) per call, across cache batches."""

    def __init__(self, dataset: Any, loader: Any, micro_batch: int):
        self._it = dataset.iter_batches(loader)
        self._buf: deque[tuple[Any, TrainingSample]] = deque()
        self.micro_batch = micro_batch

    def next(self) -> list[tuple[Any, TrainingSample]]:
        while len(self._buf) < self.micro_batch:
            try:
                batch = next(self._it)
            except StopIteration:
                raise RuntimeError(
                    "the cache ran out of samples inside the epoch's step budget (a quarantined shard?)"
                ) from None
            self._buf.extend(zip(batch.keys, batch.data, strict=True))
        return [self._buf.popleft() for _ in range(self.micro_batch)]


def batch_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[B, ...]; one tensor becomes a view, so memory the DataLoader pinned stays pinned."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


# ============================================================================== the stream


class TrainingStream:
    """The pinned train split, dealt in lockstep micro-batches; its cursor is part of the run state."""

    def __init__(
        self,
        cfg: Gc25dConfig,
        data: DataConfig,
        dropout: DropoutConfig,
        *,
        seed: int,
        micro_batch: int,
        device: torch.device,
        resume: dict[str, Any] | None,
        exclude: tuple[str, ...] = (),
    ):
        from gc25d_core.cache.consumer import ConsumerConfig, StreamingCache
        from gc25d_core.cache.manifest import ManifestRef
        from gc25d_core.cache.stores import open_store

        self.store = open_store(cfg.cache.store)
        self.micro_batch, self.device, self.num_workers = micro_batch, device, data.num_workers
        ccfg = ConsumerConfig(
            split="train",
            seed=data.seed,
            batch_size=micro_batch,
            interleave=data.interleave,
            on_shard_failure=data.on_shard_failure,
            extra_exclude_sample_ids=exclude,
        )
        manifest: Any = data.manifest_version
        if resume is not None:
            manifest = ManifestRef.model_validate(resume["manifest"])
        self.ds = StreamingCache(self.store, ccfg, manifest=manifest)
        if resume is not None:
            self.ds.load_state_dict(resume)
        self.prompt_to_key = prompt_keys(cfg)
        SampleTransform(
            seed=seed,
            dropout=dropout,
            prompt_to_key=self.prompt_to_key,
            cfg=cfg,
            meta_root=Path(data.meta_root or cfg.paths.data_root),
            on_missing_meta=data.on_missing_meta,
        ).attach(self.ds)
        self._iter: MicroBatches | None = None
        self.epoch_budget = self._epoch_budget()

    @property
    def manifest_ref(self) -> Any:
        return self.ds.manifest_ref

    @property
    def epoch(self) -> int:
        return int(self.ds.epoch)

    def _epoch_budget(self) -> int:
        """Micro-batches every rank takes from this epoch: min over ranks of remaining // micro_batch."""
        (n,) = all_reduce([self.ds.rank_remaining() // self.micro_batch], self.device, op="min")
        return int(n)

    def _loader(self) -> Any:
        if self.num_workers == 0:
            return None
        from torch.utils.data import DataLoader

        return DataLoader(
            self.ds, batch_size=None, num_workers=self.num_workers, pin_memory=self.device.type == "cuda"
        )

    @property
    def epoch_ends(self) -> bool:
        """The next ``next_micro`` starts a new epoch (mark the closing epoch's keys first: sample
        keys carry no epoch, so marked later they would land in the new epoch's bitmask)."""
        return self.epoch_budget <= 0

    def next_micro(self) -> list[tuple[Any, TrainingSample]]:
        if self.epoch_budget <= 0:
            self._iter = None
            self.ds.advance_epoch(refresh=False, require_complete=False)
            self.epoch_budget = self._epoch_budget()
            if self.epoch_budget <= 0:
                raise RuntimeError(
                    f"split 'train' has too few samples: every one of {world_size()} ranks needs at least "
                    f"micro_batch={self.micro_batch} per epoch"
                )
        if self._iter is None:
            self._iter = MicroBatches(self.ds, self._loader(), self.micro_batch)
        self.epoch_budget -= 1
        return self._iter.next()

    def mark_consumed(self, keys: list[Any]) -> None:
        self.ds.mark_consumed(keys)

    def state(self) -> dict[str, Any]:
        """Collective: the cursor of every rank (written by rank 0 into the slot's data.json)."""
        return dict(self.ds.gather_state_dict())
