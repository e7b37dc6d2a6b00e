"""vLLM's load, read from what it publishes, and the load-aware admission decision.

Sans-IO: text in, a ``LoadSample`` out; a sample, the time and the policy in, a
``LoadDecision`` out. The trio loop that fetches the text is ``_admission``.

Why: in an llm-d pool the router beside vLLM scores pods by ``vllm:num_requests_waiting``
and ``vllm:kv_cache_usage_perc``; NNRP connections do not pass through that router, so
the gateway is the only place that can tell an NNRP client "this pod is full, retry
elsewhere" before its request waits in vLLM's queue. An L4 Service in front
of several pods then spreads NNRP clients by load.

Sources (``LoadSource``):

* ``metrics``: vLLM's Prometheus text at ``GET /metrics`` (``vllm/v1/metrics/loggers.py``):
  the gauges ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
  ``vllm:kv_cache_usage_perc`` (0..1), one series per engine (``engine`` label) and
  model. Waiting and running are summed over the series, KV-cache use is the largest
  (the fullest engine is the one a request may land on).
* ``load``: ``GET /load`` (``{"server_load": N}``, with vLLM's
  ``--enable-server-load-tracking``): requests in flight on the API server. It knows no
  queue and no KV cache, so ``server_load`` stands for the waiting count and the KV
  threshold never applies.

The decision (``decide``), rules in order, the first that matches wins:

=========================================  ===========================================
sample                                      decision
=========================================  ===========================================
none yet, or the last scrape failed         admit (fail open), ``scrape_failing``
older than ``stale_after``                  admit (fail open), ``stale``
waiting >= ``max_waiting`` (when set)       refuse, reason ``waiting_requests``
KV use >= ``max_kv_cache_usage`` (when set) refuse, reason ``kv_cache_usage``
anything else                               admit
=========================================  ===========================================

A sample that cannot say a value (a gauge missing: vLLM not yet serving a model) admits
on that rule. The retry time (``retry_after_ms``) grows with the queue: the configured
base for an empty queue, one more base per request waiting for each running one
(``base * (1 + waiting / max(running, 1))``), capped at ``max_retry_after_ms``; without
a fresh sample, the base. The same rule times vLLM's own refusals (``_errors``), so a
client told to wait hears one consistent figure.
"""

from __future__ import annotations

import enum
import json
import math

import attrs
from prometheus_client.parser import text_string_to_metric_families

WAITING_GAUGE = "vllm:num_requests_waiting"
RUNNING_GAUGE = "vllm:num_requests_running"
KV_CACHE_GAUGE = "vllm:kv_cache_usage_perc"
#: Families other than these are skipped unparsed where possible: a vLLM's /metrics holds
#: hundreds of histogram series, and only three gauges matter here.
_WANTED = (WAITING_GAUGE, RUNNING_GAUGE, KV_CACHE_GAUGE)


class LoadSource(enum.StrEnum):
    METRICS = "metrics"
    LOAD = "load"

    @property
    def path(self) -> str:
        return "/metrics" if self is LoadSource.METRICS else "/load"


class LoadError(ValueError):
    """The scraped text says nothing usable (not Prometheus text, not /load's JSON)."""


@attrs.frozen
class LoadSample:
    """vLLM's load at ``at`` (trio clock). None: the source did not say."""

    at: float
    waiting: float | None
    running: float | None
    kv_cache_usage: float | None


class Decision(enum.StrEnum):
    ADMIT = "admit"
    REFUSE = "refuse"


class LoadState(enum.StrEnum):
    """What the last decision rested on (the ``state`` gauge's label)."""

    FRESH = "fresh"
    STALE = "stale"
    SCRAPE_FAILING = "scrape_failing"


class RefuseReason(enum.StrEnum):
    WAITING_REQUESTS = "waiting_requests"
    KV_CACHE_USAGE = "kv_cache_usage"


@attrs.frozen
class LoadPolicy:
    """The thresholds (None: that rule is off) and the retry times, all configuration."""

    max_waiting: float | None = None
    max_kv_cache_usage: float | None = None
    #: A sample older than this is ignored (fail open).
    stale_after: float = 5.0
    retry_after_ms: int = 1000
    max_retry_after_ms: int = 30_000

    @property
    def enabled(self) -> bool:
        return self.max_waiting is not None or self.max_kv_cache_usage is not None


@attrs.frozen
class LoadDecision:
    decision: Decision
    state: LoadState
    reason: RefuseReason | None = None
    retry_after_ms: int | None = None

    @property
    def refused(self) -> bool:
        return self.decision is Decision.REFUSE


def parse_metrics(text: str, at: float) -> LoadSample:
    """The three gauges from vLLM's Prometheus text (module docstring)."""
    waiting: list[float] = []
    running: list[float] = []
    kv: list[float] = []
    found = False
    try:
        # Only the lines of the gauges wanted (and their comments): the parser is slow
        # on vLLM's many histogram buckets, and their values are not needed.
        lines = [line for line in text.splitlines()
                 if any(name in line for name in _WANTED)]
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                target = {WAITING_GAUGE: waiting, RUNNING_GAUGE: running,
                          KV_CACHE_GAUGE: kv}.get(sample.name)
                if target is not None and math.isfinite(sample.value):
                    target.append(sample.value)
                    found = True
    except ValueError as exc:
        raise LoadError(f"/metrics is not Prometheus text: {exc}") from exc
    if not found and text.strip() and not any(line.startswith("#") for line in
                                              text.splitlines()[:50]):
        raise LoadError("/metrics is not Prometheus text")
    return LoadSample(at, sum(waiting) if waiting else None,
                      sum(running) if running else None, max(kv) if kv else None)


def parse_load(text: str, at: float) -> LoadSample:
    """``GET /load``'s ``{"server_load": N}`` as a sample (module docstring)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoadError(f"/load is not JSON: {exc}") from exc
    load = document.get("server_load") if isinstance(document, dict) else None
    if isinstance(load, bool) or not isinstance(load, int | float):
        raise LoadError("/load has no numeric server_load")
    return LoadSample(at, float(load), None, None)


def parse_sample(source: LoadSource, text: str, at: float) -> LoadSample:
    return parse_metrics(text, at) if source is LoadSource.METRICS else parse_load(text, at)


def retry_after_ms(sample: LoadSample | None, policy: LoadPolicy, now: float) -> int:
    """The retry time a refused client is told (module docstring)."""
    if sample is None or now - sample.at > policy.stale_after or sample.waiting is None:
        return policy.retry_after_ms
    running = max(sample.running or 0.0, 1.0)
    scaled = policy.retry_after_ms * (1.0 + sample.waiting / running)
    return int(min(max(scaled, policy.retry_after_ms), policy.max_retry_after_ms))


def decide(sample: LoadSample | None, *, failing: bool, now: float, policy: LoadPolicy
           ) -> LoadDecision:
    """The module table, row by row."""
    if sample is None or failing:
        return LoadDecision(Decision.ADMIT, LoadState.SCRAPE_FAILING)
    if now - sample.at > policy.stale_after:
        return LoadDecision(Decision.ADMIT, LoadState.STALE)
    reason = None
    if (policy.max_waiting is not None and sample.waiting is not None
            and sample.waiting >= policy.max_waiting):
        reason = RefuseReason.WAITING_REQUESTS
    elif (policy.max_kv_cache_usage is not None and sample.kv_cache_usage is not None
          and sample.kv_cache_usage >= policy.max_kv_cache_usage):
        reason = RefuseReason.KV_CACHE_USAGE
    if reason is None:
        return LoadDecision(Decision.ADMIT, LoadState.FRESH)
    return LoadDecision(Decision.REFUSE, LoadState.FRESH, reason,
                        retry_after_ms(sample, policy, now))
