"""Packets: the 40-byte common header, encoding, and the incremental decoder.

    packet = header (40 B) ‖ metadata (meta_len) ‖ body (body_len)

No other framing exists on any transport (docs/reference/nnrp-wire.md section 0); over WebSocket a
binary message holds exactly one packet.

The decoder is sans-IO: ``Decoder.feed(bytes)`` returns every complete packet and
buffers the rest. It validates in the order that bounds memory first: the header
(magic, version, header_len, flag mask, known type, exact meta_len) and the size cap
are checked as soon as 40 bytes are in, *before* any body byte is buffered. Every
error it raises is fatal to the connection; typed bodies are parsed separately (see
``_body``) because their errors are operation-level.

One packet over the configured cap is not a framing error: a FRAME_SUBMIT within the
protocol's own 64 MiB (section 1: only a bigger packet is fatal). The stream stays in
step (its length is known), and the connection may carry other streams, so the decoder
keeps its header and metadata, reads its body and discards it as it arrives (never
buffered: the cap still bounds memory), and returns it as a packet whose ``discarded``
says how many body bytes were dropped. The server refuses that one submit
(``_server_session``); every other stream on the connection goes on.

A big body is never copied once it is in (a 63 MiB submit copied whole on the event
loop held every other stream for a tenth of a second: docs/benchmarks.md, "Media"): a
body of at least ``VIEW_MIN_BODY`` bytes is handed on as a read-only ``memoryview`` of
the memory it arrived in. A packet that big not complete in the bytes at hand gets its
own memory, exactly its size, as an anonymous ``mmap``: each read is copied into it
once, and nothing else is ever copied or reallocated (a growing ``bytearray`` copied
what it held at some reallocations and held up to twice the packet at its peak). The
kernel gives a page only when a byte is written to it, so a header announcing 64 MiB
costs no memory until the bytes come. A packet complete in the decoder's buffer is a
view of that buffer (which the decoder then lets go, starting a new one for what
follows), one complete in an immutable ``bytes`` the caller passed (a WebSocket
message) a view of that. A smaller body is copied into ``bytes`` (cheaper for what
reads it than a view).

With a media directory, a big FRAME_SUBMIT's own memory is a file's instead
(``Decoder``'s ``spill``; ``_spill`` S1-S2): the same views, and each page the decoder
fills leaves the process as soon as it is full, so a 64 MiB image costs the gateway's
resident memory a read, not the image.
"""

from __future__ import annotations

import mmap
import struct
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from ._body import DESCRIPTOR, DESCRIPTOR_LEN, PRELUDE, PRELUDE_LEN
from ._constants import (
    DEFAULT_MAX_PACKET,
    HEADER_FLAG_MASK,
    HEADER_LEN,
    MAGIC,
    PROTOCOL_MAX_PACKET,
    VERSION_MAJOR,
    WIRE_FORMAT,
    ErrorCode,
    MsgType,
    PayloadKind,
    StreamSemantics,
)
from ._errors import LocalProtocolError, RemoteProtocolError
from ._messages import MESSAGE_CLASSES, FrameSubmit, Message, PartialResult
from ._spill import SpillMap

if TYPE_CHECKING:
    from ._spill import SpillMemory

HEADER = struct.Struct("<4sBBBBIIIIIHHQ")
assert HEADER.size == HEADER_LEN
#: Bodies at least this long are handed on as views, not copies (module docstring).
VIEW_MIN_BODY = 64 << 10

#: A packet's body: ``bytes``, or a read-only view of the bytes a big one arrived in.
Body = bytes | memoryview


@attrs.frozen
class Header:
    """The common header exactly as on the wire (meta_len and body_len included)."""

    msg_type: int
    flags: int = 0
    meta_len: int = 0
    body_len: int = 0
    session_id: int = 0
    frame_id: int = 0
    view_id: int = 0
    route_id: int = 0
    trace_id: int = 0
    version_major: int = VERSION_MAJOR
    wire_format: int = WIRE_FORMAT

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.version_major, self.wire_format, self.msg_type, HEADER_LEN,
                           self.flags, self.meta_len, self.body_len, self.session_id,
                           self.frame_id, self.view_id, self.route_id, self.trace_id)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, offset: int = 0) -> Header:
        """Parse a header on its own (golden vectors, tools). Checks magic and header_len;
        the decoder applies the full rules (version, flags, type, meta_len, size cap)."""
        (magic, version, wire_format, msg_type, header_len, flags, meta_len, body_len,
         session_id, frame_id, view_id, route_id, trace_id) = HEADER.unpack_from(data, offset)
        if magic != MAGIC:
            raise RemoteProtocolError(f"bad magic {bytes(magic)!r}",
                                      code=ErrorCode.MALFORMED_HEADER)
        if header_len != HEADER_LEN:
            raise RemoteProtocolError(f"header_len {header_len} is not {HEADER_LEN}",
                                      code=ErrorCode.MALFORMED_HEADER)
        return cls(msg_type, flags, meta_len, body_len, session_id, frame_id, view_id, route_id,
                   trace_id, version, wire_format)


#: meta_len and body_len in the header (offset 12): a packet's size without decoding it.
_LENGTHS = struct.Struct("<II")
#: Where msg_type sits in the header.
_MSG_TYPE_OFFSET = 6


def split_packets(buffer: bytearray) -> list[bytes]:
    """The whole packets at the start of ``buffer`` (removed from it); a partial one
    stays. Framing only, for a relay that passes packets on without reading them (the
    process that receives them checks every one); a header announcing more than
    ``PROTOCOL_MAX_PACKET`` is never whole and stays."""
    packets = []
    while len(buffer) >= HEADER_LEN:
        meta_len, body_len = _LENGTHS.unpack_from(buffer, 12)
        size = HEADER_LEN + meta_len + body_len
        if size > PROTOCOL_MAX_PACKET or len(buffer) < size:
            break
        packets.append(bytes(buffer[:size]))
        del buffer[:size]
    return packets


def message_type(packet: bytes | bytearray | memoryview) -> int:
    """The msg_type of an encoded packet (at least its header), without decoding it."""
    return packet[_MSG_TYPE_OFFSET]


class Packet(NamedTuple):
    """One NNRP packet: a typed message plus the header fields the sender chooses.

    A NamedTuple rather than a frozen attrs class on purpose: the decoder builds one
    per packet on the hot path, and a tuple costs a tenth of a frozen slotted class
    (0.1 vs 1.5 us here). It is just as immutable.
    """

    message: Message
    session_id: int = 0
    frame_id: int = 0
    #: ``bytes``, or for a body of ``VIEW_MIN_BODY`` bytes or more possibly a read-only
    #: view of the bytes it arrived in (the module docstring): ``bytes(body)`` when a
    #: method of ``bytes`` is needed (free for ``bytes``).
    body: Body = b""
    flags: int = 0
    view_id: int = 0
    route_id: int = 0
    trace_id: int = 0
    #: A FRAME_SUBMIT over the decoder's cap: its body's size, read and dropped (the
    #: module docstring); 0 for every packet that came whole.
    discarded: int = 0

    @property
    def msg_type(self) -> MsgType:
        return self.message.MSG_TYPE


def encode(packet: Packet) -> bytes:
    """Serialise a packet. Refuses a body that contradicts its metadata's length field."""
    message = packet.message
    layout = message.LAYOUT
    body = packet.body
    expected = message.expected_body_len()
    if expected is not None and expected != len(body):
        raise LocalProtocolError(
            f"{message.MSG_TYPE.name}: metadata announces a {expected}-byte body, got {len(body)}")
    meta = layout.pack_struct.pack(*layout.get_values(message))
    header = HEADER.pack(MAGIC, VERSION_MAJOR, WIRE_FORMAT, message.MSG_TYPE, HEADER_LEN,
                         packet.flags, layout.size, len(body), packet.session_id,
                         packet.frame_id, packet.view_id, packet.route_id, packet.trace_id)
    return header + meta + body


_PARTIAL_RESULT = struct.Struct(HEADER.format + PartialResult.LAYOUT.pack_struct.format[1:])
_PARTIAL_META_LEN = PartialResult.LAYOUT.size


def encode_partial_result(session_id: int, frame_id: int, operation_id: int, sequence: int,
                          body: bytes) -> bytes:
    """Fast path for the hottest frame: one PARTIAL_RESULT of the openai mapping.

    result_sequence = delta_sequence = ``sequence``, object_id 0, flags 0
    (docs/reference/nnrp-wire.md section 4, "Non-terminal events"). Byte-identical to ``encode``.
    """
    return _PARTIAL_RESULT.pack(
        MAGIC, VERSION_MAJOR, WIRE_FORMAT, MsgType.PARTIAL_RESULT, HEADER_LEN, 0,
        _PARTIAL_META_LEN, len(body), session_id, frame_id, 0, 0, 0,
        operation_id, sequence, 0, sequence, len(body), 0) + body


_SUBMIT_TEMPLATE = FrameSubmit(operation_id=1,
                               payload_kind_bitmap=int(PayloadKind.STRUCTURED_EVENT),
                               payload_frame_count=1)
_SUBMIT_VALUES = list(FrameSubmit.LAYOUT.get_values(_SUBMIT_TEMPLATE))
_SUBMIT_OP_INDEX = FrameSubmit.LAYOUT.names.index("operation_id")
_SUBMIT = struct.Struct(HEADER.format + FrameSubmit.LAYOUT.pack_struct.format[1:]
                        + PRELUDE.format[1:] + DESCRIPTOR.format[1:])
_SUBMIT_META_LEN = FrameSubmit.LAYOUT.size
_SUBMIT_PREFIX = PRELUDE_LEN + DESCRIPTOR_LEN


def encode_openai_submit(session_id: int, frame_id: int, operation_id: int, payload: bytes, *,
                         trace_id: int = 0) -> bytes:
    """Fast path for the openai-compatible/1 request: FRAME_SUBMIT with one STRUCTURED_EVENT
    frame (profile 0, schema 0/0, SNAPSHOT), header, metadata, prelude and descriptor packed
    in one call. Byte-identical to ``encode`` with ``pack_single_frame``
    (docs/reference/nnrp-wire.md 4)."""
    values = _SUBMIT_VALUES.copy()
    values[_SUBMIT_OP_INDEX] = operation_id
    size = len(payload)
    return _SUBMIT.pack(
        MAGIC, VERSION_MAJOR, WIRE_FORMAT, MsgType.FRAME_SUBMIT, HEADER_LEN, 0, _SUBMIT_META_LEN,
        _SUBMIT_PREFIX + size, session_id, frame_id, 0, 0, trace_id, *values,
        0, 0, DESCRIPTOR_LEN, size, 0, 0, 0, 0,
        0, int(PayloadKind.STRUCTURED_EVENT), 0, 0, 0, int(StreamSemantics.SNAPSHOT), 0, 0, size,
    ) + payload


#: A raw unpacked header: magic (bytes) then twelve integers, in wire order.
RawHeader = tuple[Any, ...]


class _OversizedSubmit(Exception):
    """A FRAME_SUBMIT over the cap, within the protocol's: discarded, not fatal."""


def _check_raw_header(values: RawHeader, max_packet: int) -> type[Message]:
    """Header checks on the raw unpacked tuple (no object is built on the hot path)."""
    (magic, version, wire_format, msg_type, header_len, flags, meta_len, body_len) = values[:8]
    if magic != MAGIC:
        raise RemoteProtocolError(f"bad magic {bytes(magic)!r}", code=ErrorCode.MALFORMED_HEADER)
    if version != VERSION_MAJOR or wire_format != WIRE_FORMAT:
        raise RemoteProtocolError(
            f"unsupported version {version}.{wire_format} (need {VERSION_MAJOR}.{WIRE_FORMAT})",
            code=ErrorCode.UNSUPPORTED_VERSION)
    if header_len != HEADER_LEN:
        raise RemoteProtocolError(f"header_len {header_len} is not {HEADER_LEN}",
                                  code=ErrorCode.MALFORMED_HEADER)
    if flags & ~HEADER_FLAG_MASK:
        raise RemoteProtocolError(f"reserved header flag bits {flags & ~HEADER_FLAG_MASK:#x}",
                                  code=ErrorCode.MALFORMED_HEADER)
    cls = MESSAGE_CLASSES.get(msg_type)
    if cls is None:
        raise RemoteProtocolError(f"unknown msg_type {msg_type:#04x}",
                                  code=ErrorCode.MALFORMED_HEADER)
    if meta_len != cls.LAYOUT.size:
        raise RemoteProtocolError(
            f"{cls.MSG_TYPE.name}: meta_len {meta_len}, must be {cls.LAYOUT.size}",
            code=ErrorCode.MALFORMED_HEADER)
    total = HEADER_LEN + meta_len + body_len
    if total > max_packet:
        if cls is FrameSubmit and total <= PROTOCOL_MAX_PACKET:
            raise _OversizedSubmit
        raise RemoteProtocolError(
            f"{cls.MSG_TYPE.name}: packet of {total} bytes exceeds the {max_packet}-byte limit",
            code=ErrorCode.LIMIT_EXCEEDED)
    return cls


def _build(values: RawHeader, cls: type[Message], data: bytes | bytearray | memoryview,
           offset: int, shared: memoryview | None = None) -> Packet:
    """Decode metadata and body of a complete packet starting at ``offset``. ``shared``:
    a read-only view of ``data`` (the decoder's buffer, given away) that a big body may
    be a slice of."""
    meta_start = offset + HEADER_LEN
    layout = cls.LAYOUT
    message = cls.unpack(data, meta_start)
    body_len = values[7]
    body_start = meta_start + layout.size
    if body_len >= VIEW_MIN_BODY and (type(data) is bytes or shared is not None):
        # Not copied: a view of what it arrived in (the module docstring).
        view = shared if shared is not None else memoryview(data).toreadonly()
        body: Body = view[body_start:body_start + body_len]
    else:
        body = bytes(data[body_start:body_start + body_len]) if body_len else b""
    expected = message.expected_body_len()
    if expected is not None and expected != body_len:
        raise RemoteProtocolError(
            f"{cls.MSG_TYPE.name}: body_len {body_len}, metadata announces {expected}",
            code=ErrorCode.MALFORMED_BODY)
    return Packet(message, values[8], values[9], body, values[5], values[10], values[11],
                  values[12])


def _build_head(values: RawHeader, cls: type[Message], data: bytes | bytearray | memoryview,
                offset: int) -> Packet:
    """An oversized submit's packet: its metadata, no body, the body's size discarded."""
    message = cls.unpack(data, offset + HEADER_LEN)
    return Packet(message, values[8], values[9], b"", values[5], values[10], values[11],
                  values[12], discarded=values[7])


def decode_packet(data: bytes | bytearray | memoryview,
                  max_packet: int = DEFAULT_MAX_PACKET, *, given_away: bool = False) -> Packet:
    """Decode exactly one packet (a WebSocket message); trailing or missing bytes are errors.
    ``given_away``: the caller never changes a ``bytearray`` ``data`` again (a carrier's
    message, gateway/transport/_websocket.py), so a big body may be a view of it, as of
    ``bytes``; else a bytearray's is copied (a 63 MiB copy was a 100 ms step of the loop)."""
    if len(data) < HEADER_LEN:
        raise RemoteProtocolError(f"message of {len(data)} bytes is shorter than a header",
                                  code=ErrorCode.MALFORMED_HEADER)
    values = HEADER.unpack_from(data, 0)
    oversized = False
    try:
        cls = _check_raw_header(values, max_packet)
    except _OversizedSubmit:  # arrived whole (the carrier bounds it): refused, not fatal
        cls, oversized = FrameSubmit, True
    total = HEADER_LEN + values[6] + values[7]
    if total != len(data):
        raise RemoteProtocolError(f"message of {len(data)} bytes holds a {total}-byte packet",
                                  code=ErrorCode.MALFORMED_HEADER)
    if oversized:
        return _build_head(values, cls, data, 0)
    shared = (memoryview(data).toreadonly() if given_away and type(data) is bytearray
              else None)
    return _build(values, cls, data, 0, shared)


def _anonymous(size: int) -> mmap.mmap:
    """A big packet's own memory from the process (the module docstring)."""
    try:
        return mmap.mmap(-1, size)
    except OSError as no_memory:  # nor a mapping left here
        raise RemoteProtocolError(f"no memory for a packet of {size} bytes: {no_memory}",
                                  code=ErrorCode.SERVER_BUSY) from no_memory


def _fill(memory: mmap.mmap, at: int, source: bytes | bytearray | memoryview,
          offset: int, count: int) -> mmap.mmap:
    """``count`` bytes of ``source`` from ``offset`` into ``memory`` at ``at``; the
    memory they are in (``_spill`` S1: a spill that cannot grow hands what arrived
    to the process's own, which goes on from there; the spill goes with its last
    reference, and none is out)."""
    spill = memory if isinstance(memory, SpillMap) else None
    if spill is not None and not spill.reserve(at + count):
        memory = _anonymous(len(spill))
        memory[:at] = spill[:at]
        spill = None
    with memoryview(source) as arrived:
        memory[at:at + count] = arrived[offset:offset + count]
    if spill is not None:
        spill.settle(at, at + count)  # _spill S2
    return memory


class Decoder:
    """Incremental packet decoder for byte streams (TCP, unix sockets).

    Args:
        max_packet: largest packet accepted (header + metadata + body). Defaults to
            the protocol's 64 MiB (``DEFAULT_MAX_PACKET``); never more.
        spill: where a big FRAME_SUBMIT's own memory comes from when not from the
            process (``_spill``; None, or the factory's None: an anonymous map).

    Error handling: the first invalid packet raises ``RemoteProtocolError`` and the
    decoder stays broken (every later ``feed`` raises the same error): after a
    framing error the byte stream cannot be trusted. Valid packets that came before
    the bad one in the same ``feed`` are returned first; the error follows on the
    next call.
    """

    def __init__(self, max_packet: int = DEFAULT_MAX_PACKET, *,
                 spill: SpillMemory | None = None) -> None:
        if not HEADER_LEN <= max_packet <= PROTOCOL_MAX_PACKET:
            raise ValueError(f"max_packet must be between {HEADER_LEN} and {PROTOCOL_MAX_PACKET}")
        self.max_packet = max_packet
        self._spill = spill
        self._buffer = bytearray()
        self._pending: tuple[RawHeader, type[Message]] | None = None
        #: The pending packet is an oversized FRAME_SUBMIT (module docstring).
        self._oversized = False
        #: Body bytes of an oversized submit still to be read and dropped.
        self._discarding = 0
        #: The pending big packet's own memory (the module docstring), and how much of
        #: it has arrived.
        self._filling: mmap.mmap | None = None
        self._filled = 0
        self._error: RemoteProtocolError | None = None

    def _memory(self, total: int, cls: type[Message]) -> mmap.mmap:
        """A big packet's own memory: a spill's for a submit when there is one, else
        the process's (the module docstring)."""
        if cls is FrameSubmit and self._spill is not None:
            spilled = self._spill(total)
            if spilled is not None:
                return spilled
        return _anonymous(total)

    def close(self) -> None:
        """The stream is over: what an incomplete packet holds goes now (a spill's file
        with it), not when the collector finds the connection that held this decoder."""
        self._buffer = bytearray()
        self._filling, self._filled, self._pending = None, 0, None

    @property
    def error(self) -> RemoteProtocolError | None:
        """The error that broke the stream, once one has (see ``feed``)."""
        return self._error

    @property
    def awaited(self) -> int:
        """Bytes the big packet being read still needs (0 when none is): a hint for how
        much the next read may take at once."""
        return len(self._filling) - self._filled if self._filling is not None else 0

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete packet."""
        return len(self._buffer) + self._filled

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add bytes; return every packet they complete, in order."""
        if self._error is not None:
            raise self._error
        if self._buffer:
            self._buffer += data
            source: bytes | bytearray | memoryview = self._buffer
        else:
            source = data  # the common case: parse straight from the read, no copy
        packets: list[Packet] = []
        offset = 0
        available = len(source)
        max_packet = self.max_packet
        unpack_header = HEADER.unpack_from
        #: The buffer, given away as a read-only view once a big body is a slice of it.
        shared: memoryview | None = None
        try:
            while True:
                if self._discarding:
                    dropped = min(self._discarding, available - offset)
                    self._discarding -= dropped
                    offset += dropped
                    if self._discarding:
                        break
                if self._filling is not None:
                    filled = self._filled
                    taken = min(len(self._filling) - filled, available - offset)
                    filling = self._filling = _fill(self._filling, filled, source, offset,
                                                    taken)
                    offset += taken
                    if filled + taken < len(filling):
                        self._filled = filled + taken
                        break
                    assert self._pending is not None  # set with the filling, kept till done
                    values, cls = self._pending
                    self._filling, self._filled, self._pending = None, 0, None
                    whole = memoryview(filling).toreadonly()
                    packets.append(_build(values, cls, whole, 0, whole))
                    continue
                pending = self._pending
                if pending is None:
                    if available - offset < HEADER_LEN:
                        break
                    values = unpack_header(source, offset)
                    try:
                        pending = (values, _check_raw_header(values, max_packet))
                    except _OversizedSubmit:
                        pending = (values, FrameSubmit)
                        self._oversized = True
                    self._pending = pending
                values, cls = pending
                if self._oversized:
                    head = HEADER_LEN + values[6]
                    if available - offset < head:
                        break
                    packets.append(_build_head(values, cls, source, offset))
                    self._pending, self._oversized = None, False
                    self._discarding = values[7]
                    offset += head
                    continue
                total = HEADER_LEN + values[6] + values[7]
                if available - offset < total:
                    if values[7] >= VIEW_MIN_BODY:
                        # Its own memory, filled as it arrives (the module docstring).
                        filling = _fill(self._memory(total, cls), 0, source, offset,
                                        available - offset)
                        self._filling, self._filled = filling, available - offset
                        offset = available
                    break
                if shared is None and values[7] >= VIEW_MIN_BODY and source is self._buffer:
                    shared = memoryview(self._buffer).toreadonly()
                packets.append(_build(values, cls, source, offset, shared))
                self._pending = None
                offset += total
        except RemoteProtocolError as exc:
            self._error = exc
            self._buffer = bytearray()
            self._filling, self._filled = None, 0
            if packets:
                # Deliver what was valid; the next feed() raises.
                return packets
            raise
        if shared is not None:  # a body is a view of it: the rest goes to a new buffer
            self._buffer = bytearray(source[offset:])
        elif source is self._buffer:
            if offset:
                del self._buffer[:offset]
        elif offset < available:
            self._buffer = bytearray(source[offset:])
        return packets
