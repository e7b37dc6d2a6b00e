"""How the chart stops a pod (docs/fleet.md, "Draining pods"): vLLM aborts what it is
generating on SIGTERM, so in container mode its preStop sleep (vllm.preStopSleepSeconds)
outlasts the gateway's preStop sleep and drain, by default exactly; an explicit number
overrides it, 0 removes the hook, null is the default. In native mode the gateway, a
sidecar, stops only after vLLM has exited, so vLLM gets no hook by default and one set
explicitly comes before the gateway's stop. terminationGracePeriodSeconds is checked
against both: the longer stop plus 5 s in container mode, their sum plus 5 s in native."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import (
    BIN,
    CHART,
    fleet,
    gateway_container as _gateway,
    helm,
    render_values,
    secured,
)

Manifests = dict[str, list[dict[str, Any]]]


def _pod(manifests: Manifests) -> dict[str, Any]:
    return manifests["Deployment"][0]["spec"]["template"]["spec"]


def _vllm(manifests: Manifests) -> dict[str, Any]:
    return next(c for c in _pod(manifests)["containers"] if c["name"] == "vllm")


def _vllm_sleep(manifests: Manifests) -> int | None:
    """Seconds of vLLM's preStop sleep; None without a lifecycle block."""
    lifecycle = _vllm(manifests).get("lifecycle")
    if lifecycle is None:
        return None
    assert set(lifecycle) == {"preStop"}
    assert set(lifecycle["preStop"]) == {"sleep"}  # the gateway's form (a sleep action)
    seconds: int = lifecycle["preStop"]["sleep"]["seconds"]
    return seconds


def _gateway_stop(manifests: Manifests) -> int:
    """The gateway's preStop sleep plus its --drain-timeout, as rendered."""
    gateway, _ = _gateway(manifests)
    args = gateway["args"]
    return (gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
            + int(args[args.index("--drain-timeout") + 1]))


def _fails_on_grace(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds"):
        helm.Chart.load(str(CHART)).render(values, name="x")


@pytest.mark.parametrize("gateway", [
    {},
    {"preStopSleepSeconds": 10, "drainTimeoutSeconds": 45},
    {"preStopSleepSeconds": 0, "drainTimeoutSeconds": 0},
], ids=["defaults", "sleep-10-drain-45", "sleep-0-drain-0"])
def test_container_mode_vllm_sleeps_through_the_gateways_sleep_and_drain(
        gateway: dict[str, Any]) -> None:
    """By default vLLM's preStop sleep is the gateway's preStop sleep plus its drain
    timeout: vLLM gets its SIGTERM once the drain is over, not while it runs."""
    manifests = render_values({"sidecarMode": "container", "gateway": gateway})
    assert not _gateway(manifests)[1]
    stop = _gateway_stop(manifests)
    assert stop == gateway.get("preStopSleepSeconds", 5) + gateway.get("drainTimeoutSeconds", 30)
    if stop:
        assert _vllm_sleep(manifests) == stop
    else:  # nothing to outlast: a sleep of 0 s is no hook
        assert _vllm_sleep(manifests) is None
    # null, as values.yaml has it, is the same default.
    assert render_values({"sidecarMode": "container", "gateway": gateway,
                          "vllm": {"preStopSleepSeconds": None}}) == manifests


def test_an_explicit_vllm_sleep_overrides_and_0_removes_the_hook() -> None:
    longer = render_values({"sidecarMode": "container", "terminationGracePeriodSeconds": 90,
                            "vllm": {"preStopSleepSeconds": 80}})
    assert _vllm_sleep(longer) == 80
    shorter = render_values({"sidecarMode": "container", "vllm": {"preStopSleepSeconds": 12}})
    assert _vllm_sleep(shorter) == 12
    off = render_values({"sidecarMode": "container", "vllm": {"preStopSleepSeconds": 0}})
    assert _vllm_sleep(off) is None
    # The gateway's own preStop is untouched by vLLM's.
    for manifests in (longer, shorter, off):
        assert _gateway(manifests)[0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    chart = helm.Chart.load(str(CHART))
    for bad in (-1, 2.5, "35"):
        with pytest.raises(helm.HelmError, match="preStopSleepSeconds"):
            chart.render({"sidecarMode": "container", "vllm": {"preStopSleepSeconds": bad}},
                         name="x")


def test_container_mode_grace_covers_the_longer_stop() -> None:
    """Both preStop hooks run at once: the grace must cover the longer of the gateway's
    sleep and drain and vLLM's sleep, plus 5 s; 1 s less fails to render."""
    # The default: vLLM's sleep is the gateway's stop, the minimum unchanged (35 + 5).
    render_values({"sidecarMode": "container", "terminationGracePeriodSeconds": 40})
    _fails_on_grace({"sidecarMode": "container", "terminationGracePeriodSeconds": 39})
    # A vLLM sleep longer than the gateway's stop sets the minimum.
    vllm = {"preStopSleepSeconds": 70}
    render_values({"sidecarMode": "container", "vllm": vllm,
                   "terminationGracePeriodSeconds": 75})
    _fails_on_grace({"sidecarMode": "container", "vllm": vllm,
                     "terminationGracePeriodSeconds": 74})
    _fails_on_grace({"sidecarMode": "container", "vllm": vllm})  # the default 60 s
    # A shorter one does not lower it below the gateway's.
    vllm = {"preStopSleepSeconds": 10}
    render_values({"sidecarMode": "container", "vllm": vllm,
                   "terminationGracePeriodSeconds": 40})
    _fails_on_grace({"sidecarMode": "container", "vllm": vllm,
                     "terminationGracePeriodSeconds": 39})
    # The computed sleep follows the gateway's values, and the check with it.
    gateway = {"preStopSleepSeconds": 10, "drainTimeoutSeconds": 50}
    render_values({"sidecarMode": "container", "gateway": gateway,
                   "terminationGracePeriodSeconds": 65})
    _fails_on_grace({"sidecarMode": "container", "gateway": gateway,
                     "terminationGracePeriodSeconds": 64})


def test_the_grace_error_names_what_it_needs() -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError) as error:
        chart.render({"sidecarMode": "container", "vllm": {"preStopSleepSeconds": 70}},
                     name="x")
    assert "vLLM's preStop sleep (70)" in str(error.value)
    assert "(75)" in str(error.value)
    with pytest.raises(helm.HelmError) as error:
        chart.render({"vllm": {"preStopSleepSeconds": 30}}, name="x")
    assert "native mode" in str(error.value)
    assert "(70)" in str(error.value)


def test_native_mode_gives_vllm_no_hook_by_default() -> None:
    """Native mode: the gateway is a sidecar (initContainers, restartPolicy Always) that
    Kubernetes stops only after vLLM has exited; a vLLM sleep would postpone the drain, not
    run beside it, so none renders, and the minimum grace stays the gateway's stop + 5 s."""
    manifests = render_values({})
    gateway, native = _gateway(manifests)
    assert native and gateway["restartPolicy"] == "Always"
    assert gateway["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert _vllm_sleep(manifests) is None
    assert render_values({"sidecarMode": "native", "vllm": {"preStopSleepSeconds": None}}) == (
        manifests)
    render_values({"terminationGracePeriodSeconds": 40})
    _fails_on_grace({"terminationGracePeriodSeconds": 39})


def test_native_mode_adds_an_explicit_vllm_sleep_before_the_gateways_stop() -> None:
    """Set explicitly in native mode, vLLM's sleep renders, and the grace must cover it and
    the gateway's stop one after the other."""
    manifests = render_values({"vllm": {"preStopSleepSeconds": 10}})
    assert _gateway(manifests)[1]
    assert _vllm_sleep(manifests) == 10
    render_values({"vllm": {"preStopSleepSeconds": 10}, "terminationGracePeriodSeconds": 50})
    _fails_on_grace({"vllm": {"preStopSleepSeconds": 10}, "terminationGracePeriodSeconds": 49})
    assert _vllm_sleep(render_values({"vllm": {"preStopSleepSeconds": 0}})) is None


@pytest.mark.parametrize("values", [
    {"sidecarMode": "container"},
    {"sidecarMode": "container", "vllm": {"preStopSleepSeconds": 80},
     "terminationGracePeriodSeconds": 90},
    {"vllm": {"preStopSleepSeconds": 10}},
], ids=["container-default", "container-explicit", "native-explicit"])
def test_vllm_hook_validates(values: dict[str, Any], tmp_path: Path) -> None:
    """The Deployment with vLLM's hook passes kubernetes-validate (strict, 1.30: the sleep
    action's first version on by default) and yamllint."""
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(render_values(values)["Deployment"][0]))
    result = subprocess.run([str(BIN / "yamllint"), "-d", "relaxed", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    result = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "--quiet",
                             "-k", "1.30.0", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_fleet_container_mode_keeps_vllm_through_the_drain() -> None:
    """Forwarded resumes to a draining pod are part of the drain: in container mode vLLM
    generates through it in fleet mode too."""
    manifests = render_values(fleet(sidecarMode="container"))
    assert _vllm_sleep(manifests) == _gateway_stop(manifests)
    assert _vllm_sleep(render_values(fleet())) is None  # ci/fleet-values.yaml: native


def test_notes_say_how_the_pod_stops() -> None:
    chart = helm.Chart.load(str(CHART))

    def notes(values: dict[str, Any]) -> str:
        return " ".join(chart.render(secured(values), name="test", namespace="ml")[
            "nnrp-vllm-gateway/templates/NOTES.txt"].split())

    native = notes({})
    assert "the gateway sleeps 5 s, then drains for up to 30 s" in native
    assert "stops the gateway only after vLLM has exited" in native
    assert "sidecarMode=container keeps vLLM generating through the drain" in native
    assert "vLLM sleeps 35 s before its SIGTERM" in notes({"sidecarMode": "container"})
    assert "less than the gateway's 35 s" in notes({"sidecarMode": "container",
                                                    "vllm": {"preStopSleepSeconds": 10}})
    assert "vLLM has no preStop hook" in notes({"sidecarMode": "container",
                                                "vllm": {"preStopSleepSeconds": 0}})


def test_docs_describe_the_stop_order() -> None:
    root = CHART.parents[1]
    fleet_doc = " ".join((root / "docs" / "fleet.md").read_text().split())
    draining = fleet_doc[fleet_doc.index("## Draining pods"):]
    assert "`vllm.preStopSleepSeconds`" in draining
    assert "**`sidecarMode: native`** (the default)" in draining
    assert "vLLM has no preStop hook in this chart" not in fleet_doc
    deploy_doc = " ".join((root / "docs" / "deploy.md").read_text().split())
    stopping = deploy_doc[deploy_doc.index("### Stopping a pod"):]
    assert "`vllm.preStopSleepSeconds`" in stopping
    values = (CHART / "values.yaml").read_text()
    assert "  preStopSleepSeconds: null\n" in values
