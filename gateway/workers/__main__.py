"""``python -m gateway.workers``: a worker process, started by ``serve --workers N``."""

from __future__ import annotations

import sys

import structlog
import trio

from gateway.app import DrainInterrupted
from gateway.observe import configure_logging
from gateway.upstream import UnsupportedVersion

from ._worker import EXIT_FATAL, read_plan, serve_worker


def main() -> int:
    plan = read_plan(sys.stdin.buffer)
    configure_logging(level=plan.log_level)
    status = 0
    try:
        trio.run(serve_worker, plan)
    except* UnsupportedVersion as group:
        structlog.get_logger("gateway.workers").error(
            "vLLM version not supported; stopping", error=str(group.exceptions[0]))
        status = EXIT_FATAL
    except* DrainInterrupted:
        status = 1  # logged where the signal arrived
    return status


if __name__ == "__main__":
    sys.exit(main())
