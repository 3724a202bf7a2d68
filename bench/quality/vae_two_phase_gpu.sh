#!/usr/bin/env bash
# The `small` preset's two-phase tiny-VAE fit (configs/small.yaml: `vae.fit`, then `vae.fit.then`'s
# warm windows from its weights) through picture_study on one GPU, for the preset or a config file
# made from it (e.g. the same code world at twice the resolution), each phase scored on whole val
# clips by the ids probe. Each phase keeps its state, so calls on one warm machine add up: a call that
# ends before the warm phase's row exits 3 (unfinished: call again), never 0.
# Usage (device machine, repository root; carry [".whl_fit", PROBE, the config file]):
#     PRESET=.carry/small2x.yaml PROBE=.carry/probe_small2x OUT=$OUT bash bench/quality/vae_two_phase_gpu.sh
# PROBE: the ids probe fitted on the same code world elsewhere (picture_study --prepare-only): it
# fixes its own threads, so at 512×256 its fit would take most of a call.
set -euo pipefail
cd "$(dirname "$0")/../.."
export WHEELS=${WHEELS:-.whl_fit}
source bench/gpu_env.sh
PRESET=${PRESET:-small} ROOT=${ROOT:-/tmp/vae2p} OUT=${OUT:-/tmp/vae2p_out} CALL_S=${CALL_S:-570}
# what a phase leaves of the call around its fit: the probe's key over the train frames, the clips
# loaded, the baselines (first call only), then the normalisation pass and the whole-clip scoring
# (at 512×256 on an H100: about 390 s of a 537 s call, the baselines included)
RESERVE_S=${RESERVE_S:-330}
mkdir -p "$ROOT/gc25d" "$OUT"
carry_probe "${PROBE:-/nonexistent}" "$ROOT/gc25d"
study=(python3 -m bench.quality.picture_study --preset "$PRESET" --device cuda --raw "$ROOT/raw" --work "$ROOT/gc25d"
  --latent-mse= --threads "${THREADS:-$(nproc)}" --frames 81 --no-compile)
if [ ! -e "$ROOT/prepared" ]; then
  "${study[@]}" --prepare-only > "$OUT/prepare.log" 2>&1 || { tail -n 30 "$OUT/prepare.log"; exit 1; }
  touch "$ROOT/prepared"
  echo "=== code world and probe ready at $SECONDS s"
fi
# the phase's settings as the preset's config gives them (a config file's own, where it has them)
read -r steps1 steps2 frames2 warm2 batch2 lr2 < <(python3 - "$PRESET" <<'EOF'
import sys
from gc25d_core.config import load_config
f = load_config(sys.argv[1]).vae.fit
t = f.then
print(f.steps, t.steps, t.frames, t.warm, t.batch, t.lr)
EOF
)
# phase NAME STEPS OPTIONS...: fit until STEPS (its state kept), then score; done once the VAE of
# STEPS steps is saved
phase() {
  local name=$1 steps=$2
  shift 2
  compgen -G "$ROOT/$name/tiny_vae_${steps}steps_*.safetensors" > /dev/null && return 0
  local left=$((CALL_S - SECONDS - RESERVE_S))
  [ "$left" -gt 30 ] || { echo "=== $name: no time left this call ($SECONDS s gone): call again"; exit 3; }
  echo "=== $name: fitting up to $left s (at $SECONDS s of the call)"
  local once=()  # the truth's and a random VAE's rows: in the first phase's first call only
  [ "$name" = first ] && [ ! -e "$ROOT/$name.state.safetensors" ] || once=(--no-baselines)
  "${study[@]}" --fits "$steps@16" "${once[@]}" "$@" --fit-seconds "$left" --state "$ROOT/$name.state.safetensors" \
    --save-dir "$ROOT/$name" 2>&1 | grep --line-buffered -v WARNING | tee -a "$OUT/$name.log"
  compgen -G "$ROOT/$name/tiny_vae_${steps}steps_*.safetensors" > /dev/null || {
    echo "=== $name: not at $steps steps yet: call again"; exit 3; }
}
phase first "$steps1"
first=$(ls "$ROOT"/first/tiny_vae_"${steps1}"steps_*.safetensors)
phase warm "$steps2" --init "$first" --init-sha256 "$(sha256sum "$first" | cut -c1-64)" --fit-frames "$frames2" \
  --fit-warm "$warm2" --batch "$batch2" --lr "$lr2"
cp "$first" "$(ls "$ROOT"/warm/tiny_vae_"${steps2}"steps_*.safetensors)" "$OUT/"
grep -h '^{"row": "tiny VAE fit' "$OUT"/first.log "$OUT"/warm.log
