"""Temp files of killed shard writers: a pack killed with SIGKILL mid-write leaves its temp TAR in
the store; the next publish removes it (and only it: a live writer's temp file stays)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gc25d_core.cache import (
    SCHEMA_GC25D,
    LocalStore,
    SplitRule,
    pack_shard,
    publish_snapshot,
    verify_snapshot,
)

ROOT = Path(__file__).resolve().parents[2]

# Packs one shard whose third sample never comes: the TAR is half written when the parent looks.
_BLOCKED_PACKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from gc25d_core.cache import SCHEMA_GC25D, LocalStore, pack_shard

    root, name, ready = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def samples():
        for i in range(2):
            sid = f"scene__r0__{i:06d}"
            tensors = {"latent": torch.zeros(48, 21, 1, 1, dtype=torch.bfloat16),
                       "actions_block": torch.zeros(21, 5, dtype=torch.uint8)}
            meta = {"clip_id": sid, "subset": "s", "scene": "scene", "run": "r0", "start": i,
                    "prompts": ["p"] * 21}
            yield sid, tensors, meta
        ready.write_text("writing")
        time.sleep(600)

    pack_shard(LocalStore(root), worker="w0", name=name, samples=samples(), schema=SCHEMA_GC25D)
    """
)


def _start_blocked_packer(root: Path, name: str, tmp_path: Path) -> subprocess.Popen:
    ready = tmp_path / f"{name}.ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_PACKER, str(root), name, str(ready)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, f"packer exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "packer never started writing"
        time.sleep(0.05)
    return proc


def _temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".tmp-*"))


def test_publish_sweeps_a_killed_packers_temp_shard_but_not_a_live_ones(tmp_path, kit):
    store = LocalStore(tmp_path / "s")
    kit.pack_many(store, n_shards=1, per_shard=3)
    killed = _start_blocked_packer(store.root, "killed", tmp_path)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    (left,) = _temp_files(store.root)
    assert left.parent == store.root / ".gc25d" / "tmp" and left.stat().st_size > 0
    live = _start_blocked_packer(store.root, "live", tmp_path)
    try:
        live_tmp = [p for p in _temp_files(store.root) if p != left]
        assert len(live_tmp) == 1
        res = publish_snapshot(store, split_rule=SplitRule(method="explicit", val_groups=kit.VAL_RUNS))
        assert res.version == 1 and res.added_samples == 3 and not res.rejected
        assert _temp_files(store.root) == live_tmp  # the dead writer's file is gone, the live one's kept
        assert verify_snapshot(store, deep=True).ok
    finally:
        live.kill()
        live.wait(timeout=60)
    # the killed shard packs again from scratch and publishes; nothing temporary is left
    samples = [kit.gc_sample(i, "r1") for i in range(100, 102)]
    pack_shard(store, worker="w0", name="killed", samples=samples, schema=SCHEMA_GC25D)
    assert publish_snapshot(store).added_samples == 2
    assert _temp_files(store.root) == []
    assert verify_snapshot(store, deep=True).ok
