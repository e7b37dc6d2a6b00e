"""The project's own quic:// client (gateway/transport/_quic_client.py through
``gateway.transport.connect`` and ``gateway.tools.client.connect``) against the gateway's
QUIC listener: streaming, ALPN, trust, refusals, and the end of a connection."""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from gateway import nnrp
from gateway.tools.client import connect
from gateway.transport import (
    AlpnPolicy,
    QuicClientOptions,
    QuicSettings,
    TlsConfig,
    connect as connect_transport,
)
from gateway.transport._quic_client import _unacked_bytes
from gateway.transport.quic import QuicClientTransport, QuicConnectError, client_configuration
from tests.support.quic import Pki, make_pki, needs_ipv6_loopback, start_quic_server
from tests.support.tls import client_context, make_pki as tls_pki
from tests.support.waits import until

pytest.importorskip("aioquic")


def script(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


def trusting(pki: Pki) -> QuicClientOptions:
    """The test certificate is self-signed without the CA flag: an SSLContext would not
    list it (get_ca_certs), so it is given as a file."""
    return QuicClientOptions(ca_file=pki.cert)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def test_our_client_streams_over_quic(nursery: trio.Nursery, pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki)
    with trio.fail_after(15):
        async with connect(gateway.uri, quic=trusting(pki)) as client:
            assert client.transport.kind == "quic"
            session = await client.open_session()
            operation = await session.submit(script(events=50, size=300), trace_id=0xABC)
            events = [event async for event in operation.events()]
            await session.close()
    assert [type(e).__name__ for e in events] == ["PartialReceived"] * 50 + ["ResultReceived"]
    assert [json.loads(e.body)["n"] for e in events[:-1]] == list(range(50))
    (seen,) = gateway.seen.operations
    assert seen.notes.transport == "quic"
    assert seen.header_trace_id == 0xABC
    assert gateway.stats.connections_total == 1


@needs_ipv6_loopback
async def test_our_client_over_ipv6_through_a_retry(nursery: trio.Nursery, pki: Pki) -> None:
    """Issue 26: a listener on ::1 with address validation on every connection (a Retry,
    whose token binds the client's IPv6 address) serves the project's client."""
    gateway = await start_quic_server(nursery, pki, host="[::1]", retry_threshold=0)
    assert gateway.uri.startswith("quic://[::1]:")
    with trio.fail_after(15):
        async with connect(gateway.uri, quic=trusting(pki)) as client:
            session = await client.open_session()
            operation = await session.submit(script(events=3))
            events = [event async for event in operation.events()]
            await session.close()
    assert [type(e).__name__ for e in events] == ["PartialReceived"] * 3 + ["ResultReceived"]
    assert gateway.stats.retries == 1
    assert gateway.stats.invalid_tokens == 0
    (seen,) = gateway.seen.operations
    assert seen.notes.transport == "quic"


async def test_a_large_write_is_paced_by_the_send_buffer(nursery: trio.Nursery,
                                                         pki: Pki) -> None:
    """2 MiB of submits through a 64 KiB send buffer: never more than the buffer plus one
    write is unacknowledged, and everything arrives."""
    gateway = await start_quic_server(nursery, pki)
    send_buffer = 64 * 1024
    backlogs: list[int] = []
    with trio.fail_after(30):
        async with connect(gateway.uri, quic=attrs.evolve(trusting(pki),
                                                          send_buffer=send_buffer)) as client:
            transport = client.transport
            assert isinstance(transport, QuicClientTransport)
            session = await client.open_session()
            operations = []
            padding = "p" * 16_000
            for _ in range(128):
                operations.append(await session.submit(script(events=1, pad=padding)))
                backlogs.append(_unacked_bytes(transport.quic, 0))
            for operation in operations:
                assert [type(e).__name__ async for e in operation.events()][-1] == \
                    "ResultReceived"
    assert max(backlogs) <= send_buffer + 17_000
    assert max(backlogs) > send_buffer // 2  # the bound was reached, so it was tested
    assert len(gateway.seen.operations) == 128


@pytest.mark.parametrize(("policy", "offer", "selected"), [
    (AlpnPolicy.NONE, (), None),
    (AlpnPolicy.NNRP, ("nnrp/1",), "nnrp/1"),
    (AlpnPolicy.ANY, ("nnrp/1",), "nnrp/1"),
    (AlpnPolicy.ANY, (), None),
])
async def test_alpn_is_what_the_client_offers(nursery: trio.Nursery, pki: Pki,
                                              policy: AlpnPolicy, offer: tuple[str, ...],
                                              selected: str | None) -> None:
    gateway = await start_quic_server(nursery, pki, alpn=policy)
    with trio.fail_after(10):
        async with trio.open_nursery() as inner:
            transport = await connect_transport(gateway.uri, inner,
                                                quic=attrs.evolve(trusting(pki), alpn=offer))
            assert isinstance(transport, QuicClientTransport)
            assert transport.alpn == selected
            await transport.aclose()


async def test_the_default_listener_accepts_the_spec_alpn_and_none(nursery: trio.Nursery,
                                                                  pki: Pki) -> None:
    """No ``alpn`` given: the spec's nnrp/1 is selected when offered, and a client that
    offers none (nnrp-py's native client; test_quic_listener.py drives it against this
    default) is served too (AlpnPolicy: why ANY is the default)."""
    gateway = await start_quic_server(nursery, pki)
    assert QuicSettings(TlsConfig(pki.cert, pki.key)).alpn is AlpnPolicy.ANY
    for offer, selected in ((("nnrp/1",), "nnrp/1"), ((), None)):
        with trio.fail_after(10):
            async with connect(gateway.uri, quic=attrs.evolve(trusting(pki),
                                                              alpn=offer)) as client:
                assert isinstance(client.transport, QuicClientTransport)
                assert client.transport.alpn == selected
                session = await client.open_session()
                operation = await session.submit(script(events=1))
                assert [type(e).__name__ async for e in operation.events()] == \
                    ["PartialReceived", "ResultReceived"]
                await session.close()


@pytest.mark.parametrize(("policy", "offer"), [
    (AlpnPolicy.NONE, ("nnrp/1",)),  # a no-ALPN-only listener refuses an ALPN offer
    (AlpnPolicy.NNRP, ()),
])
async def test_a_refused_alpn_is_a_connect_error(nursery: trio.Nursery, pki: Pki,
                                                 policy: AlpnPolicy,
                                                 offer: tuple[str, ...]) -> None:
    gateway = await start_quic_server(nursery, pki, alpn=policy)
    refused = r"handshake with quic://.* failed: .*ALPN"
    with trio.fail_after(10), pytest.raises(QuicConnectError, match=refused):
        async with connect(gateway.uri, quic=attrs.evolve(trusting(pki), alpn=offer)):
            pass
    assert not gateway.seen.operations


async def test_trust_and_server_name(nursery: trio.Nursery, pki: Pki,
                                     tmp_path: Path) -> None:
    gateway = await start_quic_server(nursery, pki)
    stranger = make_pki(tmp_path / "other", name="other")
    with trio.fail_after(10):
        with pytest.raises(QuicConnectError, match="self-signed"):
            async with connect(gateway.uri, quic=trusting(stranger)):
                pass
        # The certificate names localhost and 127.0.0.1: another name is refused...
        with pytest.raises(QuicConnectError, match="doesn't match"):
            async with connect(gateway.uri, quic=attrs.evolve(
                    trusting(pki), server_name="gateway.example")):
                pass
        async with connect(gateway.uri, quic=attrs.evolve(trusting(pki),
                                                          server_name="localhost")) as client:
            await client.open_session()
        # ...and an unverifying context (CERT_NONE) trusts anything, as for tcps://.
        anything = ssl.create_default_context()
        anything.check_hostname = False
        anything.verify_mode = ssl.CERT_NONE
        async with connect(gateway.uri, ssl_context=anything) as client:
            await client.open_session()


def test_without_a_context_the_system_store_is_named_not_loaded(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ssl_context: the system's store by its paths (aioquic reads it in the handshake)
    or the ca_file alone. Building a default SSLContext per connect, only to read it back,
    cost ~50 ms of CPU each: 128 concurrent connects of the wire benchmark timed out."""
    def no_default_context(*args: Any, **kw: Any) -> ssl.SSLContext:
        raise AssertionError("the system store was loaded")

    monkeypatch.setattr(ssl, "create_default_context", no_default_context)
    system = client_configuration(QuicClientOptions(), "localhost", None)
    paths = ssl.get_default_verify_paths()
    assert system.verify_mode == ssl.CERT_REQUIRED
    assert (system.cafile, system.capath, system.cadata) == (paths.cafile, paths.capath, None)
    only_file = client_configuration(trusting(pki), "localhost", None)
    assert only_file.verify_mode == ssl.CERT_REQUIRED
    assert (only_file.cafile, only_file.capath, only_file.cadata) == (str(pki.cert), None, None)


async def test_trust_from_an_ssl_context_with_a_ca(nursery: trio.Nursery,
                                                   tmp_path: Path) -> None:
    """The tcps:// way: a context built from the CA's file; its CA certificates verify
    the server's chain (certificate for 127.0.0.1, signed by the CA)."""
    paths = tls_pki(tmp_path)
    served = Pki(paths["server"], paths["server_key"], b"")
    gateway = await start_quic_server(nursery, served)
    with trio.fail_after(10):
        async with connect(gateway.uri, ssl_context=client_context(paths, with_cert=False)
                           ) as client:
            await client.open_session()
        wrong = ssl.create_default_context(cafile=str(make_pki(tmp_path / "x").cert))
        with pytest.raises(QuicConnectError):
            async with connect(gateway.uri, ssl_context=wrong):
                pass
    assert len(gateway.seen.operations) == 0
    assert gateway.stats.connections_total >= 1


async def test_nothing_listening_fails_fast() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The ICMP "port unreachable" answers at once, long before any QUIC timeout.
    with trio.fail_after(3), pytest.raises(QuicConnectError, match="nothing listens"):
        async with connect(f"quic://127.0.0.1:{port}"):
            pass
    assert isinstance(QuicConnectError("x"), OSError)  # callers catch it as a refused connect


async def test_the_server_going_away_ends_the_transport(nursery: trio.Nursery,
                                                        pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki)
    with trio.fail_after(15):
        async with trio.open_nursery() as inner:
            transport = await connect_transport(gateway.uri, inner, quic=trusting(pki))
            client = nnrp.ClientConnection()
            await transport.send([client.hello()])
            hello = await transport.receive()
            assert hello is not None
            assert client.receive_data(hello)  # SERVER_HELLO_ACK
            await gateway.stop()  # the listener sends CONNECTION_CLOSE as it is cancelled
            assert await transport.receive() is None
            await until(lambda: isinstance(transport, QuicClientTransport)
                        and transport.ended is not None)
            with pytest.raises(trio.BrokenResourceError):
                await transport.send([client.open_session()])
            await transport.aclose()
