"""Benchmarks: one script per subject (python bench/<subject>.py --help), helpers in common.py,
the plain-stack comparators in baselines/, named suites in suites.py; results in docs/benchmarks.md."""
