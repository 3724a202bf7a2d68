"""Whether what we train learns: the learning signal, the distillation checks, the small preset end to
end (run each as ``python -m bench.quality.<name>`` from the repository root)."""
