#!/usr/bin/env bash
# The `small` chain (bench/quality/small_chain.py) on one warm GPU machine across device calls:
# the first call starts the chain in the background (its own session, so a call's end does not
# stop it), every call (this same command) waits up to WAIT seconds for it and shows its log, so
# the chain runs through call boundaries without a resume. Should the chain die with a call, the
# next call starts it again and it resumes from /tmp/small (every phase skips finished work).
# Usage (device machine, repository root, `carry: [".whl"]`; call again within 30 s of the last,
# with the same arguments: a machine gone cold between calls starts the chain again from them):
#     WAIT=540 bash bench/quality/small_chain_gpu.sh [small_chain arguments]
# RESTART=1: start it again after a failure; COLLECT=1: bring the reports back while it runs.
# Its log and, once it is done, its reports come back under $OUT; a finished chain's exit status is the call's.
set -u
cd "$(dirname "$0")/../.."
source bench/gpu_env.sh
LOG=/tmp/small_chain.log RC=/tmp/small_chain.rc OUT=${OUT:-/tmp/small_chain_out}
mkdir -p "$OUT"
[ "${RESTART:-0}" = 1 ] && rm -f $RC  # after a failed run: start it again (it resumes)
PID=/tmp/small_chain.pid
if [ ! -e $RC ] && ! { [ -e $PID ] && kill -0 "$(cat $PID)" 2> /dev/null; }; then
  # a call without arguments that finds no chain (the machine went cold between calls) would start
  # another chain on the defaults: refuse (the preset's defaults on purpose: pass `--`)
  if [ $# = 0 ]; then
    echo "=== no chain here (a fresh machine?) and no arguments: repeat the first call's arguments (\`--\` for the defaults)" >&2
    exit 2
  fi
  echo "=== start $(date -u +%FT%TZ): $*" >> $LOG
  printf '%q ' python3 -m bench.quality.small_chain --root /tmp/small "$@" > /tmp/small_chain.cmd
  setsid nohup bash -c "$(cat /tmp/small_chain.cmd) >> $LOG 2>&1; echo \$? > $RC" < /dev/null > /dev/null 2>&1 &
  echo $! > $PID
fi
end=$((SECONDS + ${WAIT:-540}))
while [ $SECONDS -lt $end ] && [ ! -e $RC ]; do sleep 5; done
cp $LOG "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
if [ -e $RC ] || [ "${COLLECT:-0}" = 1 ]; then  # COLLECT=1: the reports so far, the chain running or not
  [ -e $RC ] && echo "=== chain finished: rc $(cat $RC)" || echo "=== chain running ($(date -u +%T)); reports so far"
  # the reports in one archive; the pictures' frames (keep_pictures, ≈ 9 MB each: generated
  # frames hardly compress) and the tiny VAE, for the probe elsewhere, as files of their own, since
  # the device tool brings back no file over 16 MiB
  (cd /tmp/small && find . \( -name '*.md' -o -name '*.png' -o -name '*.json' \) -size -2M \
    \( -path './runs/*' -o -path './gc25d/models/*' \) -print0 \
    | tar -czf "$OUT/small_reports.tgz" --null -T -) 2>/dev/null
  cp /tmp/small/gc25d/models/tiny_vae.safetensors /tmp/small/pictures/*.npz "$OUT/" 2>/dev/null
  # the eval job's own log (its sessions' load, play and scoring times), the last 1 MB of it
  for f in /tmp/small/runs/eval/*/torchrun.log; do [ -e "$f" ] && tail -c 1000000 "$f" > "$OUT/eval_$(basename "$(dirname "$f")")_torchrun.log"; done
  ls -la "$OUT"
  find "$OUT" -type f -size +16M -exec echo "=== too large to come back: {}" \;
else
  echo "=== chain running ($(date -u +%T))"
fi
grep '^{' $LOG | cut -c1-400 | tail -40
tail -n 40 $LOG
for f in /tmp/small/runs/eval/*/torchrun.log; do [ -e "$f" ] && echo "=== $f" && tail -n 25 "$f" | cut -c1-300; done
# a finished chain's status is this call's (a failed chain fails the call); a running one's is 0
[ -e $RC ] && exit "$(cat $RC)"
exit 0
