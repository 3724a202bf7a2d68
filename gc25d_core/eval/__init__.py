"""Evaluation of exports (SPEC §10): the clip28 and chain241 sweeps on the snapshot's val clips, the
live sessions (live240 / live2400) against the code world's truth, metrics that need no downloaded
network, per-export JSON and a comparison report; results kept per (export, sweep) (eval.store).
Pure core: no Dagster."""
