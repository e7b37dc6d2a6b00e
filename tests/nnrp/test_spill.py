"""A big submit held in a file (gateway/nnrp/_spill.py S1-S3, the decoder's ``spill``):
the same bytes and views as the process's own memory, whatever the reads' split and
whatever follows, with each page leaving the process as it fills and as it is read back.
How many pages of a map are resident is read from /proc/self/smaps (the kernel's count,
not a timing)."""

from __future__ import annotations

import ctypes
import gc
import hashlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway import nnrp
from gateway.pipeline import MediaDirectory
from gateway.pipeline._media import GROW_STEP
from tests.nnrp.test_codec import PING, _submit

MIB = 1 << 20


def _spill_in(directory: Path, made: list[nnrp.SpillMap], *, capacity: int = 1 << 30
              ) -> nnrp.SpillMemory:
    """The I/O layer's factory (gateway/pipeline/_media.py D5), noting each spill."""
    media = MediaDirectory(directory, capacity=capacity)

    def spill(size: int) -> nnrp.SpillMap | None:
        memory = media.spill(size)
        if memory is not None:
            made.append(memory)
        return memory

    return spill


def _resident(memory: mmap.mmap) -> int:
    """The bytes of ``memory`` the process has resident (its smaps entry's Rss)."""
    start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    with open("/proc/self/smaps") as smaps:
        lines = iter(smaps)
        for line in lines:
            if line.split("-", 1)[0] == f"{start:x}" or line.startswith(f"{start:08x}-"):
                for field in lines:
                    if field.startswith("Rss:"):
                        return int(field.split()[1]) * 1024
    raise AssertionError("the map is not in /proc/self/smaps")


def _feed(decoder: nnrp.Decoder, stream: bytes, step: int) -> list[nnrp.Packet]:
    packets = []
    for start in range(0, len(stream), step):
        packets += decoder.feed(stream[start:start + step])
    return packets


@pytest.mark.parametrize("step", [1000, 4093, 65536])
def test_a_spilled_submit_is_the_same_packet_and_what_follows_decodes_as_ever(
        tmp_path: Path, step: int) -> None:
    """(A packet complete in the read at hand is a view of that read, as without a
    spill: tests/nnrp/test_codec.py.)"""
    body = bytes(range(256)) * (nnrp.VIEW_MIN_BODY // 256 * 3 + 1)
    made: list[nnrp.SpillMap] = []
    decoder = nnrp.Decoder(spill=_spill_in(tmp_path, made))
    stream = PING + _submit(7, body) + _submit(8, b"s" * 100) + PING  # trailing packets
    packets = _feed(decoder, stream, step)
    assert [p.msg_type for p in packets] == [nnrp.MsgType.PING, nnrp.MsgType.FRAME_SUBMIT,
                                             nnrp.MsgType.FRAME_SUBMIT, nnrp.MsgType.PING]
    big = packets[1]
    assert isinstance(big.body, memoryview) and big.body.readonly
    assert isinstance(big.body.obj, nnrp.SpillMap) and big.body.obj is made[0]
    assert big.body == body  # the pages dropped as they filled kept their bytes (S2)
    assert (packets[2].message.operation_id, packets[2].body) == (8, b"s" * 100)
    assert len(made) == 1 and decoder.buffered == 0 and list(tmp_path.iterdir()) == []


def test_only_a_big_submit_spills_and_a_factory_that_declines_leaves_the_process_memory(
        tmp_path: Path) -> None:
    """Objects and cache entries are kept, as ever, in the process (S1: the factory is
    asked only for FRAME_SUBMIT); a factory's None is the anonymous map."""
    made: list[nnrp.SpillMap] = []
    decoder = nnrp.Decoder(spill=_spill_in(tmp_path, made))
    body = bytes(2 * nnrp.VIEW_MIN_BODY)
    put = nnrp.encode(nnrp.Packet(nnrp.CachePut(cache_namespace=1, cache_key_hi=2,
                                                cache_key_lo=3, object_kind=1,
                                                object_bytes=len(body)),
                                  session_id=3, body=body))
    (packet,) = _feed(decoder, put, 4096)
    assert isinstance(packet.body, memoryview) and type(packet.body.obj) is mmap.mmap
    assert made == []

    declined = nnrp.Decoder(spill=lambda size: None)
    (submit,) = _feed(declined, _submit(7, body), 4096)
    assert isinstance(submit.body, memoryview) and type(submit.body.obj) is mmap.mmap
    assert submit.body == body


def test_a_spill_holds_a_read_not_the_packet_and_readers_give_back_what_they_read(
        tmp_path: Path) -> None:
    """S2 and S3, as the kernel counts them: 32 MiB arriving a MiB at a time leave the
    map with less than a read's worth resident; a digest walking it (the request key),
    and a release after a whole read, leave it so too."""
    body = os.urandom(32 * MIB)
    made: list[nnrp.SpillMap] = []
    decoder = nnrp.Decoder(spill=_spill_in(tmp_path, made))
    (packet,) = _feed(decoder, _submit(7, body), MIB)
    (memory,) = made
    assert _resident(memory) < MIB
    assert nnrp.spill_sha256(packet.body) == hashlib.sha256(body).digest()
    assert _resident(memory) < nnrp.SPILL_SLICE + MIB
    assert bytes(packet.body) == body  # every page read back
    assert _resident(memory) >= 32 * MIB - MIB
    nnrp.spill_release(packet.body[5:10])  # a slice's owner is the map
    assert _resident(memory) == 0
    nnrp.spill_release(body)  # not a spill's: nothing
    nnrp.spill_release(memoryview(body))


def test_the_anonymous_map_is_never_dropped(tmp_path: Path) -> None:
    """MADV_DONTNEED on the process's own memory would zero it: only a spill is
    released, whatever a reader asks."""
    body = os.urandom(2 * nnrp.VIEW_MIN_BODY)
    (packet,) = _feed(nnrp.Decoder(), _submit(7, body), 4096)
    assert type(packet.body.obj) is mmap.mmap  # type: ignore[union-attr]
    nnrp.spill_release(packet.body)
    assert nnrp.spill_sha256(packet.body) == hashlib.sha256(body).digest()
    assert packet.body == body


def test_a_spilled_digest_walks_in_slices(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setattr("gateway.nnrp._spill.SPILL_SLICE", 100_000)
    body = os.urandom(3 * nnrp.VIEW_MIN_BODY + 17)
    made: list[nnrp.SpillMap] = []
    (packet,) = _feed(nnrp.Decoder(spill=_spill_in(tmp_path, made)), _submit(7, body), 4096)
    releases: list[int] = []
    release: Callable[[nnrp.SpillMap], None] = nnrp.SpillMap.release
    monkeypatch.setattr(nnrp.SpillMap, "release",
                        lambda self: (releases.append(1), release(self))[1])
    digest = hashlib.sha256()
    nnrp.spill_digest_update(digest, packet.body)
    assert digest.digest() == hashlib.sha256(body).digest()
    assert len(releases) == -(-len(body) // 100_000)


def test_a_spill_that_cannot_grow_goes_on_in_memory_with_what_arrived(tmp_path: Path
                                                                      ) -> None:
    """_spill S1: the directory's bound (or its disk) refuses a step mid-packet: what
    arrived moves into the process's memory and the packet completes there, whole; the
    spill, never handed out, goes at once."""
    body = os.urandom(3 * GROW_STEP)
    made: list[nnrp.SpillMap] = []
    # Room for the spill and its frame's file at the start, then files in flight take it.
    media = MediaDirectory(tmp_path, capacity=2 * len(body) + 1000)

    def spill(size: int) -> nnrp.SpillMap | None:
        memory = media.spill(size)
        assert memory is not None
        made.append(memory)
        return memory

    decoder = nnrp.Decoder(spill=spill)
    packet = _submit(7, body)
    assert decoder.feed(packet[:GROW_STEP + 100]) == []
    assert media.spilled == GROW_STEP + 100  # what arrived, or a step: the more
    media.used = media.capacity - media.spilled  # no room for another step now
    (done,) = _feed(decoder, packet[GROW_STEP + 100:] + PING, 1 << 20)[:1]
    assert done.body == body and type(done.body.obj) is mmap.mmap  # type: ignore[union-attr]
    del made[:]
    gc.collect()
    assert media.spilled == 0


def test_a_header_announcing_a_big_submit_costs_the_directory_what_arrived(
        tmp_path: Path) -> None:
    """_spill S1: 64 MiB announced, a KiB sent: one step counted, no more; a decoder
    closed (its connection over) lets go of it at once, without the collector."""
    media = MediaDirectory(tmp_path)
    decoder = nnrp.Decoder(spill=media.spill)
    packet = _submit(7, bytes(nnrp.PROTOCOL_MAX_PACKET - 1000))
    assert decoder.feed(packet[:1024]) == []
    assert 0 < media.spilled <= GROW_STEP
    gc.disable()
    try:
        decoder.close()
        assert media.spilled == 0 and decoder.buffered == 0
    finally:
        gc.enable()


def test_a_connection_lost_mid_submit_gives_its_spill_back_at_once(tmp_path: Path) -> None:
    """A connection may wait in a reference cycle for the collector: what its decoder
    held for an incomplete submit (a spill's blocks, counted against the directory's
    bound) goes when the connection is lost, not then."""
    from tests.support.wire import pk

    media = MediaDirectory(tmp_path)
    conn = nnrp.ServerConnection(nnrp.ServerConfig(spill=media.spill))
    conn.receive_data(pk(nnrp.ClientHello(profile_bitmap=0b11))
                      + pk(nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3,
                                            max_in_flight=4)))
    submit = nnrp.encode(nnrp.Packet(nnrp.FrameSubmit(operation_id=1, payload_kind_bitmap=0x10,
                                                      payload_frame_count=1),
                                     session_id=1, frame_id=1, body=bytes(8 << 20)))
    conn.receive_data(submit[:1 << 20])
    assert media.spilled > 0
    gc.disable()
    try:
        conn.connection_lost()
        assert media.spilled == 0
    finally:
        gc.enable()
