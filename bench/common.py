"""Shared by the benchmarks: the repository root, torchrun launches through the real entry points, and
the MFU convention (plain_zero2.py's, research/h200_baseline.md): model FLOPs of the DiT blocks only,
2·P·s for the matmuls plus 4·L·s²·d self-attention and 4·L·s·T·d cross-attention per forward, ×3 for
forward + backward, against the H200's dense bf16 989 TFLOP/s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEAK_TFLOPS = 989.0


def bench_env() -> dict[str, str]:
    """This environment, with DeepSpeed's compiled ops cached in the repo (built once per machine)."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    return env


def cpu_threads(n: int) -> None:
    """A quality script's CPU work on ``n`` intra-op threads, MKL's vector-maths dispatch settled first
    (gc25d_core.numerics.resolve_vml_dispatch), as in a job's process: its numbers repeat run to run."""
    import torch

    from gc25d_core.numerics import resolve_vml_dispatch

    resolve_vml_dispatch()
    torch.set_num_threads(n)


def emit(**kw: Any) -> None:
    """One JSON line on stdout (what the benchmarks print)."""
    print(json.dumps(kw), flush=True)


def print_result(result: dict[str, Any], out: Path | None) -> dict[str, Any]:
    """A bench's result as its one JSON line on stdout, and in ``out`` when given."""
    text = json.dumps(result)
    print(text, flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return result


def stop_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """End a process started in its own session: SIGTERM to its group, SIGKILL ``grace_s`` later."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def torchrun(
    nproc: int, args: list[str], log: Path, env: dict[str, str], timeout: float | None = None
) -> tuple[int, float]:
    """``python -m torch.distributed.run --standalone`` with ``args`` from the repo root, all output
    into ``log``; (exit code, wall seconds). Past ``timeout`` seconds the launch's process group is
    ended (exit code 124), so one stuck run leaves the others their time."""
    t0 = time.perf_counter()
    # its own process group only when it may have to be ended (else Ctrl-C reaches it as before)
    proc = start_torchrun(nproc, args, log, env, own_group=timeout is not None)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, 30)
        rc = 124
    return rc, time.perf_counter() - t0


def start_torchrun(
    nproc: int, args: list[str], log: Path, env: dict[str, str], own_group: bool = False
) -> subprocess.Popen[bytes]:
    """``torchrun``'s launch without the wait: the process, all its output into ``log`` (standalone
    rendezvous on a free port, so two launches can run side by side)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    with log.open("w") as f:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=own_group
        )


def exit_on_failed_runs(rcs: dict[str, int]) -> None:
    """After a bench's summary: any run that failed or ran past its limit (exit code 124) fails the
    bench, naming each, so a suite around it cannot pass on a run that measured nothing."""
    bad = {name: rc for name, rc in rcs.items() if rc != 0}
    if bad:
        raise SystemExit(
            "runs failed: "
            + ", ".join(f"{n} ({'timed out' if rc == 124 else f'exit {rc}'})" for n, rc in bad.items())
        )


def dit_flops(
    block_params: int, tokens: int, dim: int, layers: int, text_len: int, train: bool = True
) -> float:
    """FLOPs of one clip of ``tokens`` tokens through the blocks (``train``: forward + backward)."""
    f = 2 * block_params * tokens + 4 * layers * tokens**2 * dim + 4 * layers * tokens * text_len * dim
    return 3 * f if train else f


def mfu(flops: float, seconds: float) -> float:
    """Fraction of the peak that ``flops`` in ``seconds`` is."""
    return flops / seconds / (PEAK_TFLOPS * 1e12)


def forward_flops(
    block_params: int, tokens: int, dim: int, layers: int, text_len: int, attn_pairs: float | None = None
) -> float:
    """One forward of ``tokens`` tokens through the blocks, counting ``attn_pairs`` query-key pairs of
    self-attention (default tokens², unmasked): 2·P·s + 4·L·pairs·d + 4·L·s·T·d. A masked attention
    counts only the pairs its mask allows (what a block-sparse kernel needs to do)."""
    pairs = tokens**2 if attn_pairs is None else attn_pairs
    return 2 * block_params * tokens + 4 * layers * pairs * dim + 4 * layers * tokens * text_len * dim


def short_run(steps: int, val: dict[str, Any]) -> dict[str, Any]:
    """A training bench run's cadences: ``steps`` steps logged one by one, no exports or states,
    the validation ``val``."""
    return {
        "max_steps": steps,
        "export_every": 10**6,
        "state_every": 10**6,
        "export_final": False,
        "state_final": False,
        "log_every": 1,
        "val": val,
    }


def torchrun_bench_args(ap: Any, *, root: str, nproc: int, steps: int, warm: int) -> None:
    """The arguments every torchrun training benchmark takes: its scratch root, logs folder, ranks,
    steps and the warm-up steps left out of the steady state."""
    ap.add_argument("--root", type=Path, default=Path(root))
    ap.add_argument("--out", type=Path, default=None, help="logs folder (default <root>/logs)")
    ap.add_argument("--nproc", type=int, default=nproc)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warm", type=int, default=warm, help="steps left out of the steady state")


class DeviceBench:
    """A benchmark on one device: its arguments, the device and whether it is CUDA. DiffSynth is
    imported first (the model classes load through it)."""

    def __init__(self, args: Any):
        import torch

        from gc25d_core.compat import import_diffsynth

        import_diffsynth()
        self.args = args
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
