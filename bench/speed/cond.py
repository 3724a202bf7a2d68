"""CPU throughput of cond construction per clip per core (issue 4): read ids.png, resample_ids,
label_parts, np.savez_compressed — one process, one thread. Prints JSON lines.

    python -m gc25d_core.codeworld generate /tmp/full_raw --preset full   # 1280×704 code-world runs
    OMP_NUM_THREADS=1 python -m bench.speed.cond --raw /tmp/full_raw --clips 2
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from gc25d_core.config import load_config
from gc25d_core.geometry import resample_ids
from gc25d_core.index import build_and_write, read_index
from gc25d_core.layout import Layout
from gc25d_core.preprocess.clips import build_cond
from gc25d_core.preprocess.tasks import RunCache
from gc25d_core.raw_frames import read_frame_json, read_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", type=Path, required=True)
    ap.add_argument("--clips", type=int, default=2)
    ap.add_argument("--preset", default="v10")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_cond_"))
    cfg = load_config(
        args.preset,
        {
            "paths": {"data_root": str(tmp / "data")},
            "raw": {"root": str(args.raw)},
            "index": {"allow_missing_val_runs": True, "drop_lists": []},
        },
    )
    build_and_write(args.raw, cfg)
    rows = sorted(read_index(Layout(cfg.paths.data_root)), key=lambda r: r.clip_id)[: args.clips]
    runs = RunCache(Path(cfg.raw.root))
    print(json.dumps({"frames_hw": [cfg.geometry.dst_height, cfg.geometry.dst_width], "clips": len(rows)}))
    for row in rows:
        run = runs(row)
        t0 = time.perf_counter()
        ids = build_cond(run, row.start, cfg)
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        buf = io.BytesIO()
        np.savez_compressed(buf, ids=ids)
        t_save = time.perf_counter() - t0
        # split of the build: PNG read + resample alone
        t0 = time.perf_counter()
        for f in range(row.start, row.start + cfg.timeline.num_frames):
            resample_ids(read_ids(run, f), cfg.geometry)
            read_frame_json(run, f)
        t_read = time.perf_counter() - t0
        print(
            json.dumps(
                {
                    "clip": row.clip_id,
                    "s_per_clip": t_build + t_save,
                    "build_s": t_build,
                    "of_which_read_resample_json_s": t_read,
                    "label_parts_s": t_build - t_read,
                    "savez_compressed_s": t_save,
                    "npz_bytes": buf.tell(),
                    "character_px_frac": float(np.isin(ids, list(range(10, 22))).mean()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
