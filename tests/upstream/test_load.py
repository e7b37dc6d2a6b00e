"""Load-aware admission's sans-IO core: vLLM's /metrics and /load read, the decision
table row by row, and the retry rule (gateway.upstream._load)."""

from __future__ import annotations

import contextlib

import pytest

from gateway.upstream import (
    LoadError,
    LoadPolicy,
    LoadSample,
    LoadState,
    RefuseReason,
    decide,
    parse_load,
    parse_metrics,
)
from gateway.upstream._load import retry_after_ms

#: The shape of vLLM 0.32's /metrics for these gauges (one series per engine and model;
#: vllm/v1/metrics/loggers.py), among histogram lines that are skipped.
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 1.0
"""


def test_metrics_sum_the_queues_and_take_the_fullest_cache() -> None:
    sample = parse_metrics(METRICS, at=7.0)
    assert sample == LoadSample(7.0, waiting=6.0, running=3.0, kv_cache_usage=0.75)


def test_metrics_byte_by_byte_prefixes_never_crash_and_trailing_bytes_are_ignored() -> None:
    for end in range(0, len(METRICS), 7):
        # A cut line may be unreadable: a clear error, never another exception.
        with contextlib.suppress(LoadError):
            parse_metrics(METRICS[:end], at=0.0)
    assert parse_metrics(METRICS + "# EOF\n", at=0.0).waiting == 6.0


def test_metrics_without_the_gauges_say_nothing_and_garbage_is_an_error() -> None:
    assert parse_metrics("# HELP x y\n# TYPE x gauge\nx 1\n", at=0.0) == LoadSample(
        0.0, None, None, None)
    with pytest.raises(LoadError):
        parse_metrics("<html>not metrics</html>", at=0.0)
    with pytest.raises(LoadError):
        parse_metrics("vllm:num_requests_waiting{engine= 3\n", at=0.0)


def test_load_endpoint() -> None:
    assert parse_load('{"server_load": 3}', at=1.0) == LoadSample(1.0, 3.0, None, None)
    for bad in ("nope", '{"server_load": "3"}', "[]", '{"server_load": true}'):
        with pytest.raises(LoadError):
            parse_load(bad, at=1.0)


POLICY = LoadPolicy(max_waiting=4, max_kv_cache_usage=0.9, stale_after=5.0,
                    retry_after_ms=1000, max_retry_after_ms=8000)


@pytest.mark.parametrize(("sample", "failing", "state", "reason"), [
    (None, False, LoadState.SCRAPE_FAILING, None),  # nothing yet: fail open
    (LoadSample(0.0, 100, 1, 1.0), True, LoadState.SCRAPE_FAILING, None),  # last one failed
    (LoadSample(-10.0, 100, 1, 1.0), False, LoadState.STALE, None),  # too old: fail open
    (LoadSample(0.0, 4, 1, 0.1), False, LoadState.FRESH, RefuseReason.WAITING_REQUESTS),
    (LoadSample(0.0, 3, 1, 0.95), False, LoadState.FRESH, RefuseReason.KV_CACHE_USAGE),
    (LoadSample(0.0, 3, 1, 0.5), False, LoadState.FRESH, None),
    (LoadSample(0.0, None, None, None), False, LoadState.FRESH, None),  # says nothing
])
def test_the_decision_table(sample: LoadSample | None, failing: bool, state: LoadState,
                            reason: RefuseReason | None) -> None:
    decision = decide(sample, failing=failing, now=0.0, policy=POLICY)
    assert (decision.state, decision.reason, decision.refused) == (state, reason,
                                                                    reason is not None)
    assert (decision.retry_after_ms is not None) == decision.refused


def test_thresholds_off_admit_everything() -> None:
    decision = decide(LoadSample(0.0, 1e6, 1, 1.0), failing=False, now=0.0,
                      policy=LoadPolicy())
    assert not decision.refused and not LoadPolicy().enabled


def test_the_retry_time_grows_with_the_queue_and_is_capped() -> None:
    assert retry_after_ms(None, POLICY, 0.0) == 1000
    assert retry_after_ms(LoadSample(0.0, 0, 4, 0.0), POLICY, 0.0) == 1000
    assert retry_after_ms(LoadSample(0.0, 8, 4, 0.0), POLICY, 0.0) == 3000  # 2 per slot
    assert retry_after_ms(LoadSample(0.0, 6, 0, 0.0), POLICY, 0.0) == 7000
    assert retry_after_ms(LoadSample(0.0, 100, 1, 0.0), POLICY, 0.0) == 8000  # the cap
    assert retry_after_ms(LoadSample(-6.0, 100, 1, 0.0), POLICY, 0.0) == 1000  # stale
