"""The test package. Imported before any test module or conftest (and by ``python -m tests...``
re-recorders), so the CPU pin below precedes torch's first kernel."""

import os

# The golden curves (tests/golden/, tests/train/golden_sft_tiny.json) compare losses at rel 1e-6. ATen's
# vectorised kernels, MKL's GEMMs and oneDNN's convolutions otherwise take the widest instruction set
# the CPU has, and AVX-512 sums round differently from AVX2 ones (the CI machines have been of both
# kinds): the references are recorded and checked with AVX2 code paths. Read when torch runs its
# first kernel; torchrun's ranks inherit them.
for _name, _isa in (("ATEN_CPU_CAPABILITY", "avx2"), ("MKL_CBWR", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "AVX2")):
    os.environ.setdefault(_name, _isa)
