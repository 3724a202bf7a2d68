"""Training-cache consumer throughput vs the hash bound and an unverified tarfile read (issue 5).

Builds a local store of gc25d_training_cache_v1 shards (random bf16 latents), then measures on
the same bytes, in the same run, all from the page cache (best of ``--reps``, measured round-robin):

  hash_single_pass   one SHA256 pass over every TAR byte, one thread
  hash_required      the hashing the contract requires and nothing else: SHA256 of every PT member
                     + SHA256 of the whole TAR, as two threads (the consumer's layout)
  plain_tar_bytes    tarfile 'r|' reading every member's bytes, no hashing, no torch.load
  plain_tar_load     the same + torch.load(weights_only=True) of each PT + json.loads: the
                     unverified baseline doing the same deserialisation as the consumer
  consumer_local     StreamingCache over the LocalStore, verification on (per-PT size+SHA256
                     before torch.load, structure checks, whole-TAR SHA256 at EOF, schema checks)
  consumer_http      the same over loopback HTTP (server in a subprocess: python -m
                     gc25d_core.cache serve), through the range streamer

Prints one JSON object: wall seconds and CPU seconds per measurement (best of reps), MB/s, and
the consumer's ratios to each bound (wall MB/s ratios; plus CPU-time ratios, which do not depend
on how busy the machine is).

    python bench/bench_cache.py [--shards 4] [--samples-per-shard 16] [--sample-mb 4] [--reps 5]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import queue
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gc25d_core.cache import (  # noqa: E402
    SCHEMA_GC25D,
    ConsumerConfig,
    HttpConfig,
    LocalStore,
    StreamingCache,
    open_store,
    pack_shard,
    publish_snapshot,
    read_snapshot,
)

CHUNK = 1 << 20


def build(root: Path, shards: int, per_shard: int, sample_mb: float) -> tuple[LocalStore, list[Path]]:
    store = LocalStore(root)
    w = 52
    h = max(1, round(sample_mb * (1 << 20) / (48 * 21 * 2 * w)))
    g = torch.Generator().manual_seed(0)
    for k in range(shards):
        samples = []
        for j in range(per_shard):
            i = k * per_shard + j
            sid = f"bench__run{i % 7}__{i:06d}"
            t = {
                "latent": torch.randn(48, 21, h, w, generator=g).to(torch.bfloat16),
                "actions_block": torch.randint(0, 255, (21, 5), dtype=torch.uint8, generator=g),
            }
            meta = {
                "clip_id": sid,
                "subset": "bench",
                "scene": "bench",
                "run": f"run{i % 7}",
                "start": 96 * i,
                "prompts": ["p"] * 21,
            }
            samples.append((sid, t, meta))
        pack_shard(
            store, worker="bench", name=f"bench-{k:06d}", samples=samples, schema=SCHEMA_GC25D, validate=False
        )
    publish_snapshot(store, deep_verify=False)
    m = read_snapshot(store).manifest
    return store, [store.root / s.path for s in m.shards]


def hash_single_pass(files: list[Path]) -> None:
    for p in files:
        h = hashlib.sha256()
        with open(p, "rb", buffering=0) as f:
            while b := f.read(CHUNK):
                h.update(b)
        h.hexdigest()


def hash_required(files: list[Path], pt_ranges: dict[Path, list[tuple[int, int]]]) -> None:
    """Only the hashing the contract requires, with the consumer's I/O pattern: 1 MiB reads, the
    whole-TAR SHA256 on a helper thread, each PT's SHA256 over its slices on the main thread."""
    for p in files:
        q: queue.Queue[bytes | None] = queue.Queue(maxsize=32)

        def whole(q: queue.Queue[bytes | None] = q) -> None:
            h = hashlib.sha256()
            while (b := q.get()) is not None:
                h.update(b)
            h.hexdigest()

        t = threading.Thread(target=whole)
        t.start()
        ranges = iter(pt_ranges[p])
        cur = next(ranges, None)
        h = hashlib.sha256()
        pos = 0
        with open(p, "rb", buffering=0) as f:
            while b := f.read(CHUNK):
                q.put(b)
                mv = memoryview(b)
                end = pos + len(b)
                while cur is not None and cur[0] < end:
                    a, n = cur
                    lo, hi = max(a, pos), min(a + n, end)
                    if lo < hi:
                        h.update(mv[lo - pos : hi - pos])
                    if a + n <= end:
                        h.hexdigest()
                        h = hashlib.sha256()
                        cur = next(ranges, None)
                    else:
                        break
                pos = end
        q.put(None)
        t.join()


def plain_tar(files: list[Path], load: bool) -> None:
    for p in files:
        with open(p, "rb", buffering=0) as f, tarfile.open(fileobj=f, mode="r|", bufsize=CHUNK) as tf:
            for ti in tf:
                data = tf.extractfile(ti).read()  # type: ignore[union-attr]
                if load:
                    if ti.name.endswith(".pt"):
                        torch.load(io.BytesIO(data), weights_only=True)
                    else:
                        json.loads(data)
                tf.members = []


def consume(store, ref, n_expected: int) -> None:
    ds = StreamingCache(
        store, ConsumerConfig(batch_size=1), manifest=ref, rank=0, world_size=1, collate_fn=None
    )
    n = 0
    for b in ds.iter_batches():
        n += len(b)
        ds.mark_consumed(b)
    assert n == n_expected, (n, n_expected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--samples-per-shard", type=int, default=16)
    ap.add_argument("--sample-mb", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(dir=args.workdir)
    store, files = build(Path(tmp.name) / "store", args.shards, args.samples_per_shard, args.sample_mb)
    snap = read_snapshot(store)
    total = sum(p.stat().st_size for p in files)
    n_samples = snap.manifest.totals.per_split["train"]
    pt_ranges: dict[Path, list[tuple[int, int]]] = {}
    for p in files:
        with tarfile.open(p, "r:") as tf:
            pt_ranges[p] = [(ti.offset_data, ti.size) for ti in tf.getmembers() if ti.name.endswith(".pt")]

    for p in files:  # warm the page cache
        p.read_bytes()
    load_before = os.getloadavg()
    srv = subprocess.Popen(
        [sys.executable, "-m", "gc25d_core.cache", "serve", str(store.root)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    try:
        assert srv.stdout is not None
        url = json.loads(srv.stdout.readline())["url"]
        http = open_store(url, config=HttpConfig())
        runs = {
            "hash_single_pass": lambda: hash_single_pass(files),
            "hash_required": lambda: hash_required(files, pt_ranges),
            "plain_tar_bytes": lambda: plain_tar(files, load=False),
            "plain_tar_load": lambda: plain_tar(files, load=True),
            "consumer_local": lambda: consume(store, snap.ref, n_samples),
            "consumer_http": lambda: consume(http, snap.ref, n_samples),
        }
        # round-robin, best of reps: slow drift or a noisy neighbour hits every variant alike.
        # CPU seconds (all threads of this process) are reported too: they do not depend on how
        # busy the machine is (the HTTP server's own CPU, in its subprocess, is not included).
        res: dict[str, float] = dict.fromkeys(runs, float("inf"))
        cpu: dict[str, float] = dict.fromkeys(runs, float("inf"))
        for _ in range(args.reps):
            for name, fn in runs.items():
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                res[name] = min(res[name], time.perf_counter() - t0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
    finally:
        srv.terminate()
        srv.wait(timeout=10)

    mbs = {k: total / v / 1e6 for k, v in res.items()}
    ratios = {}
    for c in ("consumer_local", "consumer_http"):
        for b in ("hash_required", "hash_single_pass", "plain_tar_load", "plain_tar_bytes"):
            ratios[f"{c}/{b}"] = round(mbs[c] / mbs[b], 3)
    for c in ("consumer_local", "consumer_http"):
        ratios[f"{c}/hash_required (cpu)"] = round(cpu["hash_required"] / cpu[c], 3)
        ratios[f"{c} cpu / (hash_required + plain_tar_load) cpu"] = round(
            cpu[c] / (cpu["hash_required"] + cpu["plain_tar_load"]), 3
        )
    out = {
        "bench": "cache_consumer",
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "data": {
            "shards": args.shards,
            "samples": n_samples,
            "sample_mb": round(pt_ranges[files[0]][0][1] / 1e6, 3),
            "total_mb": round(total / 1e6, 1),
            "reps": args.reps,
            "source": "page cache",
        },
        "seconds": {k: round(v, 4) for k, v in res.items()},
        "cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
        "mb_per_s": {k: round(v, 1) for k, v in mbs.items()},
        "ratios": ratios,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
