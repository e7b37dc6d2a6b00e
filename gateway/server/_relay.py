"""A connection another process of the gateway serves: its bytes relayed both ways, so
a session resumes where it is held whichever worker the kernel, or whichever pod the
load balancer, gave the new connection to.

Rules (gateway/nnrp/_server_lifecycle.py rule 4d; gateway/nnrp/_resumption.py R11;
gateway/nnrp/_fleet.py; docs/resume.md, and its "A fleet of gateways"):

1. A connection is relayed only when its first session message is a resume or a
   migration naming another process's session: another worker's (``--workers``: the
   token's first byte), over its unix socket, or another pod's (``--fleet-advertise``:
   the token's route), over TCP to the address the route names. Nothing of the
   connection has state here but the handshake. A connection a worker relayed here is
   never relayed again, and one another pod forwarded here goes to a worker of this pod
   at most (``_fleet`` F5: no loop). Nor is one that sent more than
   ``MAX_HAND_OFF_BYTES`` before that message: no more is kept.
2. To the holder: a header, then the client's bytes from its CLIENT_HELLO on (probes
   before it were answered here already). The header's ``FIELDS`` are what the client's
   carrier said of it (its kind, its address, encrypted or not, its TLS certificate's
   digest), so the session's binding is checked there as here; between workers they
   follow ``WORKER_MAGIC`` (a unix socket only this pod's workers can reach), between
   pods they and the client's bytes are sealed with the fleet's key, and the owner
   proves it holds that key before anything more is relayed either way
   (``FleetIdentity.seal_forward``: F4). The
   holder's connection is an ordinary one, marked relayed or forwarded, and answers the
   hello; its SERVER_HELLO_ACK is dropped (the client has ours).
3. Everything else goes through as it comes: on a message carrier (WebSocket, QUIC) one
   packet per message each way. Either side's end is the other's, and so is a client
   breaking its carrier's rules (a WebSocket text message). The relay costs one more
   hop per packet, for that connection only; nothing at all for any other.
4. A holder that cannot be reached gives the client the refusal the protocol layer
   prepared (``HandedOff.refusal``): resume rejected for a worker that is gone (its
   sessions went with it), retry later for a pod out of reach. One that was reached but
   ends the connection, sends anything else, or stays silent for ``GREETING_TIMEOUT``
   before its hello ack (at its connection limit, shutting down, refusing the forward,
   or no gateway at all) gives ``HandedOff.busy``: retry later. A migration is refused
   either way. The connection to another pod has TCP keepalive, as the client's has:
   an owner whose node vanished ends the relay, and the client resumes again.
"""

from __future__ import annotations

import enum
import hmac
import struct
from collections.abc import Callable

import trio

from gateway.nnrp import (
    FleetIdentity,
    MsgType,
    PeerCredentials,
    forward_head_size,
    forward_rest_size,
    message_type,
    split_packets,
)
from gateway.transport import (
    PacketTransport,
    StreamTransport,
    TextMessageError,
    peer_address,
)

#: Carrier kind, client address, encrypted, certificate digest (rule 2): fixed size, so
#: the holder reads exactly its header.
FIELDS = struct.Struct("!16s64s?32s")
WORKER_MAGIC = b"NNRPRLY3"
#: How long a holder has to send its header once connected.
HEADER_TIMEOUT = 5.0
#: How long the process a connection is relayed to has to answer its hello.
GREETING_TIMEOUT = 10.0
#: What may come before that answer (it is one small packet).
MAX_GREETING_BYTES = 64 << 10


def without_probes(preamble: bytes) -> bytes:
    """Rule 2: the client's bytes from its CLIENT_HELLO on."""
    buffer = bytearray(preamble)
    kept = bytearray()
    packets = split_packets(buffer)
    seen_hello = False
    for packet in packets:
        seen_hello = seen_hello or message_type(packet) == MsgType.CLIENT_HELLO
        if seen_hello:
            kept += packet
    return bytes(kept + buffer)


def fields(transport: PacketTransport, credentials: PeerCredentials) -> bytes:
    """Rule 2: what the client's carrier said of it."""
    return FIELDS.pack(transport.kind.encode()[:16],
                       transport.peer.encode("ascii", "replace")[:64],
                       credentials.secure, credentials.certificate[:32])


class RelayEnd(enum.Enum):
    """How a relay ended, for the answer the client gets and the forwards' metric."""

    #: The holder answered the hello; the relay then ran until either side ended.
    GREETED = "greeted"
    #: The holder's end broke before the client's bytes could be sent (it was not there).
    UNSENT = "unsent"
    #: The holder ended it, sent something else, or stayed silent for
    #: ``GREETING_TIMEOUT`` before answering (busy, stopping, or not a gateway).
    HOLDER_ENDED = "holder_ended"
    #: The client left before the holder answered.
    CLIENT_ENDED = "client_ended"


async def relay(transport: PacketTransport, holder: trio.SocketStream, opening: bytes,
                proof: bytes = b"", on_greeted: Callable[[], None] = lambda: None
                ) -> RelayEnd:
    """Relay the client's connection to the process at the other end of ``holder``,
    after ``opening`` (the header and the client's bytes so far), until either side ends
    (rules 2, 3); with a ``proof``, the holder must answer with it first (a pod of the
    fleet: ``_fleet`` F4). ``on_greeted`` is called when the holder's hello ack comes;
    how it ended (rule 4: the caller answers the client when it was not greeted)."""
    greeted = trio.Event()
    client_left = False
    async with holder:
        try:
            await holder.send_all(opening)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return RelayEnd.UNSENT
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_to_client, holder, transport, proof, greeted, on_greeted,
                               nursery.cancel_scope)
            client_left_early = trio.Event()
            nursery.start_soon(_to_holder, transport, holder, greeted, client_left_early,
                               nursery.cancel_scope)
            with trio.move_on_after(GREETING_TIMEOUT):
                await greeted.wait()
            if not greeted.is_set():  # a holder that accepts and stays silent
                nursery.cancel_scope.cancel()
        client_left = client_left_early.is_set()
    if greeted.is_set():
        return RelayEnd.GREETED
    return RelayEnd.CLIENT_ENDED if client_left else RelayEnd.HOLDER_ENDED


async def _to_holder(transport: PacketTransport, holder: trio.SocketStream,
                     greeted: trio.Event, client_left_early: trio.Event,
                     done: trio.CancelScope) -> None:
    try:
        # Nothing more of the client goes before the holder has answered (and, a pod,
        # proven it holds the fleet's key: ``_fleet`` F4); the client, waiting for its
        # answers, rarely sends more meanwhile.
        while not greeted.is_set():
            data = await transport.receive()
            if data is None:
                client_left_early.set()
                done.cancel()
                return
            await greeted.wait()
            await holder.send_all(data)
        while (data := await transport.receive()) is not None:
            await holder.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, TextMessageError):
        pass  # either end gone, or a client breaking the carrier's rules: the relay ends
    done.cancel()


async def _to_client(holder: trio.SocketStream, transport: PacketTransport, proof: bytes,
                     greeted: trio.Event, on_greeted: Callable[[], None],
                     done: trio.CancelScope) -> None:
    """``greeted``: the holder's SERVER_HELLO_ACK has come (and was dropped), after its
    ``proof`` (if one is due)."""
    buffer = bytearray()
    proven = not proof
    try:
        while data := await holder.receive_some(65536):
            buffer += data
            if not proven:
                if len(buffer) < len(proof):
                    continue
                if not hmac.compare_digest(bytes(buffer[:len(proof)]), proof):
                    return  # not the fleet's: nothing of it reaches the client
                del buffer[:len(proof)]
                proven = True
            if not greeted.is_set():
                packets = split_packets(buffer)
                if not packets:
                    if len(buffer) > MAX_GREETING_BYTES:
                        return  # no hello ack is that long: not a gateway answering
                    continue
                if message_type(packets[0]) != MsgType.SERVER_HELLO_ACK:
                    return  # not a gateway answering: nothing of it reaches the client
                greeted.set()
                on_greeted()
                out = packets[1:]
            else:
                out = split_packets(buffer) if transport.message_based else []
            if not transport.message_based and buffer:  # a byte stream: as it comes
                out.append(bytes(buffer))
                buffer.clear()
            if out:
                await transport.send(out)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        done.cancel()


class RelayedTransport(StreamTransport):
    """A connection another worker or pod relays here (rule 2): the client's carrier
    kind, address and credentials, as that process saw them."""

    def __init__(self, stream: trio.SocketStream, kind: str, peer: str,
                 credentials: PeerCredentials) -> None:
        super().__init__(stream, kind, peer)
        self._credentials = credentials
        #: The client's bytes that came sealed in a forward's opening: read first.
        self.first = b""

    def credentials(self) -> PeerCredentials:
        return self._credentials

    async def receive(self, awaited: int = 0) -> bytes | None:
        if self.first:
            first, self.first = self.first, b""
            return first
        return await super().receive()


async def relayed(stream: trio.SocketStream) -> RelayedTransport | None:
    """The holder's side of a worker's relay: read its header (rule 2) and make the
    connection a transport that reports the client's carrier, address and credentials;
    None if it is none."""
    header = await _read_exactly(stream, len(WORKER_MAGIC) + FIELDS.size)
    if header is None or not header.startswith(WORKER_MAGIC):
        return None
    return _transport(stream, header[len(WORKER_MAGIC):])


async def forwarded(stream: trio.SocketStream, fleet: FleetIdentity
                    ) -> RelayedTransport | None:
    """The owner's side of a forward from another pod: its opening sealed with the
    fleet's key (rule 2, ``_fleet`` F4) answered with the proof, and the connection made
    a transport whose first bytes are the client's; None for anything else."""
    head = await _read_exactly(stream, forward_head_size(FIELDS.size))
    rest = forward_rest_size(head) if head is not None else None
    if head is None or rest is None:
        return None
    tail = await _read_exactly(stream, rest)
    opened = fleet.open_forward(head + tail, FIELDS.size) if tail is not None else None
    if opened is None:
        return None
    try:
        await stream.send_all(opened.proof)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return None
    transport = _transport(stream, opened.fields)
    transport.first = opened.client_bytes
    return transport


async def _read_exactly(stream: trio.SocketStream, size: int) -> bytes | None:
    """``size`` bytes within ``HEADER_TIMEOUT``; None if they do not come."""
    header = bytearray()
    with trio.move_on_after(HEADER_TIMEOUT):
        while len(header) < size:
            data = await stream.receive_some(size - len(header))
            if not data:
                return None
            header += data
    return bytes(header) if len(header) == size else None


def _transport(stream: trio.SocketStream, packed: bytes) -> RelayedTransport:
    kind, peer, secure, certificate = FIELDS.unpack(packed)
    address = peer.rstrip(b"\0").decode("ascii", "replace")
    # A digest is 32 bytes; all zero stands for none.
    credentials = PeerCredentials(peer_address(address), bool(secure),
                                  certificate if any(certificate) else b"")
    return RelayedTransport(stream, kind.rstrip(b"\0").decode(), address, credentials)
