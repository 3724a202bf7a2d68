#!/usr/bin/env bash
# The GPU measurements (issues 4, 5, 7), several calls back to back in one lease of the 2x H200 host
# (each under the 10-minute limit; the machine keeps /tmp only while warm), from the repository root
# through the device tool with carry [".whl"] (or a `git archive HEAD` copy with .whl inside it).
# FA4 runs need the three fa4-stage calls first (bench/fa4_wheels.sh), then fa4, or fa4-install before sft2.
#   bash bench/h200_pending.sh sft      NCCL bandwidth, the SFT with NCCL's default, 8 CTAs, no overlap
#                                       and 4 CTAs side by side beside plain_zero2.py
#                                       (both GPUs), and the full-size code world generated on the CPU
#                                       meanwhile (kept in /tmp/full for the next call)
#   bash bench/h200_pending.sh latents  latents on GPU 0, the GPU-marked tests, then the cache consumer
#                                       on 16 pinned cores
#   bash bench/h200_pending.sh fa4 [v]  FlashAttention-4 against SDPA (GPU test, attention alone, SFT
#                                       variants v with FA4, profiled), after the three fa4-stage calls
#                                       that bench/fa4_wheels.sh describes
#   bash bench/h200_pending.sh sft2 [v] after fa4 (or fa4-install): SFT variants v side by side, then
#                                       plain_zero2.py (v10 = configs/sft/v10.yaml as it stands)
#   bash bench/h200_pending.sh fa4-install  after the three fa4-stage calls: FA4 installed, nothing run
#   bash bench/h200_pending.sh cache    the cache consumer on 16 pinned cores, then the GPU-marked tests
#   bash bench/h200_pending.sh ctas     one short lease: NCCL at 8 CTAs, that SFT variant beside plain,
#                                       latents
#   bash bench/h200_pending.sh accel1 [v] [n]  one H200 (issue 15): the GPU count, the GPU-marked
#                                       tests of tests/models (FSDP through accelerate among them), then
#                                       SFT variants v (default v10_1gpu,v10_1gpu_direct: ZeRO-2 through
#                                       accelerate / deepspeed.initialize) n times interleaved at --nproc 1
#   bash bench/h200_pending.sh accel1-more [v] [n]  the same lease, after accel1: n more rounds of v
# JSON lines and logs go under $OUT.
set -u
OUT=${OUT:-/tmp/h200_pending}
mkdir -p "$OUT"
if [ "${1:-}" = "fa4-stage" ]; then  # one of bench/fa4_wheels.sh's folders into /tmp/fa4w (kept while warm;
  # before the .whl install: these calls need no wheels)
  mkdir -p /tmp/fa4w && cp "$2"/* /tmp/fa4w/ && ls -la /tmp/fa4w
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  DIFFSYNTH_SKIP_DOWNLOAD=True HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# flash-attn-4's top-level package is `flash_attn`, the name DiffSynth probes for FlashAttention-2
# (gc25d_core/compat.py corrects that in our code, plain_zero2.py imports DiffSynth directly), so it
# goes to a folder of its own that only the FA4 runs see (its dsl_packages too: --target skips .pth files)
FA4_PATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages

install_fa4() {  # after the three fa4-stage calls: join the split wheel, check it, install to /tmp/fa4site
  cd /tmp/fa4w && cat part-*.00 part-*.01 part-*.02 > "$(ls part-*.00 | sed 's/^part-//; s/\.00$//')" \
    && sha256sum -c libs.sha256 && rm part-* && cd - > /dev/null || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fa4site /tmp/fa4w/*.whl || exit 1
}

if [ "${1:-}" = "fa4-install" ]; then  # FA4 only (for sft2 with +fa4 variants in a fresh lease)
  install_fa4
  exit 0
fi

if [ "${1:-}" = "fa4" ]; then  # after the three fa4-stage calls: FA4 vs SDPA (test, attention alone, SFT)
  install_fa4
  PYTHONPATH=$FA4_PATH:$PYTHONPATH timeout 200 python3 -m pytest -q -m fa4 tests/models/test_gpu_models.py \
    -p no:cacheprovider > "$OUT/pytest_fa4.log" 2>&1
  tail -n 4 "$OUT/pytest_fa4.log"
  PYTHONPATH=$FA4_PATH:$PYTHONPATH timeout 120 python3 bench/bench_attn_h200.py 2>&1 | grep '^{' > "$OUT/attn.jsonl"
  cut -c1-400 "$OUT/attn.jsonl"
  timeout 420 python3 bench/bench_sft_h200.py --root /tmp/sftb --out /tmp/sftlogs --nproc 2 --steps 16 --warm 4 \
    --clips-per-run 6 --variants "${2:-nockpt_fused_compile_nooverlap+fa4,nockpt_fused_compile_nooverlap+fa4+percell,nockpt_fused_compile_ctas8+fa4+percell}" \
    --fa4-path $FA4_PATH --plain-steps 0 --profile 2>&1 | grep '^{' | cut -c1-2000 > "$OUT/sft_fa4.jsonl"
  tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .
  cut -c1-900 "$OUT/sft_fa4.jsonl"
  exit 0
fi

if [ "${1:-}" = "sft2" ]; then  # same lease, after fa4: more variants (comma list), then plain beside them
  timeout 480 python3 bench/bench_sft_h200.py --root /tmp/sftb --out /tmp/sftlogs2 --nproc 2 --steps 16 --warm 4 \
    --clips-per-run 6 --variants "${2:-nockpt_fused_compile_nooverlap,nockpt_fused_compile_nooverlap+percell,nockpt_fused_compile_nooverlap+fa4+percell}" \
    --fa4-path $FA4_PATH --plain-steps 6 2>&1 | grep '^{' | cut -c1-2000 > "$OUT/sft2.jsonl"
  tar czf "$OUT/sft_logs2.tgz" -C /tmp/sftlogs2 .
  cut -c1-900 "$OUT/sft2.jsonl"
  exit 0
fi

# the cache consumer on 16 pinned cores (4 MB and 25 MB samples), then the GPU-marked tests; they live in
# tests/models (other test modules import dagster, which is not carried here)
cache_and_gpu_tests() {
  timeout 200 python3 bench/bench_cache.py --reps 5 --cpus 0-15 --workdir /dev/shm 2>&1 | grep -v '^\[20' > "$OUT/cache_4mb.json"
  timeout 260 python3 bench/bench_cache.py --reps 7 --cpus 0-15 --workdir /dev/shm --shards 4 \
    --samples-per-shard 12 --sample-mb 25 2>&1 | grep -v '^\[20' > "$OUT/cache_25mb.json"
  timeout 240 python3 -m pytest -q -m "gpu and not fa4" tests/models/test_gpu_models.py -p no:cacheprovider \
    > "$OUT/pytest_gpu.log" 2>&1
  tail -n 3 "$OUT/pytest_gpu.log"
  grep -h 'consumer_[a-z]*/hash_required_mem' "$OUT"/cache_*.json
}

if [ "${1:-}" = "cache" ]; then
  cache_and_gpu_tests
  exit 0
fi

if [ "${1:-}" = "ctas" ]; then  # one short lease: NCCL at 8 CTAs, that SFT variant beside plain, latents
  (python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > /tmp/gen.log 2>&1; touch /tmp/gen.done) &
  NCCL_MAX_CTAS=8 NCCL_MAX_NCHANNELS=8 timeout 60 torchrun --nproc_per_node=2 bench/nccl_probe.py 2>&1 | grep '^{' > "$OUT/nccl.jsonl"
  timeout 240 python3 bench/bench_sft_h200.py --root /tmp/sftb --out /tmp/sftlogs --nproc 2 --steps 16 --warm 4 \
    --clips-per-run 6 --variants nockpt_fused_compile_ctas8 --plain-steps 6 2>&1 | grep '^{' | cut -c1-2000 > "$OUT/sft.jsonl"
  while [ ! -f /tmp/gen.done ]; do sleep 2; done
  CUDA_VISIBLE_DEVICES=0 timeout 110 python3 bench/bench_latents_h200.py --raw /tmp/full --repeat 6 --batches 2 \
    --workers 8 --plain-clips 1 --warmup 1 2>&1 | grep '^{' > "$OUT/latents.jsonl"
  tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .
  cat "$OUT/nccl.jsonl"; cut -c1-700 "$OUT/sft.jsonl" "$OUT/latents.jsonl"
  exit 0
fi

# one GPU: ZeRO-2 through accelerate's DeepSpeedPlugin beside deepspeed.initialize (issue 15), A B A B
accel_sft() {  # $1 variants, $2 rounds, $3 output name; the world stays in /tmp/sftb1 while warm
  timeout "$4" python3 bench/bench_sft_h200.py --root /tmp/sftb1 --out "/tmp/$3" --nproc 1 --steps 14 --warm 4 \
    --clips-per-run 6 --variants "$1" --repeat "$2" --plain-steps 0 2>&1 | grep '^{' | cut -c1-2400 > "$OUT/$3.jsonl"
  tar czf "$OUT/$3_logs.tgz" -C "/tmp/$3" .
  cut -c1-700 "$OUT/$3.jsonl"
}

if [ "${1:-}" = "accel1" ]; then
  python3 -c 'import torch; print(torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.__version__)'
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv,noheader
  timeout 300 python3 -m pytest -q -m "gpu and not fa4" tests/models -p no:cacheprovider -rA \
    > "$OUT/pytest_gpu.log" 2>&1
  tail -n 12 "$OUT/pytest_gpu.log"
  accel_sft "${2:-v10_1gpu,v10_1gpu_direct}" "${3:-1}" sft1 420
  exit 0
fi

if [ "${1:-}" = "accel1-more" ]; then
  accel_sft "${2:-v10_1gpu,v10_1gpu_direct}" "${3:-2}" sft1b 570
  exit 0
fi

if [ "${1:-}" = "latents" ]; then
  [ -d /tmp/full ] || python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > "$OUT/gen.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 bench/bench_latents_h200.py --raw /tmp/full --repeat 8 --batches 2 \
    --workers 8 --plain-clips 4 --warmup 1 2>&1 | grep '^{' > "$OUT/latents.jsonl"
  cache_and_gpu_tests
  cut -c1-600 "$OUT/latents.jsonl"
  exit 0
fi

(python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > "$OUT/gen.log" 2>&1; touch /tmp/gen.done) &

timeout 60 torchrun --nproc_per_node=2 bench/nccl_probe.py 2>&1 | grep '^{' >> "$OUT/nccl.jsonl"

# logs and profiles go to one archive ($OUT brings back at most 8 files)
timeout 500 python3 bench/bench_sft_h200.py --root /tmp/sftb --out /tmp/sftlogs --nproc 2 --steps 16 --warm 4 \
  --clips-per-run 6 --variants nockpt_fused_compile,nockpt_fused_compile_ctas8,nockpt_fused_compile_nooverlap,nockpt_fused_compile_ctas4 \
  --plain-steps 8 2>&1 | grep '^{' | cut -c1-2000 > "$OUT/sft.jsonl"

tar czf "$OUT/sft_logs.tgz" -C /tmp/sftlogs .
while [ ! -f /tmp/gen.done ]; do sleep 2; done
cat "$OUT/nccl.jsonl"
cut -c1-700 "$OUT/sft.jsonl"
