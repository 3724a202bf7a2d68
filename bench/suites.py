"""Named benchmark suites: what one call of the GPU device runs, as a table instead of a shell script
of lease modes. Each suite is a few bench/ commands back to back under the device's 10-minute limit;
JSON lines and logs go under $OUT (default /tmp/gc25d_bench/<suite>).

    python bench/suites.py --list                 the table
    python bench/suites.py sft                    one suite (run from the repository root)
    python bench/suites.py sft2 VARIANTS          a suite's positional arguments ($1, $2, ...)
    python bench/suites.py sft --dry-run          the bash script it would run

The GPU suites expect the wheels the device lacks in .whl/ (carry [".whl"]); they install them into
/tmp/site first. FA4 suites need the three fa4-stage calls of bench/fa4_wheels.sh first. Results,
with their dates and devices, are in docs/benchmarks.md and its reports.

A suite exits 1 when any of its steps (each a `timeout N …` command) times out or fails, naming the
step on stderr at once and again at the end; the later steps still run and print what they have.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Suite:
    device: str  # the device kind it was written for
    what: str
    script: str  # bash; $1.. are the suite's arguments, $OUT the output folder
    wheels: bool = True  # install .whl/*.whl into /tmp/site first


# prepended to every suite: each step runs under `timeout`, and a step's status is otherwise lost in
# its pipeline (`timeout … | grep …` ends with grep's); so `timeout` is wrapped to record every step
# that times out (124, or 137 once killed) or fails in $FAILED, name it at once on stderr, and
# SUITE_END (appended to every suite) makes the suite exit 1 when any did. No `set -e`: a grep that
# finds no line (no errors in a log) is not a failure.
PREAMBLE = r"""set -u
FAILED=$(mktemp)
timeout() {
  command timeout "$@"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    local what="failed (exit $rc)"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && what="timed out after ${1}s"
    echo "suite $NAME: step $what: ${*:2}" | cut -c1-400 | tee -a "$FAILED" >&2
  fi
  return "$rc"
}
"""
SUITE_END = r"""
if [ -s "$FAILED" ]; then
  echo "suite $NAME FAILED: $(wc -l < "$FAILED") step(s) timed out or failed:" >&2
  cat "$FAILED" >&2
  rm -f "$FAILED"
  exit 1
fi
rm -f "$FAILED"
exit 0
"""
# prepended to every suite that needs the wheels
WHEELS = """
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
"""
ENV = {
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off (device README)
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "DIFFSYNTH_SKIP_DOWNLOAD": "True",
    "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
# flash-attn-4's package is `flash_attn`, the name DiffSynth probes for FlashAttention-2 (compat.py
# corrects that in our code; baselines/plain_zero2.py imports DiffSynth directly), so it lives in a
# folder only the FA4 runs see (its dsl_packages too: --target skips .pth files)
HELPERS = r"""
FA4_PATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
install_fa4() {  # join the split wheel of the three fa4-stage calls, check it, install to /tmp/fa4site
  cd /tmp/fa4w && cat part-*.00 part-*.01 part-*.02 > "$(ls part-*.00 | sed 's/^part-//; s/\.00$//')" \
    && sha256sum -c libs.sha256 && rm part-* && cd - > /dev/null || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fa4site /tmp/fa4w/*.whl || exit 1
}
full_world() {  # the full-size code world on the CPU, in the background; wait_world waits for it
  [ -d /tmp/full ] && { touch /tmp/gen.done; return; }
  (python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > "$OUT/gen.log" 2>&1; touch /tmp/gen.done) &
}
wait_world() { while [ ! -f /tmp/gen.done ]; do sleep 2; done; }
sft_bench() {  # $1 seconds, then bench/sft.py arguments; JSON lines to $OUT/$NAME.jsonl
  local limit=$1; shift
  timeout "$limit" python3 bench/sft.py --root /tmp/sftb --nproc 2 --steps 16 --warm 4 --clips-per-run 6 "$@" \
    2>&1 | grep '^{' | cut -c1-2000 > "$OUT/$NAME.jsonl"
  cut -c1-900 "$OUT/$NAME.jsonl"
}
cache_and_gpu_tests() {  # the cache consumer on 16 pinned cores (4 MB, 25 MB samples), the GPU tests
  timeout 200 python3 bench/cache.py --reps 5 --cpus 0-15 --workdir /dev/shm 2>&1 | grep -v '^\[20' > "$OUT/cache_4mb.json"
  timeout 260 python3 bench/cache.py --reps 7 --cpus 0-15 --workdir /dev/shm --shards 4 \
    --samples-per-shard 12 --sample-mb 25 2>&1 | grep -v '^\[20' > "$OUT/cache_25mb.json"
  timeout 240 python3 -m pytest -q -m "gpu and not fa4" tests/models/test_gpu_models.py -p no:cacheprovider \
    > "$OUT/pytest_gpu.log" 2>&1
  tail -n 3 "$OUT/pytest_gpu.log"
  grep -h 'consumer_[a-z]*/hash_required_mem' "$OUT"/cache_*.json
}
accel_sft() {  # one GPU, ZeRO-2 via accelerate beside deepspeed.initialize: $1 variants $2 rounds $3 name $4 s
  timeout "$4" python3 bench/sft.py --root /tmp/sftb1 --out "/tmp/$3" --nproc 1 --steps 14 --warm 4 \
    --clips-per-run 6 --variants "$1" --repeat "$2" --plain-steps 0 2>&1 | grep '^{' | cut -c1-2400 > "$OUT/$3.jsonl"
  tar czf "$OUT/$3_logs.tgz" -C "/tmp/$3" .
  cut -c1-700 "$OUT/$3.jsonl"
}
stages() {  # $1 name, $2 seconds, then bench/stages.py arguments (world and exports in /tmp/stb)
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 bench/stages.py --root /tmp/stb --out "/tmp/stlogs_$name" "$@" 2>&1 \
    | tee "$OUT/$name.log" | grep '^{' > "$OUT/$name.jsonl"
  tar czf "$OUT/${name}_logs.tgz" -C "/tmp/stlogs_$name" . 2>/dev/null
  grep -v '"probe": "summary"' "$OUT/$name.jsonl" | cut -c1-1800
  grep -E 'Error|error:|Traceback' "$OUT/$name.log" | head -n 12
}
gpu_line() {
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv,noheader
  python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))'
}
"""

SUITES: dict[str, Suite] = {
    "deploy": Suite(
        "nvidia-h200",
        "the live loop at full 5B dims (code world on the GPU, 240 cells of varied actions, every cell "
        "timed from cell 1): the exact path beside the CLI's fast path (+ side stream); world ids vs the reference",
        """timeout 560 python3 bench/deploy.py --device cuda --dims full --max-lever-s 150 \\
  --out "$OUT/deploy.json" > "$OUT/deploy.log" 2>&1
tail -c 3000 "$OUT/deploy.log\"""",
    ),
    "small": Suite(
        "nvidia-h200",
        "the small preset end to end (code world -> ... -> SFT) and its cond / uncond table",
        """timeout 560 python3 bench/small_preset.py --root /tmp/small --cpu-ranks 12 > "$OUT/small.log" 2>&1
grep '^{' "$OUT/small.log"; tail -n 30 "$OUT/small.log\"""",
    ),
    "sft": Suite(
        "nvidia-h200-x2",
        "NCCL bandwidth; SFT at NCCL's default, 8 CTAs, no overlap, 4 CTAs beside baselines/plain_zero2.py; "
        "the full-size code world generated on the CPU meanwhile (kept in /tmp/full)",
        """full_world
timeout 60 torchrun --nproc_per_node=2 bench/nccl_probe.py 2>&1 | grep '^{' >> "$OUT/nccl.jsonl"
sft_bench 500 --out /tmp/sftlogs --plain-steps 8 \\
  --variants nockpt_fused_compile,nockpt_fused_compile_ctas8,nockpt_fused_compile_nooverlap,nockpt_fused_compile_ctas4
tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .
wait_world; cat "$OUT/nccl.jsonl\"""",
    ),
    "ctas": Suite(
        "nvidia-h200-x2",
        "one short lease: NCCL at 8 CTAs, that SFT variant beside plain, latents",
        """full_world
NCCL_MAX_CTAS=8 NCCL_MAX_NCHANNELS=8 timeout 60 torchrun --nproc_per_node=2 bench/nccl_probe.py 2>&1 | grep '^{' > "$OUT/nccl.jsonl"
sft_bench 240 --out /tmp/sftlogs --variants nockpt_fused_compile_ctas8 --plain-steps 6
wait_world
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 bench/latents.py --raw /tmp/full --repeat 6 --batches 2 \\
  --workers 8 --plain-clips 1 --warmup 1 2>&1 | grep '^{' > "$OUT/latents.jsonl"
tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .
cat "$OUT/nccl.jsonl"; cut -c1-700 "$OUT/latents.jsonl\"""",
    ),
    "latents": Suite(
        "nvidia-h200-x2",
        "latents on GPU 0 against the plain VAE, the GPU-marked tests, the cache consumer on 16 pinned cores",
        """[ -d /tmp/full ] || python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > "$OUT/gen.log" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 bench/latents.py --raw /tmp/full --repeat 8 --batches 2 \\
  --workers 8 --plain-clips 4 --warmup 1 2>&1 | grep '^{' > "$OUT/latents.jsonl"
cache_and_gpu_tests
cut -c1-600 "$OUT/latents.jsonl\"""",
    ),
    "cache": Suite(
        "nvidia-h200-x2",
        "the cache consumer on 16 pinned cores, then the GPU-marked tests",
        "cache_and_gpu_tests",
    ),
    "fa4-stage": Suite(
        "nvidia-h200-x2",
        "$1 = one of bench/fa4_wheels.sh's folders, copied to /tmp/fa4w (three calls; kept while warm)",
        'mkdir -p /tmp/fa4w && cp "$1"/* /tmp/fa4w/ && ls -la /tmp/fa4w',
        wheels=False,
    ),
    "fa4-install": Suite(
        "nvidia-h200-x2", "after the three fa4-stage calls: FA4 installed, nothing run", "install_fa4"
    ),
    "fa4": Suite(
        "nvidia-h200-x2",
        "after the fa4-stage calls: FlashAttention-4 against SDPA (GPU test, attention alone, SFT variants "
        "$1 with FA4, profiled)",
        """install_fa4
PYTHONPATH=$FA4_PATH:$PYTHONPATH timeout 200 python3 -m pytest -q -m fa4 tests/models/test_gpu_models.py \\
  -p no:cacheprovider > "$OUT/pytest_fa4.log" 2>&1
tail -n 4 "$OUT/pytest_fa4.log"
PYTHONPATH=$FA4_PATH:$PYTHONPATH timeout 120 python3 bench/attention.py 2>&1 | grep '^{' > "$OUT/attn.jsonl"
cut -c1-400 "$OUT/attn.jsonl"
sft_bench 420 --out /tmp/sftlogs --fa4-path $FA4_PATH --plain-steps 0 --profile \\
  --variants "${1:-nockpt_fused_compile_nooverlap+fa4,nockpt_fused_compile_nooverlap+fa4+percell,nockpt_fused_compile_ctas8+fa4+percell}"
tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .""",
    ),
    "sft2": Suite(
        "nvidia-h200-x2",
        "after fa4 (or fa4-install): SFT variants $1 side by side, then plain_zero2.py "
        "(v10 = configs/sft/v10.yaml as it stands)",
        """sft_bench 480 --out /tmp/sftlogs2 --fa4-path $FA4_PATH --plain-steps 6 \\
  --variants "${1:-nockpt_fused_compile_nooverlap,nockpt_fused_compile_nooverlap+percell,nockpt_fused_compile_nooverlap+fa4+percell}"
tar czf "$OUT/sft_logs2.tgz" -C /tmp/sftlogs2 .""",
    ),
    "accel1": Suite(
        "nvidia-h200",
        "one H200: the GPU line, the GPU tests of tests/models (FSDP through accelerate among them), then "
        "SFT variants $1 (default v10_1gpu,v10_1gpu_direct: ZeRO-2 via accelerate / deepspeed.initialize) "
        "$2 times interleaved at --nproc 1",
        """gpu_line
timeout 300 python3 -m pytest -q -m "gpu and not fa4" tests/models -p no:cacheprovider -rA > "$OUT/pytest_gpu.log" 2>&1
tail -n 12 "$OUT/pytest_gpu.log"
accel_sft "${1:-v10_1gpu,v10_1gpu_direct}" "${2:-1}" sft1 420""",
    ),
    "accel1-more": Suite(
        "nvidia-h200",
        "the same lease, after accel1: $2 more rounds of $1",
        'accel_sft "${1:-v10_1gpu,v10_1gpu_direct}" "${2:-2}" sft1b 570',
    ),
    "stages1": Suite(
        "nvidia-h200",
        "stages on one H200, call 1: the GPU line, then bench/stages.py runs $1 (default s1,s1_flex,s2)",
        """gpu_line
stages call1 575 --runs "${1:-s1,s1_flex,s2}" --steps 6 --warm 2 --clips-per-run 4 --timeout 200""",
    ),
    "stages2": Suite(
        "nvidia-h200",
        "the same lease, call 2: runs $1 (default sft,s3); $2 = runs profiled over 2 extra steps",
        """stages call2 575 --runs "${1:-sft,s3}" --steps 6 --warm 2 --s3-steps 5 --s3-blocks 10 --clips-per-run 4 \\
  --timeout 260 --profile "${2:-}\"""",
    ),
    "attn-tf": Suite(
        "nvidia-h200",
        "the teacher-forcing attention alone (16,380 tokens, block mask): flex with bench/attention.py's "
        "FLEX_VARIANTS $1 beside SDPA's dense mask",
        """timeout 250 python3 bench/attention.py --mask tf --reps 10 \\
  --kernels "${1:-flex,flex_tma,flex_safe,flex_tma_safe,flex_m128n128w8,flex_m128n64w4s3,flex_bwd64,sdpa_mask}" \\
  > "$OUT/attn_tf.jsonl" 2> "$OUT/attn_tf.err"
cut -c1-400 "$OUT/attn_tf.jsonl\"""",
    ),
    "stages-fa4": Suite(
        "nvidia-h200",
        "after the three fa4-stage calls: FA4 installed, the flex / FA4 GPU tests, then bench/stages.py runs $1 "
        "(default: stage 1 with flex's FA4 backend at 12 blocks unrecomputed and at 30 with 10 recomputed, "
        "the SFT, stage 2 with it), $2 profiled (default the stage-2 run)",
        """install_fa4
export PYTHONPATH=$FA4_PATH:$PYTHONPATH PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 100 python3 -m pytest -q -m gpu -k "flex or fa4" tests/models/test_gpu_models.py -p no:cacheprovider -rA \\
  > "$OUT/pytest.log" 2>&1
tail -n 6 "$OUT/pytest.log"
stages fa4 460 --runs "${1:-s1_flex+fxflash+L12+nockpt,s1_flex+fxflash+ckpt10,sft,s2_flex+fxflash}" --steps 6 --warm 2 \\
  --clips-per-run 4 --timeout 200 --profile "${2:-s2_flex+fxflash}\"""",
    ),
    "stages3": Suite(
        "nvidia-h200",
        "stage 3 at 10 of 30 blocks, its rollout's exit forwards recomputed (the preset) and not ($1)",
        """export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
stages s3 370 --runs "${1:-s3,s3+nockpt}" --steps 2 --warm 1 --s3-steps 2 --s3-blocks 10 --clips-per-run 4 --timeout 170""",
    ),
    "stages-multi": Suite(
        "nvidia-h200-x8",
        "issue 24 on one host of N GPUs ($1, default 8): the SFT, stage 1 and stage 2 (v10 presets, full 5B) at "
        "N and at 2 GPUs, ZeRO-2's reduction overlapped and not at N; per-GPU MFU and memory, scaling from the "
        "samples/s per GPU. Runs $2 replace the default list",
        """export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
runs="${2:-sft+nockpt,s1_flex+nockpt,s1_flex+nockpt+overlap,s2_flex+nockpt}"
stages n2 280 --nproc 2 --runs "sft+nockpt,s1_flex+nockpt,s2_flex+nockpt" --steps 6 --warm 2 --clips-per-run 8 --timeout 120
stages "n${1:-8}" 300 --nproc "${1:-8}" --runs "$runs" --steps 6 --warm 2 --clips-per-run 8 --timeout 90""",
    ),
}


def script_of(name: str) -> str:
    suite = SUITES[name]
    return (
        f"NAME={name}\n"
        + PREAMBLE
        + (WHEELS if suite.wheels else "")
        + HELPERS
        + suite.script
        + "\n"
        + SUITE_END
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", choices=sorted(SUITES))
    ap.add_argument("args", nargs="*", help="the suite's arguments ($1, $2, ...)")
    ap.add_argument("--list", action="store_true", help="print the table of suites")
    ap.add_argument("--dry-run", action="store_true", help="print the bash script instead of running it")
    a = ap.parse_args(argv)
    if a.list or a.suite is None:
        width = max(map(len, SUITES))
        for name, s in SUITES.items():
            print(f"{name:<{width}}  {s.device:<15} {s.what}")
        return 0
    script = script_of(a.suite)
    if a.dry_run:
        print(script)
        return 0
    out = Path(os.environ.get("OUT") or f"/tmp/gc25d_bench/{a.suite}")
    out.mkdir(parents=True, exist_ok=True)
    site = "/tmp/site:" if SUITES[a.suite].wheels else ""
    env = {**os.environ, **ENV, "OUT": str(out), "PYTHONPATH": f"{site}{ROOT}"}
    return subprocess.run(["bash", "-c", script, a.suite, *a.args], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
