"""The QUIC endpoint, sans-IO: aioquic's ``QuicConnection`` behind one datagram-in,
datagrams-out step (the trio side is ``_quic_listener``).

NNRP over QUIC (docs/reference/nnrp-wire.md section 1): TLS 1.3 is mandatory (QUIC has no other
TLS), the
client opens one bidirectional stream and writes packets back to back on it. nnrp-py's
native client (quinn 0.11 + rustls) uses the first client-initiated bidirectional stream
(id 0), offers no ALPN, opens no unidirectional streams and never sends DATAGRAM frames;
older SDKs offer ALPN ``nnrp/1``. To ``Connection`` the stream is a byte stream, as TCP is:
``QuicTransport`` has kind "quic" and message_based False.

Layers (this module is sans-IO and never imports trio):

* ``AlpnPolicy`` (in ``_quic_settings``, with ``QuicSettings``) and ``install_alpn_policy``:
  which ClientHellos are accepted.
* ``NnrpQuicConnection``: aioquic's server connection with what NNRP needs (stream limits,
  the ALPN hook, receive credit that follows the reader, the send-buffer level). Every use
  of aioquic internals is in this class, checked against aioquic 1.7.2.
* ``RoutingTable``: connection ID -> connection, for every ID a connection has issued and
  the peer has not retired, plus the client's original destination ID.
* ``QuicEndpoint``: one datagram in, datagrams out: header checks, version negotiation,
  admission (a connection cap, Retry under load), routing, per-connection events
  (``QuicPeer``). ``feed_datagram`` runs one step of it without sockets, for the fuzzer.
* ``QuicListener`` (``_quic_listener``, trio): one UDP socket, one task per QUIC
  connection (its aioquic timer, its keepalive and its NNRP ``Connection``), and
  ``QuicTransport``.

Bad input (nothing here touches another connection):

    | input                                                 | outcome                        |
    |-------------------------------------------------------|--------------------------------|
    | undecodable datagram; unknown connection ID           | dropped, counted (garbage)     |
    | Initial in a datagram under 1200 bytes                | dropped, counted (garbage)     |
    | unknown version (datagram >= 1200 bytes)              | Version Negotiation            |
    | Initial at max_connections, or while draining         | dropped, counted               |
    | Initial without token while >= retry_threshold        | stateless Retry                |
    |   handshakes are in progress, or more than that many  |                                |
    |   token-less Initials came in the last second         |                                |
    | Retry token forged, expired or for another address   | dropped, counted               |
    | ALPN outside the policy                               | TLS alert no_application_protocol |
    | TLS handshake not done within handshake_timeout       | CONNECTION_CLOSE, slot freed   |
    | a bidirectional stream other than 0                   | STOP_SENDING + RESET_STREAM    |
    | a unidirectional stream, a DATAGRAM frame             | aioquic closes (limits are 0)  |
    | peer silent for idle_timeout                          | QUIC ends; receive() -> None   |
    | peer stops reading                                    | send() waits (bounded buffer)  |
"""

from __future__ import annotations

import contextlib
import math
import os
import ssl
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from aioquic import tls
from aioquic._buffer import Buffer  # aioquic.buffer re-exports it implicitly only
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection, QuicConnectionState
from aioquic.quic.events import (
    ConnectionIdIssued,
    ConnectionIdRetired,
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)
from aioquic.quic.packet import (
    QuicFrameType,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)
from aioquic.quic.retry import QuicRetryTokenHandler

from ._endpoints import format_host
from ._quic_settings import NNRP_STREAM_ID

if TYPE_CHECKING:
    from aioquic.quic.packet_builder import QuicPacketBuilder
    from aioquic.quic.recovery import QuicPacketSpace
    from aioquic.quic.stream import QuicStream

    from ._quic_settings import AlpnPolicy, QuicSettings


#: Application error code of the STOP_SENDING / RESET_STREAM refusing an extra stream.
#: NNRP defines no QUIC error codes; the value is opaque to clients (their logs show it).
STREAM_REFUSED = 0x101
#: Client Initials must be padded to this (RFC 9000 section 14.1); smaller ones are dropped
#: before any state is made, so a flood of tiny packets costs one header parse each.
MIN_INITIAL = SMALLEST_MAX_DATAGRAM_SIZE
#: Original destination CIDs remembered as retried (a few hundred KiB at most).
RETRY_MEMORY_ENTRIES = 4096


def install_alpn_policy(context: tls.Context, policy: AlpnPolicy) -> None:
    """Choose the server's ALPN list per ClientHello, then let aioquic negotiate.

    Stock aioquic takes one fixed list for every client, so it cannot accept "no ALPN" and
    "nnrp/1" at once: with a list, a client that offers none is refused; without one, a
    client that offers nnrp/1 gets no ALPN back, which RFC 9001 section 8.1 clients treat
    as fatal. The hook peeks at the ClientHello's ALPN extension (parsed again by aioquic
    right after; a malformed hello fails there exactly as without the hook) and sets the
    list that aioquic then negotiates with. It wraps the one method that negotiates
    (aioquic 1.7.2: ``Context._server_handle_hello``) on this instance only.
    """
    handle_hello: Callable[..., None] = context._server_handle_hello

    def choose_then_handle(input_buf: Buffer, *output_bufs: Buffer) -> None:
        start = input_buf.tell()
        offered = tls.pull_client_hello(input_buf).alpn_protocols
        input_buf.seek(start)
        context._alpn_protocols = policy.server_protocols(offered)
        handle_hello(input_buf, *output_bufs)

    setattr(context, "_server_handle_hello", choose_then_handle)  # noqa: B010


def server_configuration(settings: QuicSettings) -> QuicConfiguration:
    """A server configuration with the certificate loaded (raises OSError/ValueError)."""
    if settings.tls.client_ca_file is not None:
        raise ValueError("quic:// does not do mutual TLS (drop --tls-client-ca or quic://)")
    configuration = QuicConfiguration(
        is_client=False, alpn_protocols=None, idle_timeout=settings.idle_timeout,
        max_stream_data=settings.receive_window, max_datagram_frame_size=None,
        verify_mode=ssl.CERT_NONE)
    configuration.load_cert_chain(settings.tls.cert_file, settings.tls.key_file)
    return configuration


class NnrpQuicConnection(QuicConnection):
    """aioquic's server connection with the changes NNRP needs (aioquic 1.7.2 internals).

    1. Stream limits: peers may open ``max_streams_bidi`` bidirectional streams and no
       unidirectional ones (the transport parameters are serialized later, on the first
       datagram, so setting the limits here is enough).
    2. ALPN: ``install_alpn_policy`` on the TLS context aioquic builds in ``_initialize``.
    3. Receive credit: aioquic doubles a stream's window as data *arrives*, whatever the
       application has read; here the NNRP stream's credit is what ``Connection`` has
       consumed plus ``receive_window``, so a client cannot make us buffer more than that
       while its connection is not reading (the TCP backpressure equivalent). Other
       streams never get more than the initial window.
    4. ``unacked_bytes``: how much of the send side is still buffered in aioquic.
    """

    def __init__(self, *, configuration: QuicConfiguration,
                 original_destination_connection_id: bytes,
                 retry_source_connection_id: bytes | None, alpn: AlpnPolicy,
                 max_streams_bidi: int, receive_window: int) -> None:
        super().__init__(configuration=configuration,
                         original_destination_connection_id=original_destination_connection_id,
                         retry_source_connection_id=retry_source_connection_id)
        self.alpn_policy = alpn
        self.receive_window = receive_window
        #: Bytes of the NNRP stream handed to the connection so far (receive credit).
        self.nnrp_consumed = 0
        for limit, value in ((self._local_max_streams_bidi, max_streams_bidi),
                             (self._local_max_streams_uni, 0)):
            limit.value = limit.sent = value

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        install_alpn_policy(self.tls, self.alpn_policy)

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace,
                             stream: QuicStream) -> None:
        # Replaces aioquic 1.7.2's version, whose only change of the limit is the doubling.
        if stream.stream_id == NNRP_STREAM_ID and stream.max_stream_data_local:
            target = self.nnrp_consumed + self.receive_window
            # Raise in steps of half a window: one MAX_STREAM_DATA per half window read.
            if target - stream.max_stream_data_local >= self.receive_window // 2:
                stream.max_stream_data_local = target
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA, capacity=_MAX_STREAM_DATA_CAPACITY,
                handler=self._on_max_stream_data_delivery, handler_args=(stream,))
            assert stream.stream_id is not None
            buf.push_uint_var(stream.stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    def unacked_bytes(self, stream_id: int) -> int:
        """Bytes written to ``stream_id`` that the peer has not acknowledged yet."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return stream.sender._buffer_stop - stream.sender._buffer_start

    def has_stream(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def started(self) -> bool:
        """A client Initial has been decrypted (before that, a connection is just a guess
        that a datagram was an Initial)."""
        return self._state is not QuicConnectionState.FIRSTFLIGHT


#: MAX_STREAM_DATA frame: type byte and two varints (aioquic's constant of the same value).
_MAX_STREAM_DATA_CAPACITY = 1 + 2 * 8


def check_aioquic() -> None:
    """Fail at bind time, not mid-connection, if aioquic's internals moved (see above)."""
    missing = [name for name in ("_initialize", "_write_stream_limits",
                                 "_on_max_stream_data_delivery")
               if not hasattr(QuicConnection, name)]
    if not hasattr(tls.Context, "_server_handle_hello"):
        missing.append("tls.Context._server_handle_hello")
    if missing:
        raise RuntimeError(f"aioquic changed (missing {missing}); QUIC needs aioquic 1.x "
                           "as checked in gateway/transport/_quic_endpoint.py")


class RoutingTable:
    """Connection ID -> connection (any hashable owner), and each owner's IDs.

    A connection is reachable by the client's original destination ID, its first host ID
    and every ID it issues later (``ConnectionIdIssued``), until the peer retires one
    (``ConnectionIdRetired``) or the connection ends (``remove``: all of its IDs).
    """

    def __init__(self) -> None:
        self._routes: dict[bytes, object] = {}
        self._owned: dict[object, set[bytes]] = {}

    def __len__(self) -> int:
        return len(self._owned)

    def get(self, cid: bytes) -> object | None:
        return self._routes.get(cid)

    def add(self, cid: bytes, owner: object) -> bool:
        """Route ``cid`` to ``owner``; False (and no change) if another owner has it."""
        current = self._routes.get(cid)
        if current is not None and current is not owner:
            return False
        self._routes[cid] = owner
        self._owned.setdefault(owner, set()).add(cid)
        return True

    def retire(self, cid: bytes, owner: object) -> None:
        """Forget ``cid`` if ``owner`` has it (a retired ID never routes again)."""
        if self._routes.get(cid) is owner:
            del self._routes[cid]
            self._owned[owner].discard(cid)

    def remove(self, owner: object) -> None:
        for cid in self._owned.pop(owner, ()):
            if self._routes.get(cid) is owner:
                del self._routes[cid]

    def cids(self, owner: object) -> frozenset[bytes]:
        return frozenset(self._owned.get(owner, ()))

    def owners(self) -> list[object]:
        return list(self._owned)


@attrs.define
class QuicStats:
    """Listener counters (bounded-cost, read by tests and logs)."""

    datagrams_in: int = 0
    datagrams_out: int = 0
    garbage: int = 0
    version_negotiations: int = 0
    retries: int = 0
    invalid_tokens: int = 0
    refused_initials: int = 0
    handshake_timeouts: int = 0
    refused_streams: int = 0
    send_errors: int = 0
    connections_total: int = 0


class QuicPeer:
    """One QUIC connection beside aioquic's state: the NNRP stream's unread bytes and the
    flags the trio side waits on. Sans-IO; ``QuicEndpoint`` updates it from aioquic's
    events."""

    def __init__(self, quic: NnrpQuicConnection, addr: NetworkAddress) -> None:
        self.quic = quic
        self.address = format_address(addr)
        self.inbound: deque[bytes] = deque()
        #: No more bytes will come on the NNRP stream (FIN or RESET_STREAM).
        self.receive_ended = False
        #: We may not write to it any more (STOP_SENDING, connection over).
        self.send_ended = False
        self.handshake_complete = False
        self.alpn: str | None = None
        self.terminated = False
        self.close_reason = ""
        self.refused: set[int] = set()

    def take_inbound(self) -> bytes:
        """All unread NNRP bytes; the credit they free is granted on the next flush."""
        data = self.inbound[0] if len(self.inbound) == 1 else b"".join(self.inbound)
        self.inbound.clear()
        self.quic.nnrp_consumed += len(data)
        return data


def format_address(addr: NetworkAddress) -> str:
    try:
        host, port = addr[0], addr[1]
    except (TypeError, IndexError):
        return "unknown"
    return f"{format_host(str(host))}:{port}"


@attrs.frozen
class Received:
    """What one datagram did: replies sent without a connection, and the connection it
    reached (None: dropped, or answered statelessly)."""

    replies: list[bytes]
    peer: QuicPeer | None = None
    new: bool = False


class QuicEndpoint:
    """The server side of one UDP socket, sans-IO: datagrams in, datagrams out."""

    def __init__(self, settings: QuicSettings, configuration: QuicConfiguration) -> None:
        self.settings = settings
        #: Swapped on reload: new connections take the current one, old ones keep theirs.
        self.configuration = configuration
        self.routes = RoutingTable()
        self.stats = QuicStats()
        self.accepting = True
        self.handshakes_in_progress = 0
        self._retry = QuicRetryTokenHandler()
        self._window_start = -math.inf  # token-less Initials counted per second
        self._window_initials = 0
        #: Original destination CIDs answered with a Retry, and when (oldest first).
        self._retried: dict[bytes, float] = {}
        self._cid_length = configuration.connection_id_length

    @property
    def peers(self) -> list[QuicPeer]:
        return [p for p in self.routes.owners() if isinstance(p, QuicPeer)]

    def receive_datagram(self, data: bytes, addr: NetworkAddress, now: float) -> Received:
        """Route one datagram, making a connection for an acceptable Initial."""
        self.stats.datagrams_in += 1
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=self._cid_length)
        except ValueError:
            self.stats.garbage += 1
            return Received([])
        owner = self.routes.get(header.destination_cid)
        if isinstance(owner, QuicPeer):
            owner.quic.receive_datagram(data, addr, now)
            self.process(owner)
            return Received([], owner)
        if header.packet_type is QuicPacketType.VERSION_NEGOTIATION:
            self.stats.garbage += 1  # servers never take part in version negotiation
            return Received([])
        if (header.version is not None
                and header.version not in self.configuration.supported_versions):
            if len(data) < MIN_INITIAL:  # never answer what could be a reflection probe
                self.stats.garbage += 1
                return Received([])
            self.stats.version_negotiations += 1
            return Received([encode_quic_version_negotiation(
                source_cid=header.destination_cid, destination_cid=header.source_cid,
                supported_versions=self.configuration.supported_versions)])
        if header.packet_type is not QuicPacketType.INITIAL or len(data) < MIN_INITIAL:
            self.stats.garbage += 1  # stale connection, or not a client's first flight
            return Received([])
        return self._accept(header.version, header.destination_cid, header.source_cid,
                            header.token, data, addr, now)

    def _accept(self, version: int | None, dcid: bytes, scid: bytes, token: bytes,
                data: bytes, addr: NetworkAddress, now: float) -> Received:
        if not self.accepting or len(self.routes) >= self.settings.max_connections:
            self.stats.refused_initials += 1
            return Received([])
        retry_source: bytes | None = None
        original = dcid
        if token:
            try:
                original = self._retry.validate_token(address=addr, destination_cid=dcid,
                                                      token=token, now=now)
            except (ValueError, IndexError):
                self.stats.invalid_tokens += 1
                return Received([])
            retry_source = dcid
        elif self._was_retried(dcid, now) or self._under_load(now):
            # Address validation (RFC 9000 section 8.1.2): no state until the client shows
            # it receives at this address. The Retry is smaller than the Initial, and
            # costs ~50 us against ~1-3 ms for an Initial that makes a connection.
            # Once retried, always retried: a retransmission of that Initial, arriving
            # after the load has passed, would make a connection its client has already
            # left for the Retry's (it ignores a second Retry), holding a slot and sending
            # its flight until the handshake timeout.
            assert version is not None
            source = os.urandom(self._cid_length)
            self.stats.retries += 1
            self._remember_retry(dcid, now)
            return Received([encode_quic_retry(
                version=version, source_cid=source, destination_cid=scid,
                original_destination_cid=dcid,
                retry_token=self._retry.create_token(
                    address=addr, original_destination_connection_id=dcid,
                    retry_source_connection_id=source, now=now))])
        settings = self.settings
        quic = NnrpQuicConnection(
            configuration=self.configuration, original_destination_connection_id=original,
            retry_source_connection_id=retry_source, alpn=settings.alpn,
            max_streams_bidi=settings.max_streams_bidi,
            receive_window=settings.receive_window)
        peer = QuicPeer(quic, addr)
        self.routes.add(dcid, peer)
        self.routes.add(quic.host_cid, peer)
        self.handshakes_in_progress += 1
        quic.receive_datagram(data, addr, now)
        self.process(peer)
        if not quic.started():  # its Initial did not decrypt: keep nothing for it
            self.stats.garbage += 1
            self.forget(peer)
            return Received([])
        self.stats.connections_total += 1
        return Received([], peer, new=True)

    def _was_retried(self, dcid: bytes, now: float) -> bool:
        self._forget_retries(now)
        return dcid in self._retried

    def _remember_retry(self, dcid: bytes, now: float) -> None:
        """Bounded: a spoofed flood can push entries out, which only brings back the
        cost this memory saves (a connection that waits for its handshake timeout)."""
        self._retried.pop(dcid, None)
        self._retried[dcid] = now
        while len(self._retried) > RETRY_MEMORY_ENTRIES:
            del self._retried[next(iter(self._retried))]

    def _forget_retries(self, now: float) -> None:
        """A client retransmits its first Initial until the handshake timeout at most."""
        horizon = now - self.settings.handshake_timeout
        while self._retried and next(iter(self._retried.values())) < horizon:
            del self._retried[next(iter(self._retried))]

    def _under_load(self, now: float) -> bool:
        """Retry from ``retry_threshold`` handshakes in progress, or that many token-less
        Initials within a second (a spoofed flood of Initials that never decrypt makes no
        handshake, but each still costs a key derivation)."""
        threshold = self.settings.retry_threshold
        if threshold is None:
            return False
        if now - self._window_start >= 1.0:
            self._window_start, self._window_initials = now, 0
        self._window_initials += 1
        return (self.handshakes_in_progress >= threshold
                or self._window_initials > threshold)

    def process(self, peer: QuicPeer) -> None:
        """Apply aioquic's pending events: routes, the NNRP stream, refused streams."""
        quic = peer.quic
        while (event := quic.next_event()) is not None:
            if isinstance(event, StreamDataReceived):
                if event.stream_id != NNRP_STREAM_ID:
                    self._refuse_stream(peer, event.stream_id)
                elif not peer.receive_ended:
                    if event.data:
                        peer.inbound.append(event.data)
                    peer.receive_ended = event.end_stream
            elif isinstance(event, StreamReset | StopSendingReceived):
                if event.stream_id == NNRP_STREAM_ID:
                    peer.receive_ended = True
                    peer.send_ended = True
            elif isinstance(event, ConnectionIdIssued):
                self.routes.add(event.connection_id, peer)
            elif isinstance(event, ConnectionIdRetired):
                self.routes.retire(event.connection_id, peer)
            elif isinstance(event, HandshakeCompleted):
                peer.handshake_complete = True
                peer.alpn = event.alpn_protocol
                self.handshakes_in_progress -= 1
            elif isinstance(event, ConnectionTerminated):
                peer.close_reason = event.reason_phrase or f"error {event.error_code:#x}"
                self.forget(peer)

    def forget(self, peer: QuicPeer) -> None:
        """The connection is over: free its routes and its slot (idempotent)."""
        if peer.terminated:
            return
        peer.terminated = peer.receive_ended = peer.send_ended = True
        if not peer.handshake_complete:
            self.handshakes_in_progress -= 1
        self.routes.remove(peer)

    def _refuse_stream(self, peer: QuicPeer, stream_id: int) -> None:
        """Streams other than the NNRP one: ask the peer to stop, and reset our side."""
        if stream_id in peer.refused:
            return
        if len(peer.refused) > 4 * self.settings.max_streams_bidi:  # keep the set small
            peer.refused = {s for s in peer.refused if peer.quic.has_stream(s)}
        peer.refused.add(stream_id)
        self.stats.refused_streams += 1
        quic = peer.quic
        for action in (quic.stop_stream, quic.reset_stream):
            # ValueError: already finished, or not ours to reset (a uni stream).
            with contextlib.suppress(ValueError):
                action(stream_id, STREAM_REFUSED)

    def datagrams_to_send(self, peer: QuicPeer, now: float
                          ) -> list[tuple[bytes, NetworkAddress]]:
        if peer.quic.get_peer_address() is None:
            return []
        datagrams = peer.quic.datagrams_to_send(now)
        self.stats.datagrams_out += len(datagrams)
        return datagrams


def feed_datagram(endpoint: QuicEndpoint, data: bytes, now: float,
                  addr: NetworkAddress = ("192.0.2.1", 4433)) -> list[bytes]:
    """One full step without sockets: route ``data``, run the reached connection's timer
    if due, and return every datagram the server would send (the fuzzing entry point)."""
    received = endpoint.receive_datagram(data, addr, now)
    out = list(received.replies)
    peer = received.peer
    if peer is not None:
        out.extend(d for d, _ in endpoint.datagrams_to_send(peer, now))
        timer = peer.quic.get_timer()
        if timer is not None and timer <= now:
            peer.quic.handle_timer(now)
            endpoint.process(peer)
            out.extend(d for d, _ in endpoint.datagrams_to_send(peer, now))
    return out


