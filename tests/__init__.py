"""The test package. Imported before any test module or conftest (and by ``python -m tests...``
re-recorders), so the CPU pin below precedes torch's first kernel."""

import os

# The golden curves (tests/golden/, tests/train/golden_sft_tiny.json) compare losses at rel 1e-6. ATen's
# vectorised kernels, MKL's GEMMs, oneDNN's convolutions and NumPy's OpenBLAS otherwise take the widest
# instruction set the CPU has, and AVX-512 sums round differently from AVX2 ones (the CI machines have
# been of both kinds): the references are recorded and checked with AVX2 code paths. OpenBLAS picks
# its kernels when NumPy loads: on an AVX-512 AMD EPYC it takes SkylakeX's, the synthetic worlds'
# float64 camera matrices change in their last bits, and with them the shard digests that key the
# cache's epoch order, so the first step trains on other clips. torch reads the others at its first
# kernel. torchrun's ranks inherit them. MKL's AVX2 mode is strict here (`make test` sets the same):
# on an Intel CPU with AVX-512 its plain AVX2 mode still picks a GEMM kernel by the GEMM's shape, so
# a row's rounding depends on how many rows come with it, and the tests that hold two code paths bit
# for bit (the fast rollout against the module's, a folded commit) would compare kernels, not code.
_PINS = (
    ("ATEN_CPU_CAPABILITY", "avx2"),
    ("MKL_CBWR", "AVX2,STRICT"),
    ("ONEDNN_MAX_CPU_ISA", "AVX2"),
    ("OPENBLAS_CORETYPE", "Haswell"),
)
for _name, _isa in _PINS:
    os.environ.setdefault(_name, _isa)
