"""Benchmarks, one script per subject, in a folder that says what it measures:

    speed/      how fast our code runs (training steps, MFU, attention, deploy cell, latents, cache, CPU jobs)
    quality/    whether what we train learns (learning signal, distillation checks, the small preset)
    probes/     facts about the machine or the data that set a design choice (NCCL bandwidth, VAE
                precision options, the SPEC's masking and canvas statistics on the code world)
    baselines/  the plain DiffSynth / DeepSpeed comparators, standalone scripts run by path

with the shared helpers in common.py and the named GPU suites in suites.py. Every script runs as a
module from the repository root: ``python -m bench.speed.deploy --help``, ``torchrun
--nproc_per_node=2 -m bench.probes.nccl_probe``, ``python -m bench.suites --list``. ``bench`` is not
in the wheel (pyproject's packages.find takes only gc25d_core* and gc25d_pipeline*): it imports
because ``python -m`` puts the working directory, the repository root, first on sys.path. Results
are in docs/benchmarks.md."""
