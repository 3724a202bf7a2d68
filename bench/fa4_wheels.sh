#!/usr/bin/env bash
# Stage FlashAttention-4 (flash-attn-4, CuTe DSL) for the GPU machine, which cannot download. Its
# other needs (torch, einops, cuda-bindings, protobuf, typing-extensions) are on the image (KINDS.md).
# The GPU image's torch is a CUDA 13 build (2.11.0+cu130), so the runtime is flash-attn-4's `cu13` extra:
# nvidia-cutlass-dsl-libs-cu13. That wheel (92 MB) is over the device's 64 MiB carry limit per call,
# so the wheels are split over three folders, carried one per call of the same lease:
#   here:  bash bench/fa4_wheels.sh                  -> .fa4/1 .fa4/2 .fa4/3 (git-ignored)
#   there: call 1, carry [".fa4/1"]:                 python3 -m bench.suites fa4-stage .fa4/1
#          call 2, carry [".fa4/2"]:                 python3 -m bench.suites fa4-stage .fa4/2
#          call 3, carry [".whl", ".fa4/3"]:         python3 -m bench.suites fa4-stage .fa4/3 && python3 -m bench.suites fa4
#          (or `... fa4-install` in call 3, then `python3 -m bench.suites sft2 v10,v10+fa4` with carry [".whl"])
# (all three calls back to back: the machine keeps /tmp only while it stays warm)
set -eu
grep -qx '/.fa4/' .git/info/exclude || echo '/.fa4/' >> .git/info/exclude
rm -rf .fa4 && mkdir -p .fa4/all .fa4/1 .fa4/2 .fa4/3
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform any -d .fa4/all "$@"
}
dl flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
big=$(ls .fa4/all/nvidia_cutlass_dsl_libs_cu13-*.whl)
split -n 3 -d "$big" ".fa4/part-$(basename "$big")."
mv .fa4/part-*.00 .fa4/1/ && mv .fa4/part-*.01 .fa4/2/ && mv .fa4/part-*.02 .fa4/3/
find .fa4/all -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec mv {} .fa4/1/ \;
sha256sum "$big" | sed 's#.fa4/all/##' > .fa4/3/libs.sha256
rm -rf .fa4/all
du -sh .fa4/1 .fa4/2 .fa4/3
