"""gc25d core library: pure functions and thin torchrun jobs. Never imports dagster.

Modules own one SPEC concern each (DESIGN.md §2): config, geometry, timeline, vocab, text,
layout, index, report, distributed, ...
"""

__version__ = "0.1.0"
