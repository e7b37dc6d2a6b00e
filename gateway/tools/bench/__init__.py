"""Benchmarks (``nnrp-gateway bench``): measured, never timed in unit tests.

This package's own namespace stays light (the CLI reads ``SCENARIO_NAMES`` for its help
without loading the benchmarks); the benchmarks are in ``codec``, ``wire``,
``scenarios`` (``bench run``) and ``soak``.
"""

#: The scenarios of ``bench run``, in the order they run.
SCENARIO_NAMES = ("latency", "cost", "throughput", "unary", "cancellation", "pause", "scale",
                  "workers", "resume", "tracing")
