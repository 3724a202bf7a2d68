# Sourced by the scripts run on the device machine (bench/quality/*_gpu.sh) from the repository root:
# the carried wheels (WHEELS, default .whl: bench/gpu_wheels.sh) installed once per machine into
# /tmp/site, and the environment every GPU run here uses (NVLink multicast off, no downloads, the
# output unbuffered so a call's tail shows it).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site "${WHEELS:-.whl}"/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  DIFFSYNTH_SKIP_DOWNLOAD=True HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# carry_probe FROM TO: the ids probe fitted elsewhere on the same code world (ids_probe.safetensors /
# .json, 29 KB; minutes of a CPU to fit), copied into the probe's work folder where it has none;
# ensure_probe loads it only if its inputs' key is this world's, else fits its own
carry_probe() {
  mkdir -p "$2"
  for f in "$1"/ids_probe.safetensors "$1"/ids_probe.json; do
    if [ -e "$f" ] && [ ! -e "$2/$(basename "$f")" ]; then cp "$f" "$2/"; fi
  done
}
