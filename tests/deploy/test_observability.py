"""Issue 24, the dashboard and the alert rules: the committed dashboard is what its builder
writes; the chart ships it (grafana_dashboard: "1") and the PrometheusRule only when asked;
every metric a dashboard query or an alert names is one a real gateway's /metrics exports
(tracing on: no name is exempt) or vLLM's, as that gateway's /metrics/vllm passes it
through; Prometheus' own promtool checks the rules' and the dashboard's PromQL, runs a
firing and a quiet case of every alert (more where a near miss needs saying), and lints
the gateway's real /metrics text."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.tools import dashboard
from gateway.tools.client import connect
from tests.support.chart import render_values
from tests.support.processes import ReplayThread, free_port, served_endpoints, stop_gateway
from tests.support.quic import make_pki
from tests.support.stack import chat, envelope, run_operation
from tests.support.waits import wait_for

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "nnrp-vllm-gateway"
VLLM_METRICS = ROOT / "gateway" / "tools" / "replay" / "transcripts" / "metrics_busy.prom"
BIN = Path(sys.executable).parent
EXE = str(BIN / "nnrp-gateway")
#: The one `make unit` unpacks into the venv, else one on the PATH.
PROMTOOL = str(BIN / "promtool") if (BIN / "promtool").exists() else shutil.which("promtool")
PROMTOOL_MISSING = ("promtool is not installed: `make unit` unpacks it from Debian's "
                    "prometheus package where apt is (or: apt-get install "
                    "--no-install-recommends prometheus)")
#: Set (to 1) where a missing promtool must fail its tests rather than skip them (CI:
#: .ci/run), so an install that failed quietly cannot leave the rules unchecked.
REQUIRE_PROMTOOL = "NNRP_REQUIRE_PROMTOOL"


def promtool_verdict(promtool: str | None, environ: Mapping[str, str]) -> str:
    """What a test that needs promtool does: run, skip (none here) or fail (none, and
    ``REQUIRE_PROMTOOL`` set)."""
    if promtool is not None:
        return "run"
    return "fail" if environ.get(REQUIRE_PROMTOOL, "") not in ("", "0") else "skip"


@pytest.fixture
def promtool_present() -> None:
    verdict = promtool_verdict(PROMTOOL, os.environ)
    if verdict == "skip":
        pytest.skip(PROMTOOL_MISSING)
    if verdict == "fail":
        pytest.fail(f"{PROMTOOL_MISSING}; {REQUIRE_PROMTOOL} is set, so this fails rather "
                    "than skips", pytrace=False)


needs_promtool = pytest.mark.usefixtures("promtool_present")


def test_a_missing_promtool_skips_unless_required() -> None:
    assert promtool_verdict("/usr/bin/promtool", {REQUIRE_PROMTOOL: "1"}) == "run"
    assert promtool_verdict(None, {}) == "skip"
    assert promtool_verdict(None, {REQUIRE_PROMTOOL: "0"}) == "skip"
    assert promtool_verdict(None, {REQUIRE_PROMTOOL: "1"}) == "fail"

#: Series Prometheus makes itself for every target it scrapes (not exported by anyone).
PROMETHEUS_OWN = frozenset({"up"})
#: The chart's release and namespace as the tests render it.
RELEASE, NAMESPACE = "test", "ml"
JOB = f"{RELEASE}-nnrp-vllm-gateway"


def render(values: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return render_values(values)


def rules_document() -> dict[str, Any]:
    """The PrometheusRule's spec as the chart renders it with its defaults turned on."""
    (rule,) = render({"prometheusRule": {"enabled": True},
                      "serviceMonitor": {"enabled": True}})["PrometheusRule"]
    return dict(rule["spec"])


def alert_rules() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rules_document()["groups"]
            for rule in group["rules"]}


# --------------------------------------------------------------------------- PromQL names

#: PromQL words that are followed by no parenthesis and name no series.
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: what is left once strings, label
    matchers, ranges, grouping label lists and function calls are set aside."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for name, call in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", expr):
        if not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def test_metric_names_reads_what_a_query_names() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (model_name, le) (rate(a_bucket{x=~"b|c", '
        'job="$job"}[$__rate_interval]))) > 2 unless on(pod) b == 0 or vllm:c{d="e"}'
    ) == {"a_bucket", "b", "vllm:c"}
    assert metric_names("sum(rate(x_total[5m])) / sum(rate(y_total[5m])) > bool 0.5") == {
        "x_total", "y_total"}


def exported_names(text: str) -> set[str]:
    """Every series name a /metrics text offers: the samples', and the ones each declared
    family would have once its labels have values (a labelled family shows HELP and TYPE
    only until then)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update({"counter": [f"{family.name}_total"],
                      "histogram": [f"{family.name}_{part}" for part in ("bucket", "count",
                                                                         "sum")],
                      }.get(family.type, [family.name]))
    return names


# --------------------------------------------------------------------------- a real gateway


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The /metrics text of a real ``serve --workers 2`` (the supervisor's, merged over
    its workers) with every part that exports series turned on (QUIC, resumable sessions,
    load-aware admission, traces: the otel extra is in the test extra, its collector a
    closed port), against the replay vLLM, after one streamed operation; and its
    /metrics/vllm (vLLM's, passed through), what the chart's second endpoint scrapes."""
    folder = tmp_path_factory.mktemp("observed")
    pki = make_pki(folder / "pki")
    admin = f"http://127.0.0.1:{free_port()}"
    log = folder / "gateway.log"
    # Spans export to nowhere (refused at once): the counters are there, drops counted.
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    with ReplayThread(speed=50.0) as replay, log.open("wb") as sink:
        process = subprocess.Popen(
            [EXE, "serve", "--workers", "2", "--vllm-url", replay.url,
             "--listen", "tcp://127.0.0.1:0", "--listen", "quic://127.0.0.1:0",
             "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
             "--resume-window", "30", "--load-aware-admission", "--load-max-waiting", "100",
             "--admin-listen", admin.removeprefix("http://"), "--metrics", "--otel-traces",
             "--drain-timeout", "5"], stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, **otel})
        try:
            wait_for(lambda: len(served_endpoints(log.read_text())) == 2
                     or process.poll() is not None, what="the announcement")
            assert process.poll() is None, log.read_text()
            wait_for(lambda: httpx.get(f"{admin}/readyz").status_code == 200, what="ready")
            (tcp,) = [uri for uri in served_endpoints(log.read_text())
                      if uri.startswith("tcp://")]

            async def one_stream() -> None:
                with trio.fail_after(20):
                    async with connect(tcp) as client:
                        session = await client.open_session()
                        outcome = await run_operation(session, envelope(chat(
                            stream=True, max_tokens=4, stream_options={"include_usage":
                                                                       True})))
                        assert outcome.final["type"] == "response.completed"

            trio.run(one_stream)

            def counted() -> bool:
                return "nnrp_gateway_first_event_seconds_bucket" in httpx.get(
                    f"{admin}/metrics").text

            wait_for(counted, what="the operation in /metrics")
            vllm = httpx.get(f"{admin}/metrics/vllm")
            assert vllm.status_code == 200, vllm.text
            yield {"gateway": httpx.get(f"{admin}/metrics").text, "vllm": vllm.text}
        finally:
            stop_gateway(process)


@pytest.fixture(scope="module")
def gateway_metrics(scrapes: dict[str, str]) -> str:
    return scrapes["gateway"]


@pytest.fixture(scope="module")
def vllm_names(scrapes: dict[str, str]) -> set[str]:
    """vLLM's names as Prometheus scrapes them in the chart: through the gateway."""
    names = exported_names(scrapes["vllm"])
    assert names == exported_names(VLLM_METRICS.read_text())  # the recorded vLLM's, whole
    return names


def test_the_scrape_is_the_whole_gateway(gateway_metrics: str) -> None:
    """The scrape the next tests rest on has every part's series: one missing here would
    let a query on it pass unchecked."""
    names = exported_names(gateway_metrics)
    for name in ("nnrp_gateway_requests_total", "nnrp_gateway_first_event_seconds_bucket",
                 "nnrp_gateway_ready", "nnrp_gateway_upstream_ready",
                 "nnrp_gateway_worker_restarts_total", "nnrp_gateway_workers_running",
                 "nnrp_gateway_quic_dropped_datagrams_total", "nnrp_gateway_resume_sessions",
                 "nnrp_gateway_load_state", "nnrp_gateway_trace_spans_dropped_total",
                 "nnrp_gateway_trace_spans_exported_total",
                 "nnrp_gateway_upstream_pool_in_use",
                 "nnrp_gateway_upstream_pool_waiting", "nnrp_gateway_upstream_pool_size",
                 "nnrp_gateway_upstream_pool_wait_timeouts_total"):
        assert name in names, name
    assert not any(name.startswith("vllm:") for name in names)


def test_dashboard_queries_name_only_exported_metrics(gateway_metrics: str,
                                                      vllm_names: set[str]) -> None:
    known = exported_names(gateway_metrics) | vllm_names
    named = {name for expr in dashboard.queries() for name in metric_names(expr)}
    assert named - known == set()
    # Both sides of the join are on the dashboard.
    assert any(name.startswith("vllm:") for name in named)
    assert {"nnrp_gateway_first_event_seconds_bucket",
            "vllm:time_to_first_token_seconds_bucket"} <= named


def test_alerts_name_only_exported_metrics(gateway_metrics: str,
                                           vllm_names: set[str]) -> None:
    known = exported_names(gateway_metrics) | vllm_names | PROMETHEUS_OWN
    named = {name for rule in alert_rules().values() for name in metric_names(rule["expr"])}
    assert named - known == set()


@needs_promtool
def test_promtool_check_metrics_passes_on_the_real_metrics(gateway_metrics: str) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=gateway_metrics,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == ""  # no lint complaint


@needs_promtool
async def test_promtool_check_metrics_passes_on_one_process(nursery: trio.Nursery) -> None:
    """The same lint on one gateway process's own text (no supervisor re-serialising it),
    after a streamed and a failed operation."""
    from gateway.app import Gateway, GatewayConfig
    from gateway.tools.replay import ReplayServer

    replay = ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url,
                                    admin_listen="127.0.0.1:0", metrics=True))
    await nursery.start(gateway.run)
    with trio.fail_after(10):
        await gateway.probed.wait()
        async with connect(gateway.endpoints[0].uri) as client:
            session = await client.open_session()
            await run_operation(session, envelope(chat(stream=True, max_tokens=3)))
            await run_operation(session, envelope(chat("no-such-model")))
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(f"http://127.0.0.1:{gateway.admin.port}/metrics")).text
    assert "nnrp_gateway_request_duration_seconds_bucket" in text
    assert PROMTOOL is not None
    done = await trio.run_process([PROMTOOL, "check", "metrics"], stdin=text.encode(),
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == b"" and done.stderr.strip() == b""


# --------------------------------------------------------------------------- dashboard


def test_the_committed_dashboard_is_what_the_builder_writes() -> None:
    """Regenerate with ``.venv/bin/python -m gateway.tools.dashboard >
    helm/nnrp-vllm-gateway/dashboards/nnrp-gateway.json``."""
    assert (ROOT / dashboard.DASHBOARD_FILE).read_text() == dashboard.render()


#: Issue 24's dashboard, panel by panel: what each must read (one panel reads them all).
ISSUE_PANELS: dict[str, set[str]] = {
    "outcomes": {"nnrp_gateway_requests_total"},
    "request rate by transport": {"nnrp_gateway_requests_total"},
    "time to first event beside vLLM's": {"nnrp_gateway_first_event_seconds_bucket",
                                          "vllm:time_to_first_token_seconds_bucket"},
    "event rate": {"nnrp_gateway_events_total"},
    "in-flight operations and sessions": {"nnrp_gateway_inflight_operations",
                                          "nnrp_gateway_sessions_active"},
    "upstream pool": {"nnrp_gateway_upstream_pool_size", "nnrp_gateway_upstream_pool_in_use",
                      "nnrp_gateway_upstream_pool_waiting",
                      "nnrp_gateway_upstream_pool_wait_timeouts_total"},
    "refusals and retry hints by reason": {"nnrp_gateway_overload_refusals_total"},
    "resumable sessions": {"nnrp_gateway_resume_sessions"},
    "resumes": {"nnrp_gateway_resume_resumed_total", "nnrp_gateway_resume_expired_total"},
    "quic": {"nnrp_gateway_quic_datagrams_total",
             "nnrp_gateway_quic_dropped_datagrams_total"},
    "workers": {"nnrp_gateway_workers_running", "nnrp_gateway_worker_restarts_total"},
}
#: How a panel must group what it reads, where the split is the point.
GROUPING = {"outcomes": "by (outcome)", "request rate by transport": "by (transport)",
            "refusals and retry hints by reason": "by (source, reason)"}


def test_dashboard_layout() -> None:
    """Grafana's JSON model as the sidecar loads it: unique ids, rows across the full
    width, panels inside the 24-column grid and never on top of one another, every target
    with its own refId on the datasource variable, and the panels the issue asks for."""
    model = dashboard.dashboard()
    panels = model["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & taken, panel["title"]
        taken |= cells
        if panel["type"] == "row":
            assert grid["w"] == 24
            continue
        assert panel["type"] == "timeseries" and panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids)
    variables = [variable["name"] for variable in model["templating"]["list"]]
    assert variables == ["datasource", "namespace", "job", "model_name"]
    # The panels the issue asks for, each known by what it reads (a title proves nothing).
    read = [(panel["title"], " ".join(target["expr"] for target in panel["targets"]))
            for panel in panels if panel["type"] != "row"]
    for subject, wanted in ISSUE_PANELS.items():
        assert any(wanted <= metric_names(exprs) and grouping in exprs
                   for _, exprs in read for grouping in [GROUPING.get(subject, "")]), subject
    assert model["uid"] == dashboard.UID and model["schemaVersion"] == dashboard.SCHEMA_VERSION


def test_the_chart_ships_the_dashboard_only_when_asked() -> None:
    defaults = render({})
    assert "ConfigMap" not in defaults and "PrometheusRule" not in defaults
    (config_map,) = render({"dashboards": {"enabled": True, "additionalLabels": {"team": "ml"},
                                           "annotations": {"grafana_folder": "LLM"}}}
                           )["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["team"] == "ml"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    (text,) = config_map["data"].values()
    assert json.loads(text) == dashboard.dashboard()


def test_the_chart_scrapes_vllm_through_the_gateway() -> None:
    """vLLM binds the pod's loopback: the ServiceMonitor's second endpoint scrapes its
    /metrics through the gateway under a job of its own, the one the dashboard's vLLM
    queries select."""
    (monitor,) = render({"serviceMonitor": {"enabled": True}})["ServiceMonitor"]
    gateway, vllm = monitor["spec"]["endpoints"]
    assert (gateway["port"], gateway["path"]) == ("admin", "/metrics")
    # The gateway's job: the release's full name, as the rules and the dashboard select it
    # (the Service scraped is the metrics-only <fullname>-metrics).
    assert gateway["relabelings"] == [{"targetLabel": "job", "replacement": JOB}]
    assert (vllm["port"], vllm["path"]) == ("admin", "/metrics/vllm")
    assert vllm["interval"] == gateway["interval"]
    assert vllm["relabelings"] == [{"targetLabel": "job",
                                    "replacement": JOB + dashboard.VLLM_JOB_SUFFIX}]
    vllm_job = f'job=~"${{job}}{dashboard.VLLM_JOB_SUFFIX}"'
    for expr in dashboard.queries():
        assert expr.count(vllm_job) == len(re.findall(r"vllm:\w+\{", expr)), expr


def test_the_chart_renders_the_rules_with_their_values() -> None:
    (rule,) = render({"serviceMonitor": {"enabled": True}, "prometheusRule": {
        "enabled": True, "additionalLabels": {"release": "prometheus"},
        "ttftP99Seconds": 4.5, "sustainedFor": "3m"}})["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(rules) == set(ALERT_CASES)
    assert rules["NnrpGatewayTtftP99High"]["expr"].endswith("> 4.5")
    assert rules["NnrpGatewayTtftP99High"]["for"] == "3m"
    for each in rules.values():  # every series is this release's
        for selector in re.findall(r"\{([^}]*)\}", each["expr"]):
            assert f'namespace="{NAMESPACE}"' in selector and f'job="{JOB}"' in selector


def test_the_rules_need_the_metrics_scraped() -> None:
    """Alert rules over series nobody scrapes never fire: the chart refuses them, saying
    what to set; metrics served and scraped another way will do."""
    from tests.support.chart import helm, secured

    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=re.escape("serviceMonitor.enabled=true")):
        chart.render(secured({"prometheusRule": {"enabled": True}}), name="x")
    assert render({"prometheusRule": {"enabled": True}, "gateway": {"metrics": True}}
                  )["PrometheusRule"]


def test_the_schema_refuses_bad_alert_values() -> None:
    from tests.support.chart import helm

    chart = helm.Chart.load(str(CHART))
    for bad in ({"sustainedFor": "ten minutes"}, {"notReadyFor": "5"}, {"errorRatio": 2},
                {"ttftP99Seconds": 0}, {"maxWorkerRestarts": -1}, {"unknown": 1}):
        with pytest.raises(helm.HelmError):
            chart.render({"prometheusRule": {"enabled": True, **bad},
                          "serviceMonitor": {"enabled": True}}, name="x")
    with pytest.raises(helm.HelmError):
        chart.render({"dashboards": {"enabled": "yes"}}, name="x")


# --------------------------------------------------------------------------- promtool


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd,
                          check=False)


@needs_promtool
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_document()))
    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERT_CASES)} rules found" in done.stdout


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query, as Grafana sends it once its variables are filled in, made a
    recording rule for Prometheus' own parser."""
    filled = {"$__rate_interval": "5m", "$namespace": ".*", "${job}": ".*", "$job": ".*",
              "$model_name": ".*"}
    rules = []
    for number, expr in enumerate(dashboard.queries()):
        for variable, value in filled.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": rules}]}))
    done = _promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


GW = f'namespace="{NAMESPACE}", job="{JOB}"'
POD = f'{{{GW}, pod="gw-0"}}'
TARGET = {"namespace": NAMESPACE, "job": JOB, "pod": "gw-0"}


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{labels}", "values": values}


def _with(extra: str) -> str:
    return f'{{{GW}, pod="gw-0", {extra}}}'


#: alert -> (fires: (series, minute, labels), quiet: (series, minute)). A quiet case
#: is the near miss: the condition met too briefly, below the threshold, or for
#: something another alert (or nobody) answers.
ALERT_CASES: dict[str, tuple[tuple[list[dict[str, str]], int, dict[str, str]],
                             tuple[list[dict[str, str]], int]]] = {
    "NnrpGatewayNotReady": (
        ([_series("nnrp_gateway_ready", POD, "0x10"),
          _series("nnrp_gateway_upstream_ready", POD, "1x10"),
          _series("up", POD, "1x10")], 6, TARGET),
        # Not ready because vLLM is down: NnrpGatewayVllmUnreachable's, not this one's.
        ([_series("nnrp_gateway_ready", POD, "0x10"),
          _series("nnrp_gateway_upstream_ready", POD, "0x10"),
          _series("up", POD, "1x10")], 6)),
    "NnrpGatewayVllmUnreachable": (
        ([_series("nnrp_gateway_upstream_ready", POD, "0x30")], 21, TARGET),
        # A model loading for 15 minutes is not an outage.
        ([_series("nnrp_gateway_upstream_ready", POD, "0x15 1x15")], 21)),
    "NnrpGatewayErrorRatioHigh": (
        ([_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                       'transport="tcp"'), "0+90x30"),
          _series("nnrp_gateway_requests_total", _with('model_name="m", '
                                                       'outcome="upstream_error", '
                                                       'transport="tcp"'), "0+10x30"),
          _series("nnrp_gateway_upstream_errors_total",
                  _with('model_name="m", kind="backend_error"'), "0+10x30")],
         20, {"namespace": NAMESPACE, "job": JOB, "model_name": "m"}),
        # 2 % failing, and cancelled operations are no failure.
        ([_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                       'transport="tcp"'), "0+90x30"),
          _series("nnrp_gateway_requests_total", _with('model_name="m", '
                                                       'outcome="cancelled", '
                                                       'transport="tcp"'), "0+40x30"),
          _series("nnrp_gateway_requests_total", _with('model_name="m", '
                                                       'outcome="internal_error", '
                                                       'transport="tcp"'), "0+2x30")], 20)),
    "NnrpGatewayRefusalRatioHigh": (
        ([_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                       'transport="tcp"'), "0+70x30"),
          _series("nnrp_gateway_requests_total", _with('model_name="m", outcome="shed", '
                                                       'transport="tcp"'), "0+30x30"),
          _series("nnrp_gateway_overload_refusals_total",
                  _with('source="gateway", reason="waiting_requests"'), "0+30x30")],
         20, {"namespace": NAMESPACE, "job": JOB}),
        # Session opens refused are no operations refused.
        ([_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                       'transport="tcp"'), "0+70x30"),
          _series("nnrp_gateway_overload_refusals_total",
                  _with('source="gateway_session", reason="waiting_requests"'),
                  "0+30x30")], 20)),
    "NnrpGatewayTtftP99High": (
        ([_series("nnrp_gateway_first_event_seconds_bucket", _with(f'model_name="m", le="{le}"'),
                  values) for le, values in (("0.5", "0+0x30"), ("2.5", "0+0x30"),
                                             ("5.0", "0+10x30"), ("+Inf", "0+10x30"))],
         20, {"namespace": NAMESPACE, "job": JOB, "model_name": "m"}),
        ([_series("nnrp_gateway_first_event_seconds_bucket", _with(f'model_name="m", le="{le}"'),
                  values) for le, values in (("0.5", "0+10x30"), ("2.5", "0+10x30"),
                                             ("5.0", "0+10x30"), ("+Inf", "0+10x30"))], 20)),
    "NnrpGatewayDatagramDrops": (
        ([_series("nnrp_gateway_quic_dropped_datagrams_total", _with('reason="garbage"'),
                  "0+1200x30")], 20, {"namespace": NAMESPACE, "job": JOB,
                                      "reason": "garbage"}),
        # One a second: the internet's background noise.
        ([_series("nnrp_gateway_quic_dropped_datagrams_total", _with('reason="garbage"'),
                  "0+60x30")], 20)),
    "NnrpGatewayTraceSpansDropped": (
        ([_series("nnrp_gateway_trace_spans_dropped_total", _with('reason="queue_full"'),
                  "0+30x30")], 20, {"namespace": NAMESPACE, "job": JOB,
                                    "reason": "queue_full"}),
        # Drops that stopped: the collector came back ten minutes ago.
        ([_series("nnrp_gateway_trace_spans_dropped_total", _with('reason="queue_full"'),
                  "0+30x10 300x20")], 30)),
    "NnrpGatewayWorkerRestarts": (
        ([_series("nnrp_gateway_worker_restarts_total", POD, "0 0 0 1 1 1 1 1")], 5, TARGET),
        # A restart half an hour ago.
        ([_series("nnrp_gateway_worker_restarts_total", POD, "0 1x40")], 40)),
}

#: More cases for some alerts: (alert, series, minute, labels of the firing alert, or
#: None for a quiet case).
MORE_CASES: list[tuple[str, list[dict[str, str]], int, dict[str, str] | None]] = [
    # Not scraped at all: no series of the gateway's, only Prometheus' own `up`.
    ("NnrpGatewayNotReady", [_series("up", POD, "0x10")], 6, TARGET),
    # Not ready for three minutes so far (a blip, or a restart): under `for` (5m).
    ("NnrpGatewayNotReady", [_series("nnrp_gateway_ready", POD, "1 1 0 0 0 0 1 1 1 1 1"),
                             _series("nnrp_gateway_upstream_ready", POD, "1x10"),
                             _series("up", POD, "1x10")], 5, None),
    # 0.1 op/s asking for a model vLLM does not serve beside 100 op/s served: the
    # client's mistake (unsupported_model, model_name "other"), no failure of anyone's.
    ("NnrpGatewayErrorRatioHigh",
     [_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                   'transport="tcp"'), "0+6000x30"),
      _series("nnrp_gateway_requests_total", _with('model_name="other", '
                                                   'outcome="upstream_error", '
                                                   'transport="tcp"'), "0+6x30"),
      _series("nnrp_gateway_upstream_errors_total",
              _with('model_name="other", kind="unsupported_model"'), "0+6x30")], 20, None),
    # A served model's requests vLLM rejects (400) or refuses for load (503, the refusal
    # ratio's alert): 20 % of its operations, none a failure.
    ("NnrpGatewayErrorRatioHigh",
     [_series("nnrp_gateway_requests_total", _with('model_name="m", outcome="ok", '
                                                   'transport="tcp"'), "0+80x30"),
      _series("nnrp_gateway_requests_total", _with('model_name="m", '
                                                   'outcome="upstream_error", '
                                                   'transport="tcp"'), "0+20x30"),
      _series("nnrp_gateway_upstream_errors_total",
              _with('model_name="m", kind="invalid_backend_request"'), "0+10x30"),
      _series("nnrp_gateway_upstream_errors_total",
              _with('model_name="m", kind="backend_overload"'), "0+10x30")], 20, None),
]


def _unit_test(alert: str, series: list[dict[str, str]], minute: int,
               labels: dict[str, str] | None, severity: str) -> dict[str, Any]:
    expected = [] if labels is None else [{"exp_labels": {**labels, "severity": severity}}]
    return {"name": f"{alert} {'stays quiet' if labels is None else 'fires'}",
            "interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert,
                                 "exp_alerts": expected}]}


def _unit_tests() -> dict[str, Any]:
    rules = alert_rules()
    tests = []
    for alert, ((series, minute, labels), (quiet_series, quiet_minute)) in ALERT_CASES.items():
        severity = rules[alert]["labels"]["severity"]
        tests.append({"name": f"{alert} fires", "interval": "1m", "input_series": series,
                      "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert,
                                           "exp_alerts": [{"exp_labels": {
                                               **labels, "severity": severity}}]}]})
        tests.append({"name": f"{alert} stays quiet", "interval": "1m",
                      "input_series": quiet_series,
                      "alert_rule_test": [{"eval_time": f"{quiet_minute}m", "alertname": alert,
                                           "exp_alerts": []}]})
    for alert, series, minute, labels in MORE_CASES:
        tests.append(_unit_test(alert, series, minute, labels,
                                rules[alert]["labels"]["severity"]))
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


@needs_promtool
def test_promtool_fires_every_alert_and_keeps_each_quiet(tmp_path: Path) -> None:
    """Each alert against synthetic series that fire it and series that must not. The
    annotations are left out of the comparison (promtool compares them whole, and they
    only describe); their templates are checked by ``promtool check rules``."""
    assert set(ALERT_CASES) == set(alert_rules())
    document = rules_document()
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_unit_tests()))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_error_ratio_alert_is_the_dashboards() -> None:
    """One definition of a failure: the rule's expression is the builder's, and what it
    leaves out are vLLM's failure kinds indeed (the outcome table's upstream causes)."""
    from gateway.profile import END_TABLE, EndCause

    expr = alert_rules()["NnrpGatewayErrorRatioHigh"]["expr"]
    built = dashboard.error_ratio(GW, "5m", "namespace, job, model_name")
    assert re.sub(r"\s+", "", expr) == re.sub(r"\s+", "", f"{built} > 0.05")
    for kind in dashboard.NOT_FAILURES:
        assert END_TABLE[EndCause(kind)].upstream_error, kind
    assert dashboard.error_ratio(dashboard.GW_MODEL, dashboard.RATE,
                                 "model_name") in dashboard.queries()


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The harness is no rubber stamp: a firing case expected quiet fails."""
    tests = _unit_tests()
    tests["tests"][0]["alert_rule_test"][0]["exp_alerts"] = []
    document = rules_document()
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode != 0
