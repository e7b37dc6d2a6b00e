"""A connection another process of the gateway serves (``--workers``): its bytes relayed
both ways, so a session resumes on the worker that holds it whichever worker the kernel
gave the new connection to.

Rules (gateway/nnrp/_server.py rule 4d; gateway/nnrp/_resumption.py R11; README,
"Resumable sessions"):

1. A worker relays a connection only when its first session message is a resume or a
   migration naming another worker's session (the token's first byte is the worker
   that issued it): nothing of the connection has state here but the handshake. A
   connection that was itself relayed here is never relayed again: the holder answers
   a token naming another worker as one that opens nothing (no relay loop). Nor is one
   that sent more than ``MAX_HAND_OFF_BYTES`` before that message: no more is kept.
2. To the holder: a fixed ``HEADER`` (the carrier's kind, the client's address, and what
   its carrier said of it: encrypted or not, its TLS certificate's digest, so the
   session's binding is checked there as here), then the client's bytes from its
   CLIENT_HELLO on (probes before it were answered here already). The holder's
   connection is an ordinary one, marked relayed, and answers the hello; its
   SERVER_HELLO_ACK is dropped (the client has ours).
3. Everything else goes through as it comes: on a message carrier (WebSocket) one packet
   per message each way. Either side's end is the other's, and so is a client breaking
   its carrier's rules (a WebSocket text message). The relay costs one more hop on
   loopback per packet, for that connection only.
4. A holder that cannot be reached has restarted, and its sessions went with it: the
   client gets the refusal the protocol layer prepared (``HandedOff.refusal``: resume
   rejected, migration refused), as for a token that opens nothing.
"""

from __future__ import annotations

import struct

import trio

from gateway.nnrp import MsgType, PeerCredentials, message_type, split_packets
from gateway.transport import (
    PacketTransport,
    StreamTransport,
    TextMessageError,
    peer_address,
)

#: magic, carrier kind, client address, encrypted, certificate digest: fixed size, so
#: the holder reads exactly it.
HEADER = struct.Struct("!8s16s64s?32s")
MAGIC = b"NNRPRLY2"


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


async def relay(transport: PacketTransport, credentials: PeerCredentials,
                holder: trio.SocketStream, preamble: bytes) -> None:
    """Relay the client's connection (its carrier said ``credentials`` of it) to the
    worker at the other end of ``holder`` until either side ends (rules 2, 3)."""
    async with holder:
        header = HEADER.pack(MAGIC, transport.kind.encode()[:16],
                             transport.peer.encode("ascii", "replace")[:64],
                             credentials.secure, credentials.certificate[:32])
        await holder.send_all(header + without_probes(preamble))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_to_holder, transport, holder, nursery.cancel_scope)
            nursery.start_soon(_to_client, holder, transport, nursery.cancel_scope)


async def _to_holder(transport: PacketTransport, holder: trio.SocketStream,
                     done: trio.CancelScope) -> None:
    try:
        while (data := await transport.receive()) is not None:
            await holder.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, TextMessageError):
        pass  # either end gone, or a client breaking the carrier's rules: the relay ends
    done.cancel()


async def _to_client(holder: trio.SocketStream, transport: PacketTransport,
                     done: trio.CancelScope) -> None:
    buffer = bytearray()
    greeted = False  # the holder's SERVER_HELLO_ACK has come, and was dropped
    try:
        while data := await holder.receive_some(65536):
            buffer += data
            if not greeted:
                packets = split_packets(buffer)
                if not packets:
                    continue
                if message_type(packets[0]) != MsgType.SERVER_HELLO_ACK:
                    return  # not a gateway answering: nothing of it reaches the client
                greeted = True
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
    """A connection another worker relays here (rule 2): the client's carrier kind,
    address and credentials, as that worker saw them."""

    def __init__(self, stream: trio.SocketStream, kind: str, peer: str,
                 credentials: PeerCredentials) -> None:
        super().__init__(stream, kind, peer)
        self._credentials = credentials

    def credentials(self) -> PeerCredentials:
        return self._credentials


async def relayed(stream: trio.SocketStream) -> RelayedTransport | None:
    """The holder's side: read the header of a relayed connection (rule 2) and make it
    a transport that reports the client's carrier, address and credentials; None if it
    is none."""
    header = bytearray()
    with trio.move_on_after(5):
        while len(header) < HEADER.size:
            data = await stream.receive_some(HEADER.size - len(header))
            if not data:
                return None
            header += data
    if len(header) < HEADER.size:
        return None
    magic, kind, peer, secure, certificate = HEADER.unpack(bytes(header))
    if magic != MAGIC:
        return None
    address = peer.rstrip(b"\0").decode("ascii", "replace")
    # A digest is 32 bytes; all zero stands for none.
    credentials = PeerCredentials(peer_address(address), bool(secure),
                                  certificate if any(certificate) else b"")
    return RelayedTransport(stream, kind.rstrip(b"\0").decode(), address, credentials)
