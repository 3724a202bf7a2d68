#!/usr/bin/env bash
# The wheels the GPU image lacks (../.library/device KINDS.md lists what it has), at the versions this
# checkout's .venv runs, into .whl/ for `carry: [".whl"]` (bench/suites.py installs them into /tmp/site).
# Run from the repository root after `make setup`:  bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo /.whl/ >> .git/info/exclude; }
mkdir -p .whl
# pydantic's, diffsynth's and deepspeed's needs that the image lacks; the live page's server; dagster-pipes
# for the torchrun jobs' reports; cryptography (cffi, pycparser) for modelscope-hub's import chain
names=(pydantic pydantic-core annotated-types typing-inspection diffsynth modelscope modelscope-hub ftfy wcwidth
  deepspeed hjson starlette uvicorn websockets dagster-pipes cryptography cffi pycparser)
pins=()
for n in "${names[@]}"; do
  v=$("$PY" -m pip show "$n" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$v" ] || { echo "gpu_wheels: $n is not in .venv (run make setup)" >&2; exit 1; }
  pins+=("$n==$v")
done
pins+=("torchao==${TORCHAO_VERSION:-0.18.0}")  # the optional fp8 extra: not in the CPU venv
for pin in "${pins[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$pin" 2>/dev/null \
    || "$PY" -m pip download -q --no-deps -d .whl "$pin"
done
# a source release (deepspeed ships one): built here into a pure-Python wheel, its ops left to JIT
for sdist in .whl/*.tar.gz; do
  [ -e "$sdist" ] || continue
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$sdist" && rm "$sdist"
done
ls .whl | sed 's/^/  /'
du -sh .whl
# .whl_fit: the ones the tiny VAE's fit imports beyond the image (bench/quality/vae_fit_gpu.sh: all
# of .whl beside the fit's 47 MB state would pass the 64 MiB that travels with a call)
grep -qx '/.whl_fit/' .git/info/exclude || echo /.whl_fit/ >> .git/info/exclude
rm -rf .whl_fit && mkdir -p .whl_fit
for n in diffsynth deepspeed hjson pydantic pydantic_core annotated_types typing_inspection wcwidth; do
  cp .whl/"$n"-*.whl .whl_fit/
done
du -sh .whl_fit
