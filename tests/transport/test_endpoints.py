"""Listen URIs (gateway/transport/_endpoints.py): what each scheme parses to, why a bad one
is refused, and the fleet listener's URI from the address a pod advertises."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.transport import ListenError, fleet_uri, parse_endpoint


@pytest.mark.parametrize(("uri", "expected"), [
    ("tcp://127.0.0.1:7700", ("tcp", "127.0.0.1", 7700, "/", "tcp", False)),
    ("tcps://[::1]:0", ("tcps", "::1", 0, "/", "tcp", True)),
    ("unix:///run/nnrp.sock", ("unix", "", 0, "/run/nnrp.sock", "ipc", False)),
    ("unix://run/nnrp.sock", ("unix", "", 0, "/run/nnrp.sock", "ipc", False)),
    ("ws://0.0.0.0:7701/nnrp", ("ws", "0.0.0.0", 7701, "/nnrp", "websocket", False)),
    ("WSS://h:1", ("wss", "h", 1, "/", "websocket", True)),
])
def test_endpoints_parse(uri: str, expected: tuple[Any, ...]) -> None:
    endpoint = parse_endpoint(uri)
    assert (endpoint.scheme, endpoint.host, endpoint.port, endpoint.path, endpoint.transport,
            endpoint.tls) == expected


@pytest.mark.parametrize(("uri", "problem"), [
    ("http://h:1", "scheme must be"),
    ("tcp://h", "needs host and port"),
    ("tcp://h:99999", "out of range"),
    ("unix://", "needs a path"),
])
def test_bad_endpoints_say_why(uri: str, problem: str) -> None:
    with pytest.raises(ListenError, match=problem):
        parse_endpoint(uri)


@pytest.mark.parametrize(("advertise", "uri"), [
    ("10.0.0.1:7702", "tcp://10.0.0.1:7702"),
    ("fd00::12:7702", "tcp://[fd00::12]:7702"),  # the downward API's IPv6 pod IP
    ("[fd00::12]:7702", "tcp://[fd00::12]:7702"),
    ("gateway-0.gateway-fleet:7702", "tcp://gateway-0.gateway-fleet:7702"),
])
def test_the_fleet_listener_is_the_advertised_address(advertise: str, uri: str) -> None:
    assert fleet_uri(advertise) == uri


@pytest.mark.parametrize(("advertise", "says"), [
    ("::1", "is HOST:PORT"), ("pod", "is HOST:PORT"), ("pod:x", "is HOST:PORT"),
    ("10.0.0.1:0", "fixed port"), ("0.0.0.0:7702", "wildcard"), (":::7702", "wildcard"),
    ("tcp://10.0.0.1:7702", "not a URL"),
])
def test_an_address_other_pods_cannot_reach_is_refused(advertise: str, says: str) -> None:
    with pytest.raises(ListenError, match=says):
        fleet_uri(advertise)
