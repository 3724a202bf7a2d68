#!/usr/bin/env bash
# The `small` preset's tiny VAE fitted for a time budget on the GPU (batch 64, compiled), beside a
# short eager fit for its seconds a step, then the `small` chain on that VAE through the pictures
# (docs/picture_study.md): one background job on one warm machine, followed across device calls as
# bench/quality/small_chain_gpu.sh follows the chain (each call the same command, back to back).
# Usage (device machine, repository root, `carry: [".whl"]`):
#     FIT_S=420 WAIT=540 bash bench/quality/small_vae_gpu.sh [small_chain arguments after --vae]
# Its logs, the fitted VAE and, once the chain has kept them, the pictures come back under $OUT.
set -u
cd "$(dirname "$0")/../.."
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  DIFFSYNTH_SKIP_DOWNLOAD=True HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
W=/tmp/small_vae OUT=${OUT:-/tmp/small_vae_out}
mkdir -p "$W" "$OUT"
if [ ! -e $W/rc ] && ! { [ -e $W/pid ] && kill -0 "$(cat $W/pid)" 2> /dev/null; }; then
  [ $# = 0 ] && { echo "=== no job here (a fresh machine?): repeat the first call's arguments" >&2; exit 2; }
  printf '%q ' "$@" > $W/chain_args
  cat > $W/job.sh << EOF
set -x
python3 -m pytest -q -p no:cacheprovider -m gpu tests/models/test_gpu_models.py -k compiled_tiny_vae > $W/test.log 2>&1
S="python3 -m bench.quality.picture_study --preset small --device cuda --raw /tmp/small/raw --work /tmp/vae_study --batch 64 --threads 16 --latent-mse= --save-dir $W/vae"
\$S --fits 60@16 --no-compile > $W/eager.log 2>&1 || exit 3
\$S --fits 100000@16 --compile --fit-seconds ${FIT_S:-420} > $W/compiled.log 2>&1 || exit 4
F=\$(ls -t $W/vae/*_compiled.safetensors | head -1)
python3 -m bench.quality.small_chain --root /tmp/small --vae \$F --vae-sha256 \$(sha256sum \$F | cut -d' ' -f1) $(cat $W/chain_args) > $W/chain.log 2>&1
EOF
  setsid nohup bash -c "bash $W/job.sh > $W/job.log 2>&1; echo \$? > $W/rc" < /dev/null > /dev/null 2>&1 &
  echo $! > $W/pid
fi
end=$((SECONDS + ${WAIT:-540}))
while [ $SECONDS -lt $end ] && [ ! -e $W/rc ]; do sleep 5; done
cp $W/*.log $W/vae/*.safetensors /tmp/small/pictures/*.npz "$OUT/" 2> /dev/null
(cd /tmp/small 2> /dev/null && find . \( -name '*.md' -o -name '*.json' \) -size -2M -path './runs/*' -print0 \
  | tar -czf "$OUT/small_reports.tgz" --null -T -) 2> /dev/null
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
[ -e $W/rc ] && echo "=== job finished: rc $(cat $W/rc)" || echo "=== job running ($(date -u +%T))"
tail -n 5 $W/job.log $W/test.log
for f in eager compiled; do [ -e $W/$f.log ] && grep '^{\|^|' $W/$f.log | cut -c1-600; done
[ -e $W/chain.log ] && { grep '^{' $W/chain.log | cut -c1-300 | tail -30; tail -n 15 $W/chain.log; }
[ -e $W/rc ] && exit "$(cat $W/rc)"
exit 0
