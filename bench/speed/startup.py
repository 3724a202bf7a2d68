"""A launched job's start: DiffSynth's model files loaded on their own (``import_diffsynth``, the
default) beside DiffSynth imported whole, as every process did before, in one run.

Two measurements, the variants alternating so that both see the same machine:

- ``import``: a fresh interpreter importing ``gc25d_core.models.gcdit`` and ``gc25d_core.models.vae``
  (what every rank that builds a GcDiT or a VAE does first); wall seconds and modules loaded.
- ``launch``: the tiny SFT (8 steps, the plain torch engine) through
  ``torchrun --nproc_per_node=N -m gc25d_core.jobs.sft``, from the launch to its exit.

The ``whole`` variant imports DiffSynth whole first, which is what ``import diffsynth`` did in every
such process: in the import probe itself, and in each rank through a ``sitecustomize`` on the
launch's PYTHONPATH (ranks only: torchrun's agent never imported DiffSynth).
Prints one JSON line per measurement, then the summary.

Usage: python3 -m bench.speed.startup [--repeats 5] [--launches 3] [--nproc 2] [--root /tmp/startup]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, bench_env, emit, exit_on_failed_runs, torchrun

VARIANTS = ("deferred", "whole")
_WHOLE = (
    "from gc25d_core.compat import import_diffsynth\n"
    "import_diffsynth()\n"
    "import diffsynth\n"
    "diffsynth.ModelConfig  # the first read runs the package initialisers: DiffSynth whole\n"
)
_TIMED = (
    "import sys, time\nt = time.perf_counter()\n{}import gc25d_core.models.gcdit, gc25d_core.models.vae\n"
)
_REPORT = "print(time.perf_counter() - t, len(sys.modules))\n"
_IMPORT_PROBE = {"deferred": _TIMED.format("") + _REPORT, "whole": _TIMED.format(_WHOLE) + _REPORT}


def variant_env(variant: str, root: Path) -> dict[str, str]:
    env = bench_env()
    if variant == "whole":
        site = root / "whole_site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import os\nif 'LOCAL_RANK' in os.environ:\n" + textwrap.indent(_WHOLE, "    ")
        )
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    return env


def time_import(variant: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    probe = [sys.executable, "-c", _IMPORT_PROBE[variant]]
    done = subprocess.run(probe, cwd=ROOT, env=bench_env(), capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    in_process_s, modules = done.stdout.splitlines()[-1].split()  # DeepSpeed may log on stdout first
    return {"process_s": round(wall, 3), "import_s": round(float(in_process_s), 3), "modules": int(modules)}


def sft_config(root: Path) -> Path:
    from gc25d_core.train.synthetic import sft_world, write_config

    world = root / "world"
    shutil.rmtree(world, ignore_errors=True)
    section = {"max_steps": 8, "state_every": 8, "export_every": 8, "engine": "torch"}
    section["val"] = {"every": 8, "num_clips": 2}
    return write_config(sft_world(world, section), world / "run.yaml")


def summary(rows: list[dict[str, Any]], kind: str, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VARIANTS:
        vals = [r[key] for r in rows if r["kind"] == kind and r["variant"] == v]
        if vals:
            out[v] = {
                "median": round(statistics.median(vals), 3),
                "min": min(vals),
                "max": max(vals),
                "n": len(vals),
            }
    if len(out) == 2:
        out["whole_minus_deferred"] = round(out["whole"]["median"] - out["deferred"]["median"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/gc25d_startup"))
    ap.add_argument("--repeats", type=int, default=5, help="fresh-interpreter imports per variant")
    ap.add_argument("--launches", type=int, default=3, help="tiny SFT launches per variant (0: none)")
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    envs = {v: variant_env(v, args.root) for v in VARIANTS}
    rows: list[dict[str, Any]] = []
    for i in range(args.repeats):
        for v in VARIANTS:
            row = {"kind": "import", "variant": v, "repeat": i, **time_import(v)}
            emit(**row)
            rows.append(row)
    rcs: dict[str, int] = {}
    if args.launches:
        config = sft_config(args.root)
        for i in range(args.launches):
            for v in VARIANTS:
                run_dir = config.parent / f"run_{v}_{i}"  # inside the world (its runs root)
                shutil.rmtree(run_dir, ignore_errors=True)
                argv = ["-m", "gc25d_core.jobs.sft", "--config", str(config), "--run-dir", str(run_dir)]
                rc, wall = torchrun(args.nproc, argv, args.root / f"launch_{v}_{i}.log", envs[v], timeout=600)
                rcs[f"{v}_{i}"] = rc
                row = {"kind": "launch", "variant": v, "repeat": i, "rc": rc, "wall_s": round(wall, 3)}
                emit(**row)
                rows.append(row)
    print(
        json.dumps(
            {
                "summary": "startup",
                "nproc": args.nproc,
                "cpus": os.cpu_count(),
                "import_process_s": summary(rows, "import", "process_s"),
                "import_modules": summary(rows, "import", "modules"),
                "launch_wall_s": summary(rows, "launch", "wall_s"),
            }
        ),
        flush=True,
    )
    exit_on_failed_runs(rcs)


if __name__ == "__main__":
    main()
