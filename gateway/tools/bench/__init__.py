"""Benchmarks (``nnrp-gateway bench``): measured, never timed in unit tests."""

from ._codec import run_codec_bench as run_codec_bench
from ._stats import Figure as Figure
from ._wire import run_wire_bench as run_wire_bench
