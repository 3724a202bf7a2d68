#!/usr/bin/env bash
# The GPU measurements still owed (issues 4, 5, 7), in one lease of the 2x H200 host, so the machine
# starts once: two calls back to back (each under the 10-minute limit), from the repository root
# through the device tool with carry [".whl"]:
#   bash bench/h200_pending.sh gpu      the SFT variants beside plain_zero2.py (both GPUs), then
#                                       steady-state latents on GPU 0 (frames generated on the CPU
#                                       while SFT runs)
#   bash bench/h200_pending.sh cache    the cache consumer on 16 pinned cores
# JSON lines and logs go under $OUT.
set -u
OUT=${OUT:-/tmp/h200_pending}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 DIFFSYNTH_SKIP_DOWNLOAD=True HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "${1:-}" = "cache" ]; then
  timeout 150 python3 bench/bench_cache.py --reps 5 --cpus 0-15 --workdir /dev/shm 2>&1 | grep -v '^\[20' > "$OUT/cache_4mb.json"
  timeout 120 python3 bench/bench_cache.py --reps 5 --cpus 0-15 --workdir /dev/shm --shards 2 \
    --samples-per-shard 8 --sample-mb 25 2>&1 | grep -v '^\[20' > "$OUT/cache_25mb.json"
  grep -h -A3 '"ratios"' "$OUT"/cache_*.json
  exit 0
fi

(python3 -m gc25d_core.codeworld generate /tmp/full --preset full --workers 24 > "$OUT/gen.log" 2>&1; touch /tmp/gen.done) &

timeout 330 python3 bench/bench_sft_h200.py --root /tmp/sftb --out "$OUT" --nproc 2 --steps 20 --warm 4 \
  --clips-per-run 6 --variants nockpt_fused_compile,nockpt_fused_compile_reduce --plain-steps 8 --profile \
  2>&1 | grep '^{' | cut -c1-2000 > "$OUT/sft.jsonl"

while [ ! -f /tmp/gen.done ]; do sleep 2; done
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 bench/bench_latents_h200.py --raw /tmp/full --repeat 8 --batches 2 \
  --workers 8 --plain-clips 4 --warmup 1 2>&1 | grep '^{' > "$OUT/latents.jsonl"

tail -n 3 "$OUT"/*.jsonl
