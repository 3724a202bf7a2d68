"""Named benchmark suites: what one call of the GPU device runs, each a table of steps that Python runs
back to back under the device's 10-minute limit; JSON lines and logs go under $OUT (default
/tmp/gc25d_bench/<suite>).

    python -m bench.suites --list                 the table
    python -m bench.suites sft                    one suite (run from the repository root)
    python -m bench.suites sft2 VARIANTS          a suite's positional arguments ({1}, {2}, ... in its steps)
    python -m bench.suites sft --dry-run          the commands it would run

The GPU suites expect the wheels the device lacks in .whl/ (carry [".whl"]); they install them into
/tmp/site first. FA4 suites need the three fa4-stage calls of bench/fa4_wheels.sh first. Results,
with their dates and devices, are in docs/benchmarks.md and its reports.

A suite exits 1 when any of its steps (each a command under a timeout) times out or fails, naming the
step on stderr at once and again at the end; the later steps still run and print what they have. An
install step that fails (the wheels, FlashAttention-4) ends the suite at once: what follows needs it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from bench.common import ROOT, stop_group

PY = "{python}"  # the interpreter that runs the suite
# bench/speed/deploy.py's LOOP_LEVERS after exact (spelled here: the suite runner starts before the
# wheels it would need to import that module are installed; tests/bench keeps the two equal)
DEPLOY_LEVERS = "graphs_all_cstream_compile,graphs_all_cstream,graphs_all_defer,graphs_all_fold,graphs_all,graphs_all_defer_stream"
ENV = {
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off (device README)
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "DIFFSYNTH_SKIP_DOWNLOAD": "True",
    "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
SITE = "/tmp/site"
# flash-attn-4's package is `flash_attn`, the name DiffSynth probes for FlashAttention-2 (compat.py
# corrects that in our code; baselines/plain_zero2.py imports DiffSynth directly), so it lives in a
# folder only the FA4 runs see (its dsl_packages too: --target skips .pth files)
FA4_STAGED = Path("/tmp/fa4w")  # the fa4-stage calls copy bench/fa4_wheels.sh's folders here
FA4_SITE = "/tmp/fa4site"
FA4_PATH = (FA4_SITE, f"{FA4_SITE}/nvidia_cutlass_dsl/dsl_packages")
FA4_ARG = os.pathsep.join(FA4_PATH)  # bench/speed/sft.py's --fa4-path
GPU_TESTS = "tests/models/test_gpu_models.py"
GPU_FIELDS = "name,memory.total,memory.used,clocks.sm,driver_version"
GPU0 = {"CUDA_VISIBLE_DEVICES": "0"}
CTAS8 = {"NCCL_MAX_CTAS": "8", "NCCL_MAX_NCHANNELS": "8"}
KILL_GRACE_S = 30  # SIGTERM to a timed-out step's process group, SIGKILL this much later
_PLACEHOLDER = re.compile(r"\{(\d+|OUT|python)\}")


class SuiteError(Exception):
    """A suite that cannot run (a missing argument, a failed install): ends it with exit 1."""


@dataclass
class Ctx:
    """One run of a suite: its name, output folder, arguments and environment, the failures so far."""

    name: str
    out: Path
    args: tuple[str | None, ...]  # {1}, {2}, ...: the given argument, else the suite's default
    env: dict[str, str]
    failed: list[str] = field(default_factory=list)
    background: list[_Running] = field(default_factory=list)

    def sub(self, text: str) -> str:
        def one(m: re.Match[str]) -> str:
            key = m.group(1)
            if key == "OUT":
                return str(self.out)
            if key == "python":
                return sys.executable
            i = int(key)
            value = self.args[i - 1] if 1 <= i <= len(self.args) else None
            if value is None:
                raise SuiteError(f"suite {self.name} needs argument {i} (see --list)")
            return value

        return _PLACEHOLDER.sub(one, text)

    def fail(self, message: str) -> None:
        line = f"suite {self.name}: {message}"[:400]
        self.failed.append(line)
        print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Step:
    """One command from the repository root, ended after ``timeout_s`` seconds (SIGTERM to its process
    group, as `timeout` does, then SIGKILL); a non-zero exit or the timeout fails the suite. Its output
    goes to files under $OUT as it comes (a step cut short leaves what it printed), or to the suite's
    own stdout when it names none. Strings may hold {1}, {2}, ... (the suite's arguments), {OUT}
    and {python}."""

    cmd: tuple[str, ...]
    timeout_s: int | None  # None: no limit (the code world's generation)
    log: str | None = None  # every line of stdout (and stderr, unless `err`) to $OUT/<log>
    drop: str | None = None  # lines matching this regex left out of `log`
    jsonl: str | None = None  # the lines that start with "{" (the JSON records) to $OUT/<jsonl>
    width: int | None = None  # `jsonl` lines cut to this many characters
    err: str | None = None  # stderr to $OUT/<err> instead
    env: Mapping[str, str] = field(default_factory=dict)
    pythonpath: tuple[str, ...] = ()  # put first on PYTHONPATH
    unless: str | None = None  # skipped when this path exists (a code world kept in /tmp)
    background: bool = False  # started and left running; Wait() waits for it

    def describe(self, ctx: Ctx) -> str:
        """The step as a shell line (what --dry-run prints)."""
        words = [f"{k}={ctx.sub(v)}" for k, v in self.env.items()]
        if self.pythonpath:
            words.append("PYTHONPATH=" + os.pathsep.join([*self.pythonpath, "$PYTHONPATH"]))
        if self.timeout_s is not None:
            words += ["timeout", str(self.timeout_s)]
        line = " ".join([*words, shlex.join(ctx.sub(c) for c in self.cmd)])
        err = f" 2> {ctx.out / ctx.sub(self.err)}" if self.err else " 2>&1"
        if self.log and not self.jsonl and not self.drop:
            line += f" > {ctx.out / ctx.sub(self.log)}{err}"
        elif self.log or self.jsonl:
            line += err
            if self.log:
                line += f" | grep -v {shlex.quote(self.drop)}" if self.drop else ""
                line += (
                    f" | tee {ctx.out / ctx.sub(self.log)}"
                    if self.jsonl
                    else f" > {ctx.out / ctx.sub(self.log)}"
                )
            if self.jsonl:
                line += " | grep '^{'" + (f" | cut -c1-{self.width}" if self.width else "")
                line += f" > {ctx.out / ctx.sub(self.jsonl)}"
        if self.unless:
            line = f"[ -e {self.unless} ] || {line}"
        return line + (" &" if self.background else "")

    def __call__(self, ctx: Ctx) -> None:
        if self.unless and Path(self.unless).exists():
            print(
                f"suite {ctx.name}: {self.unless} exists, not run: {shlex.join(self.cmd)}"[:400], flush=True
            )
            return
        running = _start(self, ctx)
        if self.background:
            ctx.background.append(running)
        else:
            running.finish(ctx)


@dataclass
class _Running:
    step: Step
    cmd: list[str]
    proc: subprocess.Popen[str]
    deadline: float | None
    reader: threading.Thread | None
    files: list[IO[str]]

    def finish(self, ctx: Ctx) -> None:
        """Wait for the step (to its deadline), end its process group past it, record a failure."""
        timed_out = False
        try:
            left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            rc = self.proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, _end_group(self.proc)
        except BaseException:  # Ctrl-C: the step's processes go with the suite
            _end_group(self.proc)
            raise
        finally:
            if self.reader is not None:
                self.reader.join(timeout=10)  # a detached grandchild may hold the pipe: do not hang on it
            for f in self.files:
                f.close()
        what = shlex.join(self.cmd)
        if timed_out:
            ctx.fail(f"step timed out after {self.step.timeout_s}s: {what}")
        elif rc != 0:
            ctx.fail(f"step failed (exit {rc}): {what}")


def _end_group(proc: subprocess.Popen[str]) -> int:
    stop_group(proc, KILL_GRACE_S)
    return 124


def _route(
    stream: IO[str],
    log: IO[str] | None,
    drop: re.Pattern[str] | None,
    jsonl: IO[str] | None,
    width: int | None,
) -> None:
    try:
        for line in stream:
            if log is not None and not (drop and drop.search(line)):
                log.write(line)
                log.flush()
            if jsonl is not None and line.startswith("{"):
                body = line.rstrip("\n")
                jsonl.write((body[:width] if width else body) + "\n")
                jsonl.flush()
    except ValueError:  # the files closed under it: the step ended, a detached child still printing
        pass


def _start(step: Step, ctx: Ctx) -> _Running:
    cmd = [ctx.sub(c) for c in step.cmd]
    env = {**ctx.env, **{k: ctx.sub(v) for k, v in step.env.items()}}
    if step.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*step.pythonpath, env.get("PYTHONPATH", "")])
    files: list[IO[str]] = []

    def open_out(name: str | None) -> IO[str] | None:
        if name is None:
            return None
        f = (ctx.out / ctx.sub(name)).open("w", encoding="utf-8", errors="replace")
        files.append(f)
        return f

    log, jsonl, err = open_out(step.log), open_out(step.jsonl), open_out(step.err)
    routed = log is not None or jsonl is not None
    sys.stdout.flush()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE if routed else None,
        stderr=err if err is not None else (subprocess.STDOUT if routed else None),
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so a timeout ends torchrun's ranks too
    )
    reader = None
    if routed:
        assert proc.stdout is not None
        drop = re.compile(step.drop) if step.drop else None
        reader = threading.Thread(
            target=_route, args=(proc.stdout, log, drop, jsonl, step.width), daemon=True
        )
        reader.start()
    deadline = None if step.timeout_s is None else time.monotonic() + step.timeout_s
    return _Running(step, cmd, proc, deadline, reader, files)


@dataclass(frozen=True)
class Wait:
    """Wait for the background steps started so far (each to its own timeout)."""

    def describe(self, ctx: Ctx) -> str:
        return "wait  # for the background steps"

    def __call__(self, ctx: Ctx) -> None:
        while ctx.background:
            ctx.background.pop(0).finish(ctx)


@dataclass(frozen=True)
class Show:
    """Print lines of $OUT files (a glob, sorted) to the suite's stdout: those matching ``grep``, less
    those matching ``drop``, the first ``head`` / last ``tail`` of them, each cut to ``width``; or the
    last ``tail_chars`` characters of the file. Shows what is there: never fails the suite."""

    file: str
    grep: str | None = None
    drop: str | None = None
    head: int | None = None
    tail: int | None = None
    width: int | None = None
    tail_chars: int | None = None

    def describe(self, ctx: Ctx) -> str:
        opts = [f"{k}={v!r}" for k, v in vars(self).items() if k != "file" and v is not None]
        return f"show {ctx.out / ctx.sub(self.file)}" + (f"  ({', '.join(opts)})" if opts else "")

    def __call__(self, ctx: Ctx) -> None:
        paths = sorted(ctx.out.glob(ctx.sub(self.file)))
        if not paths:
            print(f"suite {ctx.name}: no {ctx.out / ctx.sub(self.file)}", file=sys.stderr, flush=True)
        for path in paths:
            text = path.read_text(encoding="utf-8", errors="replace")
            if self.tail_chars is not None:
                sys.stdout.write(text[-self.tail_chars :] + ("" if text.endswith("\n") else "\n"))
                continue
            lines = text.splitlines()
            if self.grep:
                lines = [ln for ln in lines if re.search(self.grep, ln)]
            if self.drop:
                lines = [ln for ln in lines if not re.search(self.drop, ln)]
            if self.head is not None:
                lines = lines[: self.head]
            if self.tail is not None:
                lines = lines[-self.tail :] if self.tail else []
            for ln in lines:
                print(ln[: self.width] if self.width else ln)
        sys.stdout.flush()


@dataclass(frozen=True)
class Tar:
    """Pack the folder ``src`` (a run's logs) into $OUT/<dest> (gzip); a missing folder is noted only."""

    dest: str
    src: str

    def describe(self, ctx: Ctx) -> str:
        return f"tar czf {ctx.out / ctx.sub(self.dest)} -C {ctx.sub(self.src)} ."

    def __call__(self, ctx: Ctx) -> None:
        src = Path(ctx.sub(self.src))
        if not src.is_dir():
            print(f"suite {ctx.name}: no {src} to pack", file=sys.stderr, flush=True)
            return
        with tarfile.open(ctx.out / ctx.sub(self.dest), "w:gz") as tar:
            tar.add(src, arcname=".")


@dataclass(frozen=True)
class Call:
    """A setup step in Python (installs, staging); its failure (SuiteError) ends the suite."""

    what: str
    fn: Callable[[Ctx], None]

    def describe(self, ctx: Ctx) -> str:
        return f"# {ctx.sub(self.what)}"

    def __call__(self, ctx: Ctx) -> None:
        self.fn(ctx)


Action = Step | Wait | Show | Tar | Call


def _pip_target(ctx: Ctx, target: str, wheels: list[Path]) -> None:
    if not wheels:
        raise SuiteError(f"suite {ctx.name}: no wheels to install into {target}")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--target", target, *map(str, wheels)]
    if subprocess.run(cmd, cwd=ROOT, env=ctx.env).returncode != 0:
        raise SuiteError(f"suite {ctx.name}: installing {len(wheels)} wheel(s) into {target} failed")


def install_wheels(ctx: Ctx) -> None:
    _pip_target(ctx, SITE, sorted((ROOT / ".whl").glob("*.whl")))


def join_split_wheel(folder: Path) -> Path:
    """The wheel bench/fa4_wheels.sh split in three (part-<wheel>.00/.01/.02), joined in ``folder`` and
    checked against its libs.sha256; the parts are removed once it is whole (a second install finds
    the joined wheel and checks it again)."""
    parts = sorted(folder.glob("part-*.0[0-2]"))
    if parts:
        names = {p.name[len("part-") : -len(".00")] for p in parts}
        if len(parts) != 3 or len(names) != 1:
            raise SuiteError(
                f"{folder}: expected the three parts of one wheel, found {[p.name for p in parts]}"
            )
        whole = folder / names.pop()
        with whole.open("wb") as f:
            for p in parts:
                with p.open("rb") as src:
                    shutil.copyfileobj(src, f)
    sums = folder / "libs.sha256"
    if not sums.is_file():
        raise SuiteError(f"{sums}: missing (the third fa4-stage call carries it)")
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        path = folder / name.lstrip("*")
        if not path.is_file():
            raise SuiteError(f"{sums}: {name} is not in {folder}")
        with path.open("rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != digest:
                raise SuiteError(f"{path}: SHA256 differs from {sums}")
    for p in parts:
        p.unlink()
    return folder


def install_fa4(ctx: Ctx) -> None:
    join_split_wheel(FA4_STAGED)
    _pip_target(ctx, FA4_SITE, sorted(FA4_STAGED.glob("*.whl")))


def stage_fa4(ctx: Ctx) -> None:
    src = Path(ctx.sub("{1}"))
    if not src.is_dir():
        raise SuiteError(f"suite {ctx.name}: {src} is not a folder (one of bench/fa4_wheels.sh's)")
    FA4_STAGED.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        shutil.copy2(f, FA4_STAGED / f.name)
    for f in sorted(FA4_STAGED.iterdir()):
        print(f"{f.stat().st_size:>12}  {f}")


# --- the steps the suites share ------------------------------------------------------------------


def py(args: str) -> tuple[str, ...]:
    """The suite's interpreter with ``args``, split as a shell would split them (no shell runs)."""
    return (PY, *shlex.split(args))


def torchrun(nproc: int, args: str) -> tuple[str, ...]:
    return py(f"-m torch.distributed.run --nproc_per_node={nproc} {args}")


INSTALL_FA4 = Call(f"join, check and install FlashAttention-4 from {FA4_STAGED} into {FA4_SITE}", install_fa4)
# the full-size code world on the CPU (kept in /tmp/full while the machine stays warm)
FULL_WORLD = Step(
    py("-m gc25d_core.codeworld generate /tmp/full --preset full --workers 24"),
    None,
    log="gen.log",
    unless="/tmp/full",
)
GPU_LINE = (
    Step(tuple(shlex.split("nvidia-smi --format=csv,noheader --query-gpu=" + GPU_FIELDS)), 60),
    Step(
        (
            PY,
            "-c",
            "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))",
        ),
        60,
    ),
)
ALLOC = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def sft_bench(name: str, limit: int, args: str) -> tuple[Action, ...]:
    """bench/speed/sft.py on 2 GPUs: JSON lines to $OUT/<name>.jsonl."""
    cmd = py(f"-m bench.speed.sft --root /tmp/sftb --nproc 2 --steps 16 --warm 4 --clips-per-run 6 {args}")
    return (Step(cmd, limit, jsonl=f"{name}.jsonl", width=2000), Show(f"{name}.jsonl", width=900))


def cache_and_gpu_tests() -> tuple[Action, ...]:
    """The cache consumer on 16 pinned cores (4 MB, 25 MB samples), then the GPU tests."""
    cache = "-m bench.speed.cache --cpus 0-15 --workdir /dev/shm"
    return (
        Step(py(f"{cache} --reps 5"), 200, log="cache_4mb.json", drop=r"^\[20"),
        Step(
            py(f"{cache} --reps 7 --shards 4 --samples-per-shard 12 --sample-mb 25"),
            260,
            log="cache_25mb.json",
            drop=r"^\[20",
        ),
        Step(
            py(f"-m pytest -q -m 'gpu and not fa4' {GPU_TESTS} -p no:cacheprovider"),
            240,
            log="pytest_gpu.log",
        ),
        Show("pytest_gpu.log", tail=3),
        Show("cache_*.json", grep=r"consumer_[a-z]*/hash_required_mem"),
    )


def accel_sft(name: str, limit: int) -> tuple[Action, ...]:
    """One GPU, ZeRO-2 via accelerate beside deepspeed.initialize: variants {1}, {2} rounds."""
    cmd = f"-m bench.speed.sft --root /tmp/sftb1 --out /tmp/{name} --nproc 1 --steps 14 --warm 4 --clips-per-run 6"
    return (
        Step(
            py(f"{cmd} --variants {{1}} --repeat {{2}} --plain-steps 0"),
            limit,
            jsonl=f"{name}.jsonl",
            width=2400,
        ),
        Tar(f"{name}_logs.tgz", f"/tmp/{name}"),
        Show(f"{name}.jsonl", width=700),
    )


def deploy_loop(limit: int, pythonpath: tuple[str, ...] = ()) -> tuple[Action, ...]:
    """bench/speed/deploy.py at full dims: the exact path (20 s of it, the reference) beside the
    levers {1}; its log's tail."""
    return (
        Step(
            py(
                "-m bench.speed.deploy --device cuda --dims full --max-lever-s 150 --max-exact-s 20 "
                "--levers=exact,{1} --out {OUT}/deploy.json"
            ),
            limit,
            log="deploy.log",
            pythonpath=pythonpath,
        ),
        Show("deploy.log", tail_chars=3000),
    )


def stages(name: str, limit: int, args: str, alloc: bool = False, fa4: bool = False) -> tuple[Action, ...]:
    """bench/speed/stages.py (world and exports in /tmp/stb): its log, JSON lines and run logs; ``alloc``:
    the CUDA allocator's expandable segments, ``fa4``: FlashAttention-4 on the path."""
    cmd = py(f"-m bench.speed.stages --root /tmp/stb --out /tmp/stlogs_{name} {args}")
    return (
        Step(
            cmd,
            limit,
            log=f"{name}.log",
            jsonl=f"{name}.jsonl",
            env=ALLOC if alloc else {},
            pythonpath=FA4_PATH if fa4 else (),
        ),
        Tar(f"{name}_logs.tgz", f"/tmp/stlogs_{name}"),
        Show(f"{name}.jsonl", drop='"probe": "summary"', width=1800),
        Show(f"{name}.log", grep="Error|error:|Traceback", head=12),
    )


@dataclass(frozen=True)
class Suite:
    device: str  # the device kind it was written for
    what: str
    steps: tuple[Action, ...]
    wheels: bool = True  # install .whl/*.whl into /tmp/site first
    defaults: tuple[str | None, ...] = ()  # {1}, {2}, ...: when that argument is not given (or empty)


SUITES: dict[str, Suite] = {
    "deploy": Suite(
        "nvidia-h200",
        "the live loop at full 5B dims (code world on the GPU, 240 cells of varied actions, every cell "
        "timed from cell 1): the exact path (at most 20 s of it: the reference) beside the levers {1} "
        "(default the bench's loop list, the CLI's fast path first); world ids vs the reference",
        deploy_loop(560),
        defaults=(DEPLOY_LEVERS,),
    ),
    "deploy-fa4": Suite(
        "nvidia-h200",
        "after the three fa4-stage calls: FA4 installed, the KV-step attention alone (SDPA's kernels "
        "vs FA4 at every window fill level), its GPU test (a graphed stream, FA4 vs SDPA), then the "
        "live loop as `deploy` runs it with the levers {1} (default: the CLI's default without "
        "flash-attn-4 beside it with FA4, the default where it is installed), FA4 on the path",
        (
            INSTALL_FA4,
            Step(py("-m bench.speed.attention --kv"), 120, jsonl="attn_kv.jsonl", pythonpath=FA4_PATH),
            Show("attn_kv.jsonl", width=400),
            Step(
                py(f"-m pytest -q -m fa4 {GPU_TESTS} -k fa4_kv_step -p no:cacheprovider"),
                200,
                log="pytest_fa4_kv.log",
                pythonpath=FA4_PATH,
            ),
            Show("pytest_fa4_kv.log", tail=4),
            *deploy_loop(480, pythonpath=FA4_PATH),
        ),
        defaults=("graphs_all_cstream_compile_fastdec_fp8,graphs_all_cstream_compile_fastdec_fp8_fa4kv",),
    ),
    "small": Suite(
        "nvidia-h200",
        "the small preset end to end (code world -> ... -> SFT) and its cond / uncond table",
        (
            Step(py("-m bench.quality.small_preset --root /tmp/small --cpu-ranks 12"), 560, log="small.log"),
            Show("small.log", grep="^{"),
            Show("small.log", tail=30),
        ),
    ),
    "small-chain": Suite(
        "nvidia-h200",
        "the small preset's whole chain (issue 35) up to phase {1} (sft, stage1_tf, stage2_cd, stage3_dmd, "
        "deploy, fast_decoder, eval), resuming in /tmp/small: one call per phase group, back to back on one warm machine",
        (
            Step(
                py("-m bench.quality.small_chain --root /tmp/small --cpu-ranks 12 --through {1}"),
                560,
                log="small_chain.log",
            ),
            Show("small_chain.log", grep="^{"),
            Show("small_chain.log", tail=60),
        ),
        defaults=("sft",),
    ),
    "sft": Suite(
        "nvidia-h200-x2",
        "NCCL bandwidth; SFT at NCCL's default, 8 CTAs, no overlap, 4 CTAs beside baselines/plain_zero2.py; "
        "the full-size code world generated on the CPU meanwhile (kept in /tmp/full)",
        (
            replace(FULL_WORLD, background=True),
            Step(torchrun(2, "-m bench.probes.nccl_probe"), 60, jsonl="nccl.jsonl"),
            *sft_bench(
                "sft",
                500,
                "--out /tmp/sftlogs --plain-steps 8 --variants nockpt_fused_compile,nockpt_fused_compile_ctas8,"
                "nockpt_fused_compile_nooverlap,nockpt_fused_compile_ctas4",
            ),
            Tar("sft_logs.tgz", "/tmp/sftlogs"),
            Wait(),
            Show("nccl.jsonl"),
        ),
    ),
    "ctas": Suite(
        "nvidia-h200-x2",
        "one short lease: NCCL at 8 CTAs, that SFT variant beside plain, latents",
        (
            replace(FULL_WORLD, background=True),
            Step(torchrun(2, "-m bench.probes.nccl_probe"), 60, jsonl="nccl.jsonl", env=CTAS8),
            *sft_bench(
                "ctas", 240, "--out /tmp/sftlogs --variants nockpt_fused_compile_ctas8 --plain-steps 6"
            ),
            Wait(),
            Step(
                py(
                    "-m bench.speed.latents --raw /tmp/full --repeat 6 --batches 2 --workers 8 --plain-clips 1 --warmup 1"
                ),
                110,
                jsonl="latents.jsonl",
                env=GPU0,
            ),
            Tar("sft_logs.tgz", "/tmp/sftlogs"),
            Show("nccl.jsonl"),
            Show("latents.jsonl", width=700),
        ),
    ),
    "latents": Suite(
        "nvidia-h200-x2",
        "latents on GPU 0 against the plain VAE, the GPU-marked tests, the cache consumer on 16 pinned cores",
        (
            FULL_WORLD,
            Step(
                py(
                    "-m bench.speed.latents --raw /tmp/full --repeat 8 --batches 2 --workers 8 --plain-clips 4 --warmup 1"
                ),
                240,
                jsonl="latents.jsonl",
                env=GPU0,
            ),
            *cache_and_gpu_tests(),
            Show("latents.jsonl", width=600),
        ),
    ),
    "cache": Suite(
        "nvidia-h200-x2",
        "the cache consumer on 16 pinned cores, then the GPU-marked tests",
        cache_and_gpu_tests(),
    ),
    "fa4-stage": Suite(
        "nvidia-h200-x2",
        "{1} = one of bench/fa4_wheels.sh's folders, copied to /tmp/fa4w (three calls; kept while warm)",
        (Call("copy the files of {1} to /tmp/fa4w and list them", stage_fa4),),
        wheels=False,
    ),
    "fa4-install": Suite(
        "nvidia-h200-x2", "after the three fa4-stage calls: FA4 installed, nothing run", (INSTALL_FA4,)
    ),
    "fa4": Suite(
        "nvidia-h200-x2",
        "after the fa4-stage calls: FlashAttention-4 against SDPA (GPU test, attention alone, SFT variants "
        "{1} with FA4, profiled)",
        (
            INSTALL_FA4,
            Step(
                py(f"-m pytest -q -m fa4 {GPU_TESTS} -p no:cacheprovider"),
                200,
                log="pytest_fa4.log",
                pythonpath=FA4_PATH,
            ),
            Show("pytest_fa4.log", tail=4),
            Step(py("-m bench.speed.attention"), 120, jsonl="attn.jsonl", pythonpath=FA4_PATH),
            Show("attn.jsonl", width=400),
            *sft_bench(
                "fa4",
                420,
                f"--out /tmp/sftlogs --fa4-path {FA4_ARG} --plain-steps 0 --profile --variants {{1}}",
            ),
            Tar("sft_logs.tgz", "/tmp/sftlogs"),
        ),
        defaults=(
            "nockpt_fused_compile_nooverlap+fa4,nockpt_fused_compile_nooverlap+fa4+percell,"
            "nockpt_fused_compile_ctas8+fa4+percell",
        ),
    ),
    "sft2": Suite(
        "nvidia-h200-x2",
        "after fa4 (or fa4-install): SFT variants {1} side by side, then plain_zero2.py "
        "(v10 = configs/sft/v10.yaml as it stands)",
        (
            *sft_bench(
                "sft2", 480, f"--out /tmp/sftlogs2 --fa4-path {FA4_ARG} --plain-steps 6 --variants {{1}}"
            ),
            Tar("sft_logs2.tgz", "/tmp/sftlogs2"),
        ),
        defaults=(
            "nockpt_fused_compile_nooverlap,nockpt_fused_compile_nooverlap+percell,"
            "nockpt_fused_compile_nooverlap+fa4+percell",
        ),
    ),
    "accel1": Suite(
        "nvidia-h200",
        "one H200: the GPU line, the GPU tests of tests/models (FSDP through accelerate among them), then "
        "SFT variants {1} (default v10_1gpu,v10_1gpu_direct: ZeRO-2 via accelerate / deepspeed.initialize) "
        "{2} times interleaved at --nproc 1",
        (
            *GPU_LINE,
            Step(
                py("-m pytest -q -m 'gpu and not fa4' tests/models -p no:cacheprovider -rA"),
                300,
                log="pytest_gpu.log",
            ),
            Show("pytest_gpu.log", tail=12),
            *accel_sft("sft1", 420),
        ),
        defaults=("v10_1gpu,v10_1gpu_direct", "1"),
    ),
    "accel1-more": Suite(
        "nvidia-h200",
        "the same lease, after accel1: {2} more rounds of {1}",
        accel_sft("sft1b", 570),
        defaults=("v10_1gpu,v10_1gpu_direct", "2"),
    ),
    "stages1": Suite(
        "nvidia-h200",
        "stages on one H200, call 1: the GPU line, then bench/speed/stages.py runs {1} (default s1,s1_flex,s2)",
        (*GPU_LINE, *stages("call1", 575, "--runs {1} --steps 6 --warm 2 --clips-per-run 4 --timeout 200")),
        defaults=("s1,s1_flex,s2",),
    ),
    "stages2": Suite(
        "nvidia-h200",
        "the same lease, call 2: runs {1} (default sft,s3); {2} = runs profiled over 2 extra steps",
        stages(
            "call2",
            575,
            "--runs {1} --steps 6 --warm 2 --s3-steps 5 --s3-blocks 10 --clips-per-run 4 --timeout 260 --profile {2}",
        ),
        defaults=("sft,s3", ""),
    ),
    "attn-tf": Suite(
        "nvidia-h200",
        "the teacher-forcing attention alone (16,380 tokens, block mask): flex with bench/speed/attention.py's "
        "FLEX_VARIANTS {1} beside SDPA's dense mask",
        (
            Step(
                py("-m bench.speed.attention --mask tf --reps 10 --kernels {1}"),
                250,
                log="attn_tf.jsonl",
                err="attn_tf.err",
            ),
            Show("attn_tf.jsonl", width=400),
        ),
        defaults=(
            "flex,flex_tma,flex_safe,flex_tma_safe,flex_m128n128w8,flex_m128n64w4s3,flex_bwd64,sdpa_mask",
        ),
    ),
    "stages-fa4": Suite(
        "nvidia-h200",
        "after the three fa4-stage calls: FA4 installed, the flex / FA4 GPU tests, then bench/speed/stages.py "
        "runs {1} (default: stage 1 with flex's FA4 backend at 12 blocks unrecomputed and at 30 with 10 "
        "recomputed, the SFT, stage 2 with it), {2} profiled (default the stage-2 run)",
        (
            INSTALL_FA4,
            Step(
                py(f"-m pytest -q -m gpu -k 'flex or fa4' {GPU_TESTS} -p no:cacheprovider -rA"),
                100,
                log="pytest.log",
                env=ALLOC,
                pythonpath=FA4_PATH,
            ),
            Show("pytest.log", tail=6),
            *stages(
                "fa4",
                460,
                "--runs {1} --steps 6 --warm 2 --clips-per-run 4 --timeout 200 --profile {2}",
                alloc=True,
                fa4=True,
            ),
        ),
        defaults=("s1_flex+fxflash+L12+nockpt,s1_flex+fxflash+ckpt10,sft,s2_flex+fxflash", "s2_flex+fxflash"),
    ),
    "stages3": Suite(
        "nvidia-h200",
        "stage 3 at 10 of 30 blocks on the fast rollout path (the preset) beside the module path, or the runs {1}; "
        "the runs {2} (default none) profiled over one more step, each phase's GPU work apart",
        stages(
            "s3",
            540,
            "--runs {1} --steps 2 --warm 1 --s3-steps 2 --s3-blocks 10 --clips-per-run 4 --timeout 240 "
            "--profile={2} --profile-steps 1",
            alloc=True,
        ),
        defaults=("s3+module,s3", ""),
    ),
    "stages-multi": Suite(
        "nvidia-h200-x8",
        "issue 24 on one host of N GPUs ({1}, default 8): the SFT, stage 1 and stage 2 (v10 presets, full 5B) at "
        "N and at 2 GPUs, ZeRO-2's reduction overlapped and not at N; per-GPU MFU and memory, scaling from the "
        "samples/s per GPU. Runs {2} replace the default list",
        (
            *stages(
                "n2",
                280,
                "--nproc 2 --runs sft+nockpt,s1_flex+nockpt,s2_flex+nockpt --steps 6 --warm 2 --clips-per-run 8"
                " --timeout 120",
                alloc=True,
            ),
            *stages(
                "n{1}",
                300,
                "--nproc {1} --runs {2} --steps 6 --warm 2 --clips-per-run 8 --timeout 90",
                alloc=True,
            ),
        ),
        defaults=("8", "sft+nockpt,s1_flex+nockpt,s1_flex+nockpt+overlap,s2_flex+nockpt"),
    ),
}


def context(name: str, args: list[str], out: Path) -> Ctx:
    """The run of suite ``name`` with ``args`` ({1}, {2}, ...; an empty one takes the default)."""
    suite = SUITES[name]
    n = max(len(args), len(suite.defaults))
    given = [*args, *[""] * (n - len(args))]
    defaults = [*suite.defaults, *[None] * (n - len(suite.defaults))]
    resolved = tuple(g if g else d for g, d in zip(given, defaults, strict=True))
    site = f"{SITE}{os.pathsep}" if suite.wheels else ""
    env = {**os.environ, **ENV, "OUT": str(out), "PYTHONPATH": f"{site}{ROOT}"}
    return Ctx(name, out, resolved, env)


def actions(name: str) -> tuple[Action, ...]:
    suite = SUITES[name]
    return ((Call(f"install .whl/*.whl into {SITE}", install_wheels),) if suite.wheels else ()) + suite.steps


def run(name: str, args: list[str], out: Path) -> int:
    """Run suite ``name``: 0 when every step passed, 1 when any timed out or failed (or an install did)."""
    out.mkdir(parents=True, exist_ok=True)
    ctx = context(name, args, out)
    try:
        for action in actions(name):
            action(ctx)
        Wait()(ctx)  # a background step nothing waited for still counts
    except SuiteError as e:
        Wait()(ctx)
        ctx.fail(str(e))
    except BaseException:  # Ctrl-C: background steps (their own process groups) go with the suite
        for running in ctx.background:
            _end_group(running.proc)
        raise
    if ctx.failed:
        print(f"suite {name} FAILED: {len(ctx.failed)} step(s) timed out or failed:", file=sys.stderr)
        print("\n".join(ctx.failed), file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", choices=sorted(SUITES))
    ap.add_argument("args", nargs="*", help="the suite's arguments ({1}, {2}, ...)")
    ap.add_argument("--list", action="store_true", help="print the table of suites")
    ap.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    a = ap.parse_args(argv)
    if a.list or a.suite is None:
        width = max(map(len, SUITES))
        for name, s in SUITES.items():
            print(f"{name:<{width}}  {s.device:<15} {s.what}")
        return 0
    out = Path(os.environ.get("OUT") or f"/tmp/gc25d_bench/{a.suite}")
    if a.dry_run:
        ctx = context(a.suite, a.args, out)
        try:
            for action in actions(a.suite):
                print(action.describe(ctx))
        except SuiteError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    return run(a.suite, a.args, out)


if __name__ == "__main__":
    sys.exit(main())
