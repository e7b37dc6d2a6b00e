"""The Grafana dashboard for the gateway, built from code.

The chart ships the JSON this module writes (``DASHBOARD_FILE``); a test checks the
committed file is what ``render()`` returns, as for ``deploy/gateway.example.toml``, and
that every metric a query names is one a real gateway's ``/metrics`` exports (tracing on,
so the otel extra's series are there too) or one vLLM's ``/metrics`` has, as the gateway
passes it through. Regenerate it after editing ``ROWS``::

    .venv/bin/python -m gateway.tools.dashboard \
        > helm/nnrp-vllm-gateway/dashboards/nnrp-gateway.json

Rules:

* **One table, ``ROWS``**: a row per question an operator asks (is it serving, how fast
  against vLLM, how loaded, who is refused, what resumes, QUIC, workers and traces); a panel per
  figure. Layout (ids, grid positions) is computed, never written by hand.
* **Selectors**: the gateway's series are picked by ``$namespace`` and ``$job`` (the
  chart's ServiceMonitor sets the job to the release's full name); vLLM's by ``$namespace``,
  the job the chart's ServiceMonitor gives vLLM's /metrics as the gateway passes it through
  (``/metrics/vllm``: that name and ``VLLM_JOB_SUFFIX``; in the pod vLLM binds
  loopback, so that is the only way Prometheus reaches it) and ``model_name``, the label
  both export (the gateway reuses vLLM's label name so the two join:
  gateway/observe/_metrics.py).
* **Rates** use Grafana's ``$__rate_interval`` (at least four scrape intervals), so a
  panel never shows a gap from a window shorter than two scrapes.
* The datasource is a template variable: the Grafana sidecar loads the file as is, in
  any Grafana with a Prometheus datasource.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

#: Where the chart keeps the built JSON (relative to the repository root).
DASHBOARD_FILE = "helm/nnrp-vllm-gateway/dashboards/nnrp-gateway.json"
#: The dashboard's fixed uid: a reinstall replaces it rather than adding a copy.
UID = "nnrp-vllm-gateway"
#: Grafana's dashboard JSON schema version this layout is written for (Grafana 10/11).
SCHEMA_VERSION = 39

#: The gateway's own series, narrowed by the dashboard's variables.
GW = 'namespace=~"$namespace", job=~"$job"'
#: The gateway's series for the chosen models.
GW_MODEL = f'{GW}, model_name=~"$model_name"'
#: The chart's job for vLLM's /metrics (the ServiceMonitor's second endpoint): the
#: gateway's job, this appended.
VLLM_JOB_SUFFIX = "-vllm"
#: vLLM's series for the chosen models, scraped beside the chosen gateways.
VLLM = f'namespace=~"$namespace", job=~"${{job}}{VLLM_JOB_SUFFIX}", model_name=~"$model_name"'
RATE = "$__rate_interval"
#: vLLM's failure kinds (``nnrp_gateway_upstream_errors_total{model_name, kind}``) that
#: are no failure of a model's serving: its answers to client mistakes (an unknown model:
#: 404; a request it rejects: 400) and its load refusals (503: the refusal ratio's). The
#: error ratio leaves them out, here and in the chart's NnrpGatewayErrorRatioHigh.
NOT_FAILURES = ("unsupported_model", "invalid_backend_request", "backend_overload")
#: The ``model_name`` values of no served model (gateway/observe/_metrics.py: a name the
#: probe did not list is ``other``; no name, ``none``): no model's error ratio.
UNSERVED_MODELS = ("other", "none")


def error_ratio(selector: str, window: str, by: str) -> str:
    """The share of a served model's operations ended by a failure: vLLM's (less
    ``NOT_FAILURES``) or the gateway's internal error; the one definition the dashboard
    and the alert rule share (the test holds the chart's rule to this text)."""
    served = f'model_name!~"{"|".join(UNSERVED_MODELS)}"'
    failed = (f"rate(nnrp_gateway_upstream_errors_total{{{selector}, "
              f'kind!~"{"|".join(NOT_FAILURES)}", {served}}}[{window}]) '
              f"or rate(nnrp_gateway_requests_total{{{selector}, "
              f'outcome="internal_error", {served}}}[{window}])')
    return (f"sum by ({by}) ({failed}) / sum by ({by}) "
            f"(rate(nnrp_gateway_requests_total{{{selector}, {served}}}[{window}]))")


@attrs.frozen
class Query:
    """One PromQL expression and how its series are named in the legend."""

    expr: str
    legend: str


@attrs.frozen
class Panel:
    """One time series panel: a title, what it shows (the panel's description) and its
    queries, all in one unit."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12


@attrs.frozen
class Row:
    title: str
    panels: tuple[Panel, ...]


def _quantile(q: float, histogram: str, selector: str, by: str = "model_name") -> str:
    return (f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({histogram}_bucket{{{selector}}}[{RATE}])))")


ROWS: tuple[Row, ...] = (
    Row("Traffic and outcomes", (
        Panel("Operations by outcome",
              "Operations ended per second, by outcome (the outcome table, "
              "docs/architecture.md).",
              (Query(f"sum by (outcome) (rate(nnrp_gateway_requests_total{{{GW_MODEL}}}"
                     f"[{RATE}]))", "{{outcome}}"),),
              unit="ops"),
        Panel("Error and refusal ratio",
              "Share of a served model's operations ended by a failure: vLLM's (less its "
              "answers to client mistakes, unsupported_model and invalid_backend_request, "
              "and its load refusals) or the gateway's internal error, as "
              "NnrpGatewayErrorRatioHigh counts it; and the share refused for load "
              "(overload refusals of operations by vLLM or load-aware admission).",
              (Query(error_ratio(GW_MODEL, RATE, "model_name"), "errors {{model_name}}"),
               Query(f"sum(rate(nnrp_gateway_overload_refusals_total{{{GW}, "
                     f'source=~"vllm|gateway"}}[{RATE}])) / '
                     f"sum(rate(nnrp_gateway_requests_total{{{GW}}}[{RATE}]))", "refused")),
              unit="percentunit"),
        Panel("Operations by transport",
              "Operations per second by the NNRP transport they came on.",
              (Query(f"sum by (transport) (rate(nnrp_gateway_requests_total{{{GW_MODEL}}}"
                     f"[{RATE}]))", "{{transport}}"),),
              unit="ops"),
        Panel("Tokens per second: gateway and vLLM",
              "Completion tokens the gateway passed on (usage vLLM reported) beside the "
              "tokens vLLM generated; a gap is vLLM work for clients of no NNRP session.",
              (Query(f"sum by (model_name) (rate(nnrp_gateway_tokens_total{{{GW_MODEL}, "
                     f'kind="completion"}}[{RATE}]))', "gateway {{model_name}}"),
               Query(f"sum by (model_name) (rate(vllm:generation_tokens_total{{{VLLM}}}"
                     f"[{RATE}]))", "vLLM {{model_name}}")),
              unit="short"),
    )),
    Row("Latency beside vLLM's", (
        Panel("Time to first event (gateway) and first token (vLLM)",
              "p50 and p99 of submit to first event sent, beside vLLM's own time to first "
              "token: the difference is the gateway's share (and the network to vLLM).",
              (Query(_quantile(0.5, "nnrp_gateway_first_event_seconds", GW_MODEL),
                     "gateway p50 {{model_name}}"),
               Query(_quantile(0.99, "nnrp_gateway_first_event_seconds", GW_MODEL),
                     "gateway p99 {{model_name}}"),
               Query(_quantile(0.99, "vllm:time_to_first_token_seconds", VLLM),
                     "vLLM p99 {{model_name}}")),
              unit="s"),
        Panel("Operation duration (gateway) and request latency (vLLM)",
              "p99 of submit to terminal, beside vLLM's end-to-end request latency.",
              (Query(_quantile(0.99, "nnrp_gateway_request_duration_seconds", GW_MODEL),
                     "gateway p99 {{model_name}}"),
               Query(_quantile(0.99, "vllm:e2e_request_latency_seconds", VLLM),
                     "vLLM p99 {{model_name}}")),
              unit="s"),
        Panel("Time between tokens (vLLM)",
              "vLLM's inter-token latency p99: what a stream's events can be no faster "
              "than (the gateway's events per second are beside it).",
              (Query(_quantile(0.99, "vllm:inter_token_latency_seconds", VLLM),
                     "vLLM ITL p99 {{model_name}}"),),
              unit="s"),
        Panel("Queue time in vLLM",
              "vLLM's queue time: as its histogram says, and as its per-request metrics "
              "report it to the gateway (vLLM 0.32+ with --enable-per-request-metrics).",
              (Query(_quantile(0.99, "vllm:request_queue_time_seconds", VLLM),
                     "vLLM p99 {{model_name}}"),
               Query(_quantile(0.99, "nnrp_gateway_backend_queue_seconds", GW_MODEL),
                     "per-request p99 {{model_name}}")),
              unit="s"),
        Panel("Cancel to upstream abort",
              "p99 of a cancel received to vLLM's socket closed (vLLM aborts on close).",
              (Query(f"histogram_quantile(0.99, sum by (le) "
                     f"(rate(nnrp_gateway_upstream_abort_seconds_bucket{{{GW}}}[{RATE}])))",
                     "p99"),),
              unit="s"),
        Panel("Events sent",
              "Profile events sent per second (one PARTIAL_RESULT each).",
              (Query(f"sum by (model_name) (rate(nnrp_gateway_events_total{{{GW_MODEL}}}"
                     f"[{RATE}]))", "{{model_name}}"),),
              unit="short"),
    )),
    Row("In flight and vLLM's load", (
        Panel("In-flight operations, sessions and connections",
              "What the gateway holds now.",
              (Query(f"sum(nnrp_gateway_inflight_operations{{{GW}}})", "operations"),
               Query(f"sum(nnrp_gateway_sessions_active{{{GW}}})", "sessions"),
               Query(f"sum(nnrp_gateway_connections_active{{{GW}}})", "connections")),
              unit="short"),
        Panel("vLLM running and waiting",
              "vLLM's own scheduler gauges, beside what load-aware admission last "
              "sampled (when it is on).",
              (Query(f"sum by (model_name) (vllm:num_requests_running{{{VLLM}}})",
                     "vLLM running {{model_name}}"),
               Query(f"sum by (model_name) (vllm:num_requests_waiting{{{VLLM}}})",
                     "vLLM waiting {{model_name}}"),
               Query(f"max(nnrp_gateway_load_waiting_requests{{{GW}}})",
                     "sampled waiting")),
              unit="short"),
        Panel("Upstream: vLLM ready and errors by kind",
              "1 while every gateway sees vLLM probed and healthy; operations ended by a "
              "vLLM failure per second, by error code.",
              (Query(f"min(nnrp_gateway_upstream_ready{{{GW}}})", "vLLM ready"),
               Query(f"min(nnrp_gateway_ready{{{GW}}})", "gateway ready"),
               Query(f"sum by (kind) (rate(nnrp_gateway_upstream_errors_total{{{GW}}}"
                     f"[{RATE}]))", "{{kind}}")),
              unit="short"),
        Panel("Upstream pool",
              "The gateway's connections to vLLM (--upstream-pool-size per process, summed "
              "over workers): held by a request, idle and open, requests waiting for one; "
              "per second, requests that waited --upstream-queue-timeout and were refused "
              "(backend_overload without vLLM refusing).",
              (Query(f"sum(nnrp_gateway_upstream_pool_size{{{GW}}})", "size"),
               Query(f"sum(nnrp_gateway_upstream_pool_in_use{{{GW}}})", "in use"),
               Query(f"sum(nnrp_gateway_upstream_pool_idle{{{GW}}})", "idle"),
               Query(f"sum(nnrp_gateway_upstream_pool_waiting{{{GW}}})", "waiting"),
               Query(f"sum(rate(nnrp_gateway_upstream_pool_wait_timeouts_total{{{GW}}}"
                     f"[{RATE}]))", "wait timeouts per second")),
              unit="short"),
        Panel("Load sampling",
              "Load-aware admission's scrapes of vLLM by result, and the state its "
              "decisions rest on (stale and scrape_failing admit everything).",
              (Query(f"sum by (result) (rate(nnrp_gateway_load_scrapes_total{{{GW}}}"
                     f"[{RATE}]))", "scrapes {{result}}"),
               Query(f"max by (state) (nnrp_gateway_load_state{{{GW}}}) > 0",
                     "state {{state}}")),
              unit="short"),
    )),
    Row("Refusals and retry hints", (
        Panel("Refusals with a retry time, by source and reason",
              "Work refused for load and told when to retry (RETRY_AFTER): vLLM's "
              "admission, load-aware admission of operations and of sessions.",
              (Query(f"sum by (source, reason) "
                     f"(rate(nnrp_gateway_overload_refusals_total{{{GW}}}[{RATE}]))",
                     "{{source}} {{reason}}"),),
              unit="ops"),
        Panel("Other refusals",
              "Submits refused (duplicate id, in-flight limit, closing), connections at "
              "the admission limit, session opens refused, bad credentials.",
              (Query(f"sum(rate(nnrp_gateway_refused_submits_total{{{GW}}}[{RATE}]))",
                     "submits"),
               Query(f"sum(rate(nnrp_gateway_connections_refused_total{{{GW}}}[{RATE}]))",
                     "connections"),
               Query(f"sum(rate(nnrp_gateway_sessions_total{{{GW}, outcome=\"refused\"}}"
                     f"[{RATE}]))", "sessions"),
               Query(f"sum(rate(nnrp_gateway_auth_failures_total{{{GW}}}[{RATE}]))",
                     "auth failures")),
              unit="ops"),
        Panel("Cancellations by kind",
              "Operations ended early, by what ended them (cancel, abort, deadline, "
              "disconnect, drain, ...).",
              (Query(f"sum by (kind) (rate(nnrp_gateway_cancellations_total{{{GW}}}"
                     f"[{RATE}]))", "{{kind}}"),),
              unit="ops"),
        Panel("Protocol errors",
              "Connections closed for protocol violations, and well-formed frames noted "
              "and ignored.",
              (Query(f"sum(rate(nnrp_gateway_protocol_errors_total{{{GW}}}[{RATE}]))",
                     "protocol errors"),
               Query(f"sum(rate(nnrp_gateway_ignored_frames_total{{{GW}}}[{RATE}]))",
                     "ignored frames")),
              unit="ops"),
    )),
    Row("Resumable sessions", (
        Panel("Resumable sessions by state",
              "Attached to a connection, or detached and waiting for their client.",
              (Query(f"sum by (state) (nnrp_gateway_resume_sessions{{{GW}}})", "{{state}}"),),
              unit="short"),
        Panel("Detaches, resumes, migrations, expiries",
              "Per second: sessions kept for their client, resumed, migrated, whose "
              "window passed, and resumes refused.",
              tuple(Query(f"sum(rate(nnrp_gateway_resume_{name}_total{{{GW}}}[{RATE}]))",
                          name)
                    for name in ("detached", "resumed", "migrated", "expired", "refused")),
              unit="ops"),
        Panel("Bytes held for replays",
              "Result bytes resumable sessions keep for a replay, and bytes sent again.",
              (Query(f"sum(nnrp_gateway_resume_held_bytes{{{GW}}})", "held"),
               Query(f"sum(rate(nnrp_gateway_resume_replayed_bytes_total{{{GW}}}[{RATE}]))",
                     "replayed per second")),
              unit="bytes"),
    )),
    Row("QUIC", (
        Panel("QUIC datagrams",
              "Datagrams in and out, and those dropped before reaching a connection, by "
              "reason (garbage, invalid_token, refused_initial).",
              (Query(f"sum by (direction) (rate(nnrp_gateway_quic_datagrams_total{{{GW}}}"
                     f"[{RATE}]))", "{{direction}}"),
               Query(f"sum by (reason) (rate(nnrp_gateway_quic_dropped_datagrams_total"
                     f"{{{GW}}}[{RATE}]))", "dropped {{reason}}")),
              unit="pps"),
        Panel("QUIC connections",
              "Open and handshaking connections; per second: Retry packets, handshake "
              "timeouts.",
              (Query(f"sum(nnrp_gateway_quic_connections_open{{{GW}}})", "open"),
               Query(f"sum(nnrp_gateway_quic_handshakes_in_progress{{{GW}}})",
                     "handshaking"),
               Query(f"sum(rate(nnrp_gateway_quic_retries_total{{{GW}}}[{RATE}]))",
                     "retries per second"),
               Query(f"sum(rate(nnrp_gateway_quic_handshake_timeouts_total{{{GW}}}"
                     f"[{RATE}]))", "handshake timeouts per second")),
              unit="short"),
    )),
    Row("Workers and traces", (
        Panel("Workers running and restarts",
              "Gateway processes (serve --workers N) and restarts of dead ones.",
              (Query(f"sum(nnrp_gateway_workers_running{{{GW}}})", "running"),
               Query(f"sum(increase(nnrp_gateway_worker_restarts_total{{{GW}}}[{RATE}]))",
                     "restarts")),
              unit="short"),
        Panel("Trace spans dropped, by reason",
              "Spans the OpenTelemetry exporter dropped rather than block the event path "
              "(the otel extra, with tracing on; empty otherwise).",
              (Query(f"sum by (reason) (rate(nnrp_gateway_trace_spans_dropped_total{{{GW}}}"
                     f"[{RATE}]))",
                     "{{reason}}"),),
              unit="ops"),
    )),
)


def _datasource() -> dict[str, str]:
    return {"type": "prometheus", "uid": "${datasource}"}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "type": "timeseries", "id": panel_id, "title": panel.title,
        "description": panel.description, "datasource": _datasource(),
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom",
                               "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": chr(ord("A") + number), "datasource": _datasource(),
                     "expr": query.expr, "legendFormat": query.legend}
                    for number, query in enumerate(panel.queries)],
    }


#: The dashboard's variables, each a label's values on one gateway series:
#: (name, label shown, series selector).
VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("namespace", "Namespace", "nnrp_gateway_build_info"),
    ("job", "Job", 'nnrp_gateway_build_info{namespace=~"$namespace"}'),
    ("model_name", "Model", 'nnrp_gateway_requests_total{namespace=~"$namespace", job=~"$job"}'),
)


def _variable(name: str, label: str, selector: str) -> dict[str, Any]:
    query = f"label_values({selector}, {name})"
    return {"type": "query", "name": name, "label": label, "datasource": _datasource(),
            "query": {"query": query, "refId": name}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row in ROWS:
        panels.append({"type": "row", "id": panel_id, "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    return {
        "uid": UID, "title": "NNRP vLLM gateway", "tags": ["nnrp", "vllm"],
        "description": "The NNRP gateway's metrics beside vLLM's own, joined by model_name "
                       "(built by gateway/tools/dashboard.py).",
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True,
        "graphTooltip": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Datasource",
             "query": "prometheus", "refresh": 1, "hide": 0,
             "current": {"selected": False, "text": "default", "value": "default"}},
            *(_variable(*variable) for variable in VARIABLES),
        ]},
        "panels": panels,
    }


def queries() -> list[str]:
    """Every PromQL expression the dashboard runs: its panels' and its variables' series."""
    return [*(query.expr for row in ROWS for panel in row.panels for query in panel.queries),
            *(selector for _, _, selector in VARIABLES)]


def render() -> str:
    """The dashboard file's text: stable key order, a final newline."""
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    print(render(), end="")
