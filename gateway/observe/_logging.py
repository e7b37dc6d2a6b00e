"""structlog set-up: JSON lines (console rendering on a TTY), contextvars first.

The serving process logs to stdout (what container runtimes collect); one-shot commands
whose stdout is their result (``capabilities --json``, ``bench --json``) log to stderr.
"""

from __future__ import annotations

import logging
import sys

import structlog
import structlog.tracebacks


class _CurrentStream:
    """``sys.stdout`` or ``sys.stderr`` as it is at write time (not at configure time), so a
    replaced stream (test runners, daemonizers) never leaves the logger writing to a closed
    file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        return int(getattr(sys, self.name).write(text))

    def flush(self) -> None:
        getattr(sys, self.name).flush()

    def isatty(self) -> bool:
        return bool(getattr(sys, self.name).isatty())


def configure_logging(*, level: str = "info", to_stderr: bool = False,
                      json_lines: bool | None = None) -> None:
    stream = _CurrentStream("stderr" if to_stderr else "stdout")
    if json_lines is None:
        json_lines = not stream.isatty()
    renderer: structlog.typing.Processor = (structlog.processors.JSONRenderer() if json_lines
                                            else structlog.dev.ConsoleRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Tracebacks as data, without the frames' locals: those hold resume tokens,
            # credentials and prompts, which no log line may carry.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        # One write per line (PrintLogger writes the newline apart): with --workers,
        # several processes share stdout, and one write is not interleaved with another's
        # (on a pipe, for lines up to PIPE_BUF, 4 KiB; the operation line is about 1 KiB).
        logger_factory=structlog.WriteLoggerFactory(stream),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
