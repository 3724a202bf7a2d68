"""Evaluation of exports (SPEC §10): the clip28 and chain241 sweeps, metrics that need no
downloaded network, per-export JSON and a comparison report. Pure core: no Dagster."""
