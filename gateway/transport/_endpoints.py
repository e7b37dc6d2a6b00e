"""Endpoint URIs: what ``--listen`` and a client's ``--endpoint`` accept, and how a bound
listener is named back to clients.

``tcp://host:port``, ``unix:///path``, ``ws://host:port/path``, the TLS forms
``tcps://host:port`` and ``wss://host:port/path``, and ``quic://host:port`` (always TLS
1.3). Port 0 asks the OS for a free port (a listener) and is refused by ``connect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from gateway.errors import ConfigError, GatewayError


class ListenError(ConfigError):
    """An endpoint URI that cannot be used."""

    @classmethod
    def cannot_bind(cls, uri: str, error: OSError) -> ListenError:
        """A bind that failed, naming the listener (the OS's message names nothing)."""
        what = (error.strerror or str(error) or type(error).__name__)
        return cls(f"cannot listen on {uri}: {what[:1].lower()}{what[1:]}")


class ListenerFailed(GatewayError):
    """A bound listener failed for good (its socket broke after bind): the server closes
    its whole listener set rather than serve on fewer listeners than configured
    (``gateway.server.GatewayServer``; ``_listeners.ACCEPT_FAILURES`` says which failure
    is terminal). ``uri`` names the listener, ``transport`` its kind."""

    def __init__(self, uri: str, transport: str, error: BaseException) -> None:
        what = (getattr(error, "strerror", None) or str(error) or type(error).__name__)
        super().__init__(f"listener {uri} failed: {what}; the whole listener set is closed")
        self.uri = uri
        self.transport = transport
        self.error = error


@attrs.frozen
class Endpoint:
    """A parsed endpoint URI."""

    scheme: str  # "tcp", "tcps", "unix", "ws", "wss" or "quic"
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def transport(self) -> str:
        """The bounded transport label: ``tcp``, ``ipc``, ``websocket`` or ``quic``."""
        return {"tcp": "tcp", "tcps": "tcp", "unix": "ipc", "ws": "websocket",
                "wss": "websocket", "quic": "quic"}[self.scheme]

    @property
    def tls(self) -> bool:
        return self.scheme in ("tcps", "wss")  # quic:// is always TLS (its own stack)


@attrs.frozen
class QuicClientOptions:
    """How ``connect`` opens a ``quic://`` connection (trust comes from its ssl_context).

    Args:
        alpn: the ALPN protocols offered; empty offers none, as nnrp-py's native client
            does (the listener's default policy, ``--quic-alpn any``, accepts that and
            ``nnrp/1``). ``("nnrp/1",)`` for a listener that requires it.
        server_name: the name checked against the server's certificate (and sent as
            SNI); default: the URI's host.
        ca_file: PEM trust anchors, before anything ``ssl_context`` holds. aioquic keeps
            its own store and an ``ssl.SSLContext`` only lists its CA certificates
            (``get_ca_certs``), so a self-signed server certificate without the CA flag
            must be given here.
        idle_timeout: the QUIC idle timeout this client asks for (the connection ends
            after the shorter of both sides'; the gateway pings while it is open).
        send_buffer: unacknowledged bytes beyond which ``send()`` waits.
    """

    alpn: tuple[str, ...] = ()
    server_name: str | None = None
    ca_file: Path | None = None
    idle_timeout: float = 30.0
    send_buffer: int = 512 * 1024


def parse_endpoint(uri: str) -> Endpoint:
    """Parse one ``--listen`` value or client endpoint."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ListenError(f"{uri}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "unix":
        path = parts.path if not parts.netloc else f"/{parts.netloc}{parts.path}"
        if not path:
            raise ListenError(f"{uri}: a unix listener needs a path (unix:///run/nnrp.sock)")
        return Endpoint("unix", path=path)
    if scheme not in ("tcp", "tcps", "ws", "wss", "quic"):
        raise ListenError(f"{uri}: scheme must be tcp://, unix:// or ws:// (or tcps://, wss://, "
                          "quic://)")
    try:
        port = parts.port
    except ValueError as exc:
        raise ListenError(f"{uri}: {exc}") from exc
    if parts.hostname is None or port is None:
        raise ListenError(f"{uri}: needs host and port (use port 0 for any free port)")
    return Endpoint(scheme, parts.hostname, port, parts.path or "/")


def fleet_uri(advertise: str) -> str:
    """The listener of ``--fleet-advertise HOST:PORT`` (plain TCP: a forward is
    authenticated by its header, gateway/nnrp/_fleet.py F4); ``ListenError`` for an
    address other pods could not reach (no host, no port, port 0)."""
    host, _, port = advertise.rpartition(":")
    if host.count(":") and not host.startswith("["):  # an IPv6 pod IP, as the downward
        host = f"[{host}]"  # API gives it: written without brackets before :PORT
    uri = f"tcp://{host}:{port}"
    if "/" in advertise or "@" in advertise:
        raise ListenError(f"{advertise}: --fleet-advertise is HOST:PORT, not a URL")
    try:
        spec = parse_endpoint(uri)
    except (ListenError, ValueError):  # urlsplit's own, for a malformed [IPv6] host
        raise ListenError(f"{advertise}: --fleet-advertise is HOST:PORT "
                          "(the address other gateways of the fleet reach this one at)"
                          ) from None
    if not spec.port:
        raise ListenError(f"{advertise}: --fleet-advertise needs a fixed port (other "
                          "gateways connect to it)")
    if spec.host in ("0.0.0.0", "::", "[::]"):
        raise ListenError(f"{advertise}: --fleet-advertise names this pod's own address "
                          "(the pod IP), not a wildcard")
    return uri


def bound_uri(spec: Endpoint, sockname: Any) -> str:
    """The URI a client uses for a listener bound at ``sockname`` (port 0 resolved)."""
    if spec.scheme == "unix":
        return f"unix://{spec.path}"
    host, port = sockname[:2]
    if spec.scheme in ("ws", "wss"):  # the configured host: the name the path lives under
        return f"{spec.scheme}://{format_host(spec.host)}:{port}{spec.path}"
    return f"{spec.scheme}://{format_host(host)}:{port}"


def format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


