"""Observability: logging set-up (and, with the operations issue, records and metrics)."""

from ._logging import configure_logging as configure_logging
