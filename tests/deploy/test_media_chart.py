"""The chart's part of media delivery through a shared directory (docs/media.md): one
emptyDir, mounted at one path into both containers (vLLM's read-only), named to the
gateway by --media-dir and to vLLM by --allowed-local-media-path; none of it while off."""

from __future__ import annotations

from typing import Any

from tests.support.chart import Manifests, cli_options, gateway_container, render_values


def _vllm(manifests: Manifests) -> dict[str, Any]:
    spec = manifests["Deployment"][0]["spec"]["template"]["spec"]
    container: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == "vllm")
    return container


def _volumes(manifests: Manifests) -> dict[str, dict[str, Any]]:
    spec = manifests["Deployment"][0]["spec"]["template"]["spec"]
    return {volume["name"]: volume for volume in spec["volumes"]}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {mount["name"]: mount for mount in container.get("volumeMounts", [])}


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_media_on_shares_one_directory_at_one_path() -> None:
    manifests = render_values({"vllm": {"model": "m"}, "media": {
        "enabled": True, "mountPath": "/media", "sizeLimit": "3Gi", "medium": "Memory"}})
    gateway, _ = gateway_container(manifests)
    vllm = _vllm(manifests)
    assert _after(gateway["args"], "--media-dir") == "/media"
    assert _after(gateway["args"], "--media-dir-bytes") == "1073741824"
    assert _after(vllm["args"], "--allowed-local-media-path") == "/media"
    assert _mounts(gateway)["media"] == {"name": "media", "mountPath": "/media"}
    assert _mounts(vllm)["media"] == {"name": "media", "mountPath": "/media", "readOnly": True}
    assert _volumes(manifests)["media"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    options, _ = cli_options("serve")
    assert "--media-dir" in options  # the flag the chart passes is the CLI's


def test_media_off_renders_none_of_it() -> None:
    manifests = render_values({"vllm": {"model": "m"}})
    gateway, _ = gateway_container(manifests)
    assert "--media-dir" not in gateway["args"]
    assert "--allowed-local-media-path" not in _vllm(manifests)["args"]
    assert "media" not in _volumes(manifests)
    assert "media" not in _mounts(gateway) and "media" not in _mounts(_vllm(manifests))


def test_the_default_medium_is_the_nodes_disk() -> None:
    manifests = render_values({"vllm": {"model": "m"}, "media": {"enabled": True}})
    assert _volumes(manifests)["media"]["emptyDir"] == {"sizeLimit": "2Gi"}
