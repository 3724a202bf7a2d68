#!/usr/bin/env bash
# A long fit of the `small` preset's tiny VAE on the GPU, in pieces that add up across device calls
# and sessions (docs/picture_study.md: the picture's ceiling rises about 2 dB for every 4× the steps,
# past what one session's device time fits). Each call fits FIT_SECONDS more (at most what the call
# has left once the code world and the probe are there: a fresh machine's first call fits less) through picture_study
# --state, scores the VAE so far (ids probe, held-out PSNR) and returns the fit's state in pieces
# of 15 MiB (the device tool brings back no file over 16 MiB) with its SHA256, and the VAE itself.
# Usage (device machine, repository root):
#     carry [".whl_fit", ".carry/vae_fit"]; WHEELS=.whl_fit FIT_SECONDS=480 bash bench/quality/vae_fit_gpu.sh
# .whl_fit: the wheels the fit imports (bench/gpu_wheels.sh writes it beside .whl, which holds more
# than the state leaves room for).
# .carry/vae_fit: the last call's pieces and fit.state.sha256, as they came back (none: a fresh fit),
# and the ids probe if one was fitted on the same code world (picture_study --prepare-only here).
# On a warm machine the state of the call before is on its disk and the carried one is not read.
# FIT_ARGS: more picture_study options (--fast-ops: the state's key then differs, a fit of its own;
# --fit-frames 33 --init $IN/init.safetensors --init-sha256 SHA: longer windows from an
# earlier fit's weights, the init carried in the first call only, since the state holds them after;
# --fit-warm W with it: the windows' first W latent frames without gradient, the rest trained on
# filled time caches;
# IN=.carry/<folder>: the carried pieces, probe and init of another fit than .carry/vae_fit's).
# Here, the VAE's state put together again:  cat fit.state.part-* > fit.state.safetensors && sha256sum -c fit.state.sha256
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_env.sh
IN=${IN:-.carry/vae_fit} WORK=${WORK:-/tmp/vae_fit} OUT=${OUT:-/tmp/vae_fit_out} PRESET=${PRESET:-small} DEVICE=${DEVICE:-cuda}
# DATA: the code world and the probe (default under WORK; vae_fit_sweep_gpu.sh shares one between fits)
DATA=${DATA:-$WORK}
STATE=$WORK/fit.state.safetensors
mkdir -p "$WORK" "$OUT"
if [ ! -e "$STATE" ] && compgen -G "$IN/fit.state.part-*" > /dev/null; then
  cat "$IN"/fit.state.part-* > "$STATE.in"
  echo "$(cut -d' ' -f1 "$IN/fit.state.sha256")  $STATE.in" | sha256sum -c --quiet || {
    echo "=== $IN: the pieces do not match fit.state.sha256" >&2; exit 1; }
  mv "$STATE.in" "$STATE"
fi
carry_probe "$IN" "$DATA/gc25d"
# THREADS: the host's threads for the rows decoded on the CPU (the probe fixes its own; a CUDA fit's
# state does not depend on them)
# scored on whole val clips (SCORE_FRAMES 81): the time cache's steady state, which the latents job
# and a live session see; the first 17 frames flatter a fit on short windows
study=(python3 -m bench.quality.picture_study --preset "$PRESET" --device "$DEVICE" --raw "$DATA/raw"
  --work "$DATA/gc25d" --latent-mse= --threads "${THREADS:-$(nproc)}" --frames "${SCORE_FRAMES:-81}")
# the code world and the probe, once a machine (minutes on a fresh one), before the fit's budget is set
# (PREPARED=1: the caller has just prepared DATA, as vae_fit_sweep_gpu.sh does for its fits)
if [ "${PREPARED:-0}" != 1 ]; then
  "${study[@]}" --prepare-only > "$OUT/prepare.log" 2>&1 || { tail -n 30 "$OUT/prepare.log"; exit 1; }
fi
# the fit gets what the call has left (CALL_S: the device's 600 s a command, less the transfers),
# less RESERVE_S for the normalisation pass, the scoring and the pieces
left=$((${CALL_S:-570} - SECONDS - ${RESERVE_S:-90}))
fit=$((${FIT_SECONDS:-480} < left ? ${FIT_SECONDS:-480} : left))
[ "$fit" -gt 0 ] || { echo "=== no time left for the fit this call ($SECONDS s gone): call again" >&2; exit 1; }
echo "=== fitting $fit s (at $SECONDS s of the call)"
"${study[@]}" --batch "${BATCH:-64}" --fits "1000000@${WIDTH:-16}" --no-compile ${FIT_ARGS:-} \
  --fit-seconds "$fit" --state "$STATE" --save-dir "$WORK/vae" 2>&1 | tee "$OUT/picture_study.log"
split -b 15M -d "$STATE" "$OUT/fit.state.part-"
(cd "$WORK" && sha256sum fit.state.safetensors) > "$OUT/fit.state.sha256"
# the newest VAE (its steps in its name; its SHA256 in the log's row)
cp "$(ls -t "$WORK"/vae/*.safetensors | head -1)" "$OUT/"
ls -la "$OUT"
