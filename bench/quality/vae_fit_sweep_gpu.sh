#!/usr/bin/env bash
# Several fits of the `small` preset's tiny VAE side by side on one GPU, each a vae_fit_gpu.sh of its
# own (its state continues across the calls of one warm machine), over one code world and ids probe.
# A 16-wide fit's step is thousands of tiny kernels (launch-bound), so fits run together cost the
# GPU little more than one: one lease compares widths and rates at equal wall time.
# Usage (device machine, repository root; carry [".whl_fit", ".carry/probe_small"]):
#     PROBE=.carry/probe_small FITS="16/16:1e-3 16/64:5e-4" FIT_ARGS="--fast-ops --bf16 --fit-frames 41 --fit-warm 8" \
#       OUT=$OUT bash bench/quality/vae_fit_sweep_gpu.sh
# FITS: DIM/DEC_DIM:LR per fit. Each fit's log is $OUT/<fit>.log (its last row: the VAE so far on
# whole val clips); SHEETS=1 also draws each VAE's ceiling sheet (picture_sheet) into $OUT, and
# KEEP=1 brings the VAE files back in 15 MiB pieces with their SHA256. RESERVE_S: seconds each fit
# leaves for its scoring (default by the number of fits).
set -euo pipefail
cd "$(dirname "$0")/../.."
export WHEELS=${WHEELS:-.whl_fit}
source bench/gpu_env.sh
ROOT=${ROOT:-/tmp/vae_sweep} OUT=${OUT:-/tmp/vae_sweep_out} CALL_S=${CALL_S:-570}
export DATA=$ROOT/world PRESET=${PRESET:-small} DEVICE=${DEVICE:-cuda}
mkdir -p "$DATA" "$OUT"
[ -n "${FITS:-}" ] || { echo "vae_fit_sweep_gpu: FITS is empty (e.g. FITS=\"16/16:1e-3 16/64:5e-4\")" >&2; exit 2; }
# PROBE: a folder with the ids probe fitted elsewhere on the same code world (picture_study
# --prepare-only): the probe fixes its own threads, so on a fresh machine its fit and its reading of
# the train frames take minutes of the call
carry_probe "${PROBE:-/nonexistent}" "$DATA/gc25d"
# stopped short of the call's end, so that the call says where it stands (the world, once written, is kept)
prep_s=$((CALL_S - SECONDS - 20))
timeout "$prep_s" python3 -m bench.quality.picture_study --preset "$PRESET" --device "$DEVICE" --raw "$DATA/raw" \
  --work "$DATA/gc25d" --prepare-only > "$OUT/prepare.log" 2>&1 || {
  rc=$?; tail -n 30 "$OUT/prepare.log"
  [ -e "$DATA/raw/codeworld.json" ] && have="the code world is written" || have="no code world yet"
  [ -e "$DATA/gc25d/ids_probe.json" ] && have="$have, the probe too" || have="$have, no probe yet"
  [ "$rc" = 124 ] && echo "=== the code world and the probe took more than $prep_s s ($have): call again, or carry PROBE" >&2
  exit 1; }
echo "=== code world and probe ready at $SECONDS s"
read -ra fits <<< "$FITS"
threads=$(( $(nproc) / ${#fits[@]} )); threads=$(( threads > 0 ? threads : 1 ))
# the normalisation pass and the whole-clip scoring after each fit run side by side too: on the H200,
# about 105 s for one fit alone and 210 s for three (docs/picture_study.md, session 33)
export RESERVE_S=${RESERVE_S:-$((120 + 50 * (${#fits[@]} - 1)))}
pids=() names=()
for f in "${fits[@]}"; do
  width=${f%%:*} lr=${f#*:}
  name=fit_${width/\//_}_lr$lr
  names+=("$name")
  # the child's call budget is what this call has left
  PREPARED=1 WORK=$ROOT/$name OUT=$ROOT/$name/out WIDTH=$width THREADS=$threads CALL_S=$((CALL_S - SECONDS)) \
    FIT_ARGS="${FIT_ARGS:-} --lr $lr" bash bench/quality/vae_fit_gpu.sh > "$OUT/$name.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { rc=1; echo "=== ${names[$i]} failed"; tail -n 20 "$OUT/${names[$i]}.log"; }
done
for name in "${names[@]}"; do
  vae=$(ls -t "$ROOT/$name"/vae/*.safetensors 2>/dev/null | head -1) || true
  [ -n "$vae" ] || continue
  echo "=== $name: $(grep '^{"row": "tiny VAE fit' "$OUT/$name.log" | tail -1)"
  sha=$(sha256sum "$vae" | cut -c1-64)
  if [ "${SHEETS:-0}" = 1 ]; then
    python3 -m bench.quality.picture_sheet --preset "$PRESET" --raw "$DATA/raw" --work "$DATA/gc25d" --vae "$vae" \
      --sha256 "$sha" --ceiling-frames 81 --out "$OUT/ceiling_$name.png" > "$OUT/sheet_$name.log" 2>&1 \
      || tail -n 5 "$OUT/sheet_$name.log"
  fi
  if [ "${KEEP:-0}" = 1 ]; then
    mkdir -p "$OUT/$name"
    split -b 15M -d "$vae" "$OUT/$name/$(basename "$vae").part-"
    echo "$sha  $(basename "$vae")" > "$OUT/$name/sha256"
  fi
done
exit $rc
