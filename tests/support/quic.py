"""QUIC test peers: certificates, a GatewayServer with a quic:// listener, nnrp-py's native
client options, and a small aioquic client driven by trio (the second client: it can offer
any ALPN, open extra streams, stop acknowledging, or vanish).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import math
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    QuicEvent,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.nnrp import ServerConfig
from gateway.server import ConnectionLimits, GatewayServer, Operation
from gateway.tools.client import ClientError, NnrpClient
from gateway.transport import QuicSettings, TlsConfig as TlsConfig
from tests.support.servers import Seen, scripted_handler
from tests.support.stack import Stack, start_stack


def has_ipv6_loopback() -> bool:
    """Whether a UDP socket can bind ::1 here (containers often have no IPv6 at all)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


#: For tests that listen on ::1.
needs_ipv6_loopback = pytest.mark.skipif(not has_ipv6_loopback(),
                                         reason="this machine has no IPv6 loopback (::1)")


@attrs.frozen
class Pki:
    cert: Path
    key: Path
    der: bytes  # the certificate (self-signed: also the trust anchor)


def make_pki(folder: Path, name: str = "server") -> Pki:
    """A self-signed ECDSA certificate for localhost, 127.0.0.1 and ::1."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}.localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]),
                critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Pki(cert_path, key_path, cert.public_bytes(serialization.Encoding.DER))


@attrs.define
class QuicServer:
    server: GatewayServer
    uri: str
    seen: Seen
    scope: trio.CancelScope
    stopped: trio.Event

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.uri.removeprefix("quic://").rpartition(":")
        return host.strip("[]"), int(port)  # an IPv6 host without its URI brackets

    @property
    def stats(self) -> Any:
        return self.server.quic_listeners[0].stats

    @property
    def endpoint(self) -> Any:
        return self.server.quic_listeners[0].endpoint

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()


async def start_quic_server(nursery: trio.Nursery, pki: Pki, *, port: int = 0,
                            host: str = "127.0.0.1",
                            limits: ConnectionLimits | None = None,
                            **quic: Any) -> QuicServer:
    """A GatewayServer with one quic:// listener on ``host`` (``[::1]`` for IPv6) and the
    scripted handler, in its own cancel scope (``stop()`` ends it without touching the
    test's nursery)."""
    seen = Seen()

    async def handler(op: Operation) -> None:
        await scripted_handler(op, seen)

    server = GatewayServer(handler, config=ServerConfig(),
                           limits=limits or ConnectionLimits(handshake_timeout=5.0),
                           quic=QuicSettings(TlsConfig(pki.cert, pki.key), **quic))
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[list[Any]]) -> None:
        try:
            with scope:
                await server.serve([f"quic://{host}:{port}"], task_status=task_status)
        finally:
            stopped.set()

    endpoints = await nursery.start(run)
    return QuicServer(server, endpoints[0].uri, seen, scope, stopped)


async def start_quic_stack(nursery: trio.Nursery, folder: Path, **config: Any
                           ) -> tuple[Stack, Pki]:
    """The whole stack (tests.support.stack: replay vLLM, Gateway on tcp, unix and ws)
    plus a quic:// listener with a fresh self-signed certificate."""
    pki = make_pki(folder / "pki")
    stack = await start_stack(nursery, folder, extra_listen=("quic://127.0.0.1:0",),
                              tls=TlsConfig(pki.cert, pki.key), **config)
    return stack, pki


def native_quic_options(uri: str, der: bytes) -> Any:
    """nnrp-py native client options for our quic:// listener (server authenticated)."""
    from nnrp.client.native import NativeClientOptions, NativeClientProviderRoute
    from nnrp.core.messages import TransportPolicy
    from nnrp.native import NativeTransportClientSecurity

    address = uri.removeprefix("quic://")
    security = NativeTransportClientSecurity(server_name="localhost",
                                             trusted_certificate_der=der)
    return NativeClientOptions(f"nnrp://{address}", provider_routes={
        "quic": NativeClientProviderRoute(provider_endpoint=f"quic://{address}",
                                          security=security)},
        transport_policy=TransportPolicy.FORCE_QUIC)


class AioquicClient:
    """aioquic's client ``QuicConnection`` on a trio UDP socket.

    Switches for misbehaving: ``deaf`` drops every incoming datagram (so nothing is
    acknowledged: a client that stopped reading), ``vanished`` also stops sending (a
    client whose host went away without a word).
    """

    def __init__(self, address: tuple[str, int], *, alpn: list[str] | None, ca: Path,
                 idle_timeout: float = 10.0) -> None:
        configuration = QuicConfiguration(is_client=True, alpn_protocols=alpn,
                                          server_name="localhost", idle_timeout=idle_timeout)
        configuration.load_verify_locations(cafile=str(ca))
        self.quic = QuicConnection(configuration=configuration)
        self.address = address
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.bind(("127.0.0.1", 0))
        self._trio_sock = trio.socket.from_stdlib_socket(self.sock)
        self.received: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}
        self.stopped: dict[int, int] = {}
        self.handshake: HandshakeCompleted | None = None
        self.terminated: ConnectionTerminated | None = None
        self.events: list[QuicEvent] = []
        self.deaf = False
        self.vanished = False
        self._changed = trio.Event()
        self._scope = trio.CancelScope()

    async def wait_for(self, predicate: Any) -> None:
        while not predicate():
            event = self._changed
            await event.wait()

    def flush(self) -> None:
        if not self.vanished:
            for data, addr in self.quic.datagrams_to_send(trio.current_time()):
                with contextlib.suppress(BlockingIOError):
                    self.sock.sendto(data, addr)
        timer = self.quic.get_timer()
        self._scope.deadline = math.inf if timer is None else timer
        self._changed.set()
        self._changed = trio.Event()

    def _apply_events(self) -> None:
        while (event := self.quic.next_event()) is not None:
            self.events.append(event)
            if isinstance(event, StreamDataReceived):
                self.received.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.end_stream:
                    self.ended.add(event.stream_id)
            elif isinstance(event, StreamReset):
                self.resets[event.stream_id] = event.error_code
                self.ended.add(event.stream_id)
            elif isinstance(event, StopSendingReceived):
                self.stopped[event.stream_id] = event.error_code
            elif isinstance(event, HandshakeCompleted):
                self.handshake = event
            elif isinstance(event, ConnectionTerminated):
                self.terminated = event

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        self.quic.connect(self.address, now=trio.current_time())
        self.flush()
        task_status.started()
        try:
            while self.terminated is None:
                self._scope = trio.CancelScope()
                timer = self.quic.get_timer()
                self._scope.deadline = math.inf if timer is None else timer
                with self._scope:
                    data, addr = await self._trio_sock.recvfrom(65536)
                    if not self.deaf and not self.vanished:
                        self.quic.receive_datagram(data, addr, now=trio.current_time())
                        self._apply_events()
                        self.flush()
                    continue
                now = trio.current_time()
                timer = self.quic.get_timer()
                if timer is not None and now >= timer:
                    self.quic.handle_timer(now=now)
                    self._apply_events()
                    self.flush()
        finally:
            self._changed.set()
            self._trio_sock.close()

    def transport(self, stream_id: int = 0) -> ClientStreamTransport:
        return ClientStreamTransport(self, stream_id)


class ClientStreamTransport:
    """One stream of an ``AioquicClient`` as a PacketTransport for ``NnrpClient``."""

    kind = "quic"
    message_based = False
    peer = "server"
    send_now = None  # every write goes through the QUIC connection

    def __init__(self, client: AioquicClient, stream_id: int) -> None:
        self.client = client
        self.stream_id = stream_id
        self._read = 0

    async def receive(self) -> bytes | None:
        client = self.client
        await client.wait_for(lambda: len(client.received.get(self.stream_id, b"")) > self._read
                              or self.stream_id in client.ended
                              or client.terminated is not None)
        data = bytes(client.received.get(self.stream_id, b"")[self._read:])
        self._read += len(data)
        return data or None

    async def send(self, packets: list[bytes]) -> None:
        if self.client.terminated is not None:
            raise trio.BrokenResourceError("QUIC connection closed")
        self.client.quic.send_stream_data(self.stream_id, b"".join(packets))
        self.client.flush()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self.client.terminated is None:
            self.client.quic.close()
            self.client.flush()


@asynccontextmanager
async def aioquic_client(address: tuple[str, int], ca: Path, *, alpn: list[str] | None = None,
                         idle_timeout: float = 10.0) -> AsyncIterator[AioquicClient]:
    async with trio.open_nursery() as nursery:
        client = AioquicClient(address, alpn=alpn, ca=ca, idle_timeout=idle_timeout)
        await nursery.start(client.run)
        try:
            yield client
        finally:
            if client.terminated is None and not client.vanished:
                client.quic.close()
                client.flush()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def nnrp_over(client: AioquicClient) -> AsyncIterator[NnrpClient]:
    """An NNRP client on the aioquic client's first bidirectional stream, hello done."""
    transport = client.transport(client.quic.get_next_available_stream_id())
    nnrp = NnrpClient(transport)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(nnrp._reader)
        await nnrp.send(nnrp.sans_io.hello())
        with trio.fail_after(5):
            await nnrp._hello.wait()
        if nnrp.failure is not None:
            raise ClientError(f"handshake failed: {nnrp.failure}")
        try:
            yield nnrp
        finally:
            nursery.cancel_scope.cancel()
