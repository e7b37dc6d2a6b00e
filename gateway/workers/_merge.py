"""One /metrics for the pod: the workers' Prometheus texts merged into one.

Rules (one table, ``COMBINE``): a series is identified by its sample name and labels;
the same series from several workers becomes one sample whose value is

* the **sum** by default: every counter and histogram, and the gauges that count what
  a worker holds (open connections, sessions, operations in flight, its upstream pool's
  slots: size, in use, idle, waiting): the pod's figure is the sum of its workers';
* the **minimum** for ``upstream_ready`` (1 only when every worker sees vLLM healthy)
  and for ``ready`` (1 only when every worker would answer ``/readyz`` with 200);
* the **maximum** for ``build_info`` (1 per version label, not N), and for load-aware
  admission's view of vLLM (``load_*`` gauges: every worker samples the same vLLM, so
  the pod's figure is one sample's, the oldest age, and a state any worker is in).

Counters must never step back, or Prometheus' ``rate()`` reads a reset and counts the
other workers' whole totals as new increase. So ``PodMetrics`` keeps each worker's last
text: a worker that does not answer a scrape counts with its last values, and when a
worker exits its last counters and histograms join a retired base that every later
scrape adds (its gauges go: what it held is gone). Increments between a dead worker's
last scrape and its end are lost, as they would be for one process.

The pod's text has no ``*_created`` series, as a worker's has none
(``gateway.observe.metrics_text``): one a worker's text carried is not passed on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gateway.observe import metrics_text

Combine = Callable[[float, float], float]

#: Family name -> how its samples combine across workers (absent: sum).
COMBINE: dict[str, Combine] = {
    "nnrp_gateway_upstream_ready": min,
    "nnrp_gateway_ready": min,
    "nnrp_gateway_build_info": max,
    "nnrp_gateway_load_waiting_requests": max,
    "nnrp_gateway_load_running_requests": max,
    "nnrp_gateway_load_kv_cache_usage": max,
    "nnrp_gateway_load_sample_age_seconds": max,
    "nnrp_gateway_load_state": max,
}


def _add(a: float, b: float) -> float:
    return a + b


def merge_texts(texts: Iterable[str]) -> list[Metric]:
    """The families of every text, each series combined across texts (``COMBINE``)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):  # a creation time: not served (above)
                continue
            merged = families.setdefault(family.name, Metric(
                family.name, family.documentation, family.type, family.unit))
            series = values.setdefault(merged.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                combine = COMBINE.get(family.name, _add)
                series[key] = (combine(series[key], sample.value) if key in series
                               else sample.value)
    for name, family in families.items():
        family.samples = [Sample(sample_name, dict(labels), value)
                          for (sample_name, labels), value in values[name].items()]
    return list(families.values())


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merged_exposition(texts: Iterable[str], *extra: CollectorRegistry) -> bytes:
    """Prometheus text for the merged workers, followed by ``extra`` registries' own."""
    return _render(merge_texts(texts)) + b"".join(metrics_text(r) for r in extra)


def _render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return metrics_text(registry)


#: Family types that only grow while their process lives (kept when a worker retires).
_CUMULATIVE = frozenset({"counter", "histogram", "summary"})


class PodMetrics:
    """The workers' texts as one pod whose counters never step back (module rules)."""

    def __init__(self) -> None:
        self._latest: dict[int, str] = {}
        self._retired = ""

    def update(self, worker: int, text: str) -> None:
        """A worker's answer to this scrape."""
        self._latest[worker] = text

    def retire(self, worker: int) -> None:
        """The worker's process exited: its cumulative series join the base."""
        text = self._latest.pop(worker, None)
        if text is None:
            return
        kept = [family for family in text_string_to_metric_families(text)
                if family.type in _CUMULATIVE]
        self._retired = merged_exposition([self._retired, _render(kept).decode()]).decode()

    def exposition(self, *extra: CollectorRegistry) -> bytes:
        return merged_exposition([self._retired, *self._latest.values()], *extra)
