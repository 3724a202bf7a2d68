#!/usr/bin/env bash
# Stages 1-3 on one H200 (issues 17, 18, 19): two calls back to back in one lease of `nvidia-h200`,
# from the repository root through the device tool with carry [".whl"] (the wheels of h200_pending.sh).
# The world and the exports stay in /tmp/stb while the machine is warm (a cold second call rebuilds them).
#   bash bench/h200_stages.sh call1 [runs]   GPU line, then bench_stages.py runs (default s1,s1_flex,s2)
#   bash bench/h200_stages.sh call2 [runs] [profile]   the same lease: default sft,s3; `profile` = runs
#                                            profiled over 2 extra steps (torch.profiler, ops tables)
# JSON lines and logs go under $OUT.
set -u
OUT=${OUT:-/tmp/h200_stages}
mkdir -p "$OUT"
if [ ! -f /tmp/site/deepspeed/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  DIFFSYNTH_SKIP_DOWNLOAD=True HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

stages() {  # $1 name, $2 outer seconds, then bench_stages.py arguments
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 bench/bench_stages.py --root /tmp/stb --out "/tmp/stlogs_$name" "$@" 2>&1 \
    | tee "$OUT/$name.log" | grep '^{' > "$OUT/$name.jsonl"
  tar czf "$OUT/${name}_logs.tgz" -C "/tmp/stlogs_$name" . 2>/dev/null
  grep -v '"probe": "summary"' "$OUT/$name.jsonl" | cut -c1-1800
  grep -E 'Error|error:|Traceback' "$OUT/$name.log" | head -n 12
}

case "${1:-}" in
  call1)
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv,noheader
    python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
    stages call1 575 --runs "${2:-s1,s1_flex,s2}" --steps 6 --warm 2 --clips-per-run 4 --timeout 200
    ;;
  call2)
    stages call2 575 --runs "${2:-sft,s3}" --steps 6 --warm 2 --s3-steps 5 --s3-blocks 10 --clips-per-run 4 \
      --timeout 260 --profile "${3:-}"
    ;;
  *)
    echo "usage: bash bench/h200_stages.sh call1|call2 [runs] [profile]" >&2
    exit 2
    ;;
esac
