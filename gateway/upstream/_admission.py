"""Load-aware admission's I/O: sample vLLM's load on a timer, answer ``decision()``.

The decision itself, its table and the retry rule are ``_load`` (sans-IO); this module
only fetches ``/metrics`` (or ``/load``) every ``interval`` on the client's probe pool
(bounded timeouts, never behind busy request slots) and keeps the last sample.

Fail open: a scrape that fails (no answer, a non-200, text that says nothing) marks the
monitor ``failing`` and the decision admits; so does a sample older than the policy's
``stale_after`` (a scrape that hangs). Both are visible in the metrics
(``nnrp_gateway_load_scrapes_total{result}``, ``nnrp_gateway_load_state{state}``,
``nnrp_gateway_load_sample_age_seconds``), never as refused traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
import trio

from ._errors import UpstreamError
from ._load import (
    LoadDecision,
    LoadError,
    LoadPolicy,
    LoadSample,
    LoadSource,
    decide,
    parse_sample,
    retry_after_ms,
)

if TYPE_CHECKING:
    from ._client import VllmClient

log = structlog.get_logger("gateway.upstream.load")


class LoadMonitor:
    """The last sample of vLLM's load, and the admission decision it gives."""

    def __init__(self, client: VllmClient, policy: LoadPolicy, *, interval: float = 1.0,
                 source: LoadSource = LoadSource.METRICS,
                 clock: Callable[[], float] = trio.current_time) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.client = client
        self.policy = policy
        self.interval = interval
        self.source = source
        self._clock = clock
        self.sample: LoadSample | None = None
        #: The last scrape failed (its error in ``last_error``).
        self.failing = False
        self.last_error: str | None = None
        self.scrapes_ok = 0
        self.scrapes_failed = 0
        #: Set and replaced after every scrape (tests wait on it, not on time).
        self._scraped = trio.Event()

    def now(self) -> float:
        """The monitor's clock (trio's, unless given)."""
        return self._clock()

    def decision(self) -> LoadDecision:
        return decide(self.sample, failing=self.failing, now=self._clock(), policy=self.policy)

    def retry_after_ms(self) -> int:
        """The retry time for a refusal now (``_load.retry_after_ms``): from the last
        fresh sample's queue when there is one, else the configured base."""
        sample = None if self.failing else self.sample
        return retry_after_ms(sample, self.policy, self._clock())

    async def scraped(self) -> None:
        """Until the next scrape has finished (either way)."""
        await self._scraped.wait()

    async def scrape_once(self) -> None:
        try:
            text = await self.client.get_text(self.source.path)
            self.sample = parse_sample(self.source, text, self._clock())
        except (UpstreamError, LoadError) as exc:
            if not self.failing:
                log.warning("vLLM load scrape failed; admitting everything until it "
                            "recovers (fail open)", path=self.source.path, error=str(exc))
            self.failing, self.last_error = True, str(exc)
            self.scrapes_failed += 1
        else:
            if self.failing:
                log.info("vLLM load scrape recovered", path=self.source.path)
            self.failing, self.last_error = False, None
            self.scrapes_ok += 1
        finally:
            self._scraped.set()
            self._scraped = trio.Event()

    async def run(self) -> None:
        """Scrape every ``interval`` until cancelled. A scrape never outlives its own
        interval's worth plus the probe timeout (the probe pool's bound)."""
        while True:
            await self.scrape_once()
            await trio.sleep(self.interval)
