"""A DeepSpeed checkpoint engine that deserialises state as data only, after a SHA256 check.

DeepSpeed's default engine (``TorchCheckpointEngine``) loads every model and ZeRO optimizer-state
file through torch.load with ``weights_only`` off: whoever can write into a run's state folder gets code
run at the next resume. ``install_safe_checkpoint_engine`` replaces it on a built DeepSpeed engine
(``engine.checkpoint_engine``, which ``save_checkpoint``, ``load_checkpoint``, its state-dict
loader and the ZeRO optimizer-state loader all call) with ``SafeCheckpointEngine``:

- ``save`` writes with ``torch.save`` as before and records each file's SHA256 (``recording``);
- ``load`` reads the bytes, compares them with the recorded SHA256 (``expecting``) and hands them to
  ``torch.load(weights_only=True)`` with exactly the DeepSpeed classes ZeRO-1/2 state holds
  allowlisted for that load (``DEEPSPEED_STATE_CLASSES``), see gc25d_core.checkpoint.load_torch.

accelerate's ``save_state`` / ``load_state`` with a DeepSpeed plugin go through the same
``engine.save_checkpoint`` / ``load_checkpoint``, so an accelerate engine installs this on the
DeepSpeedEngine that ``accelerator.prepare`` returns. Imports DeepSpeed: import it lazily.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from gc25d_core.checkpoint import DIGESTS, StateFileError, check_state_name, load_torch, save_torch

# What DeepSpeed pickles into ZeRO-1/2 optimizer-state files besides tensors and containers, for
# the bf16 and fp32 modes our configs generate (model-state files hold only tensors, sizes, dicts):
# the static loss scaler (cur_scale, dynamic), the ZeRO stage enum, per-parameter fragment offsets.
# All three are plain data classes, rebuilt from their saved attributes without calling any code.
DEEPSPEED_STATE_CLASSES: tuple[type, ...] = (LossScaler, ZeroStageEnum, fragment_address)

ENGINE_NAME = "Gc25dSafeCheckpointEngine"


def _key(path: str | Path) -> str:
    return os.path.abspath(path)


class SafeCheckpointEngine(CheckpointEngine):
    """DeepSpeed's torch checkpoint engine with hash-recorded saves and weights-only, hash-checked loads."""

    def __init__(self, zipfile_serialization: bool = True):
        super().__init__(None)
        self.name = ENGINE_NAME
        self.zipfile_serialization = zipfile_serialization
        self.written: dict[str, str] = {}  # absolute path -> SHA256 of what save() wrote
        self.expected: dict[str, str] | None = None  # absolute path -> SHA256 a load must match

    def create(self, info: CheckpointCommitInfo) -> None:
        pass

    def commit(self, info: CheckpointCommitInfo) -> bool:
        return True  # files are complete when save() returns; the step folder commits atomically

    def save(self, state_dict: Any, path: str) -> None:
        self.written[_key(path)] = save_torch(state_dict, Path(path), zipfile=self.zipfile_serialization)

    def load(self, path: str, map_location: Any = None) -> Any:
        return load_torch(
            Path(path),
            self._expected_sha256(path),
            map_location=map_location,
            allowed=DEEPSPEED_STATE_CLASSES,
        )

    def _expected_sha256(self, path: str) -> str | None:
        if self.expected is None:
            return None  # outside ``expecting``: no record to check, the weights-only unpickler alone
        digest = self.expected.get(_key(path))
        if digest is None:
            raise StateFileError(f"{path}: DeepSpeed asked for a file the state's {DIGESTS} does not list")
        return digest

    @contextlib.contextmanager
    def recording(self, folder: Path) -> Iterator[dict[str, str]]:
        """Yields a dict that, on exit, maps each file saved under ``folder`` (relative name) to its SHA256."""
        self.written = {}
        digests: dict[str, str] = {}
        yield digests
        root = Path(_key(folder))
        for path, digest in self.written.items():
            digests[Path(path).relative_to(root).as_posix()] = digest
        self.written = {}

    @contextlib.contextmanager
    def expecting(self, folder: Path, digests: Mapping[str, str]) -> Iterator[None]:
        """Loads inside must be files of ``folder`` listed in ``digests`` (relative name -> SHA256)."""
        self.expected = {
            _key(folder / check_state_name(n, str(folder / DIGESTS))): d for n, d in digests.items()
        }
        try:
            yield
        finally:
            self.expected = None


def install_safe_checkpoint_engine(engine: Any) -> SafeCheckpointEngine:
    """Replace the DeepSpeedEngine's checkpoint engine (after ``deepspeed.initialize``); idempotent.
    Only DeepSpeed's plain torch engine is replaced: the fast / decoupled writers a config may select
    have other save semantics, so they are refused rather than silently swapped."""
    current = engine.checkpoint_engine
    if isinstance(current, SafeCheckpointEngine):
        return current
    if type(current) is not TorchCheckpointEngine:
        raise ValueError(
            f"DeepSpeed selected checkpoint engine {type(current).__name__}; only TorchCheckpointEngine "
            "is replaced by the weights-only one (remove checkpoint.writer / datastates from the config)"
        )
    safe = SafeCheckpointEngine(bool(current.zipfile_serialization))
    engine.checkpoint_engine = safe
    return safe
