"""A session's cache in the sans-IO core (gateway/nnrp/_cache.py, rules C1-C8; the
controls' rule 19; the session's rule 5 for a submit whose object-reference region names
cached objects), as pure data: bytes in, events and reply frames out, with a clock the
test moves (ttl).

Suite cases: ``l1.cache.lifecycle.roundtrip`` (CACHE_PUT, CACHE_ACK, CACHE_INVALIDATE as
one lifecycle, on a live session) and ``l1.result_push.object_reference.resolve``
(resolved, or a protocol-shaped CACHE_MISS), server side.
"""

from __future__ import annotations

from typing import Any

import pytest
from nnrp.core.messages.control import CacheAckMetadata, CachePutMetadata

from gateway import nnrp
from tests.support.resume import RESUMABLE, SESSION_ENDS, Clock, book, connection, end_session
from tests.support.wire import of, pk, replies

HELLO = nnrp.ClientHello(profile_bitmap=0b11)
OPEN = nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3, max_in_flight=4)
SESSION = 1
CAMERA = int(nnrp.CacheObjectKind.CAMERA_BLOCK)
TILES = int(nnrp.CacheObjectKind.TILE_INDEX_BLOCK)
PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 4
#: object_ref_mask's bit for each kind a block here has (``_body.REFERENCE_SLOTS``).
SLOT_BITS = {CAMERA: 0b01, TILES: 0b10}
#: CacheLimits' defaults, as the acks say them.
DEFAULT_TTL_MS, MAX_TTL_MS = 600_000, 3_600_000
MAX_KEPT = 64 << 20


def connected(clock: Clock | None = None, **config: Any) -> nnrp.ServerConnection:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(**config), clock or Clock())
    conn.receive_data(pk(HELLO) + pk(OPEN))
    return conn


def put(key_lo: int, data: bytes = PNG, *, kind: int = CAMERA, namespace: int = 7,
        ttl_ms: int = 0, key_hi: int = 1) -> bytes:
    return pk(nnrp.CachePut(cache_namespace=namespace, object_kind=kind, cache_key_hi=key_hi,
                            cache_key_lo=key_lo, ttl_ms=ttl_ms, object_bytes=len(data)),
              session_id=SESSION, body=data)


def ack_of(events: list[Any]) -> nnrp.CacheAck:
    (reply,) = replies(events)
    assert isinstance(reply.message, nnrp.CacheAck) and reply.session_id == SESSION
    return reply.message


def reference(key_lo: int, *, namespace: int = 7, key_hi: int = 1) -> bytes:
    return pk(nnrp.CacheReference(cache_namespace=namespace, profile_id=2, reuse_scope=1,
                                  cache_key_hi=key_hi, cache_key_lo=key_lo),
              session_id=SESSION)


def invalidate(scope: nnrp.CacheInvalidateScope, namespace: int = 0, key_hi: int = 0,
               key_lo: int = 0) -> bytes:
    return pk(nnrp.CacheInvalidate(scope=int(scope), cache_namespace=namespace,
                                   cache_key_hi=key_hi, cache_key_lo=key_lo, reason_code=2),
              session_id=SESSION)


def block(key_lo: int, kind: int = CAMERA, key_hi: int = 1) -> nnrp.ObjectReference:
    return nnrp.ObjectReference(kind, 7, key_hi, key_lo)


def submit(operation_id: int, frame_id: int, *blocks: nnrp.ObjectReference) -> bytes:
    """A submit whose object-reference region names ``blocks`` (their kinds' slots)."""
    mask = sum(SLOT_BITS[b.object_kind] for b in blocks)
    body = nnrp.pack_typed_body([(nnrp.TypedDescriptor(), b'{"a":1}')],
                                object_references=list(blocks))
    return pk(nnrp.FrameSubmit(operation_id=operation_id,
                               submit_mode=int(nnrp.SubmitMode.MIXED) if blocks else 0,
                               object_ref_mask=mask, payload_kind_bitmap=0x10,
                               payload_frame_count=1),
              session_id=SESSION, frame_id=frame_id, body=body)


def cache_of(conn: nnrp.ServerConnection) -> nnrp.CacheTable:
    session = conn.session(SESSION)
    assert session is not None
    return session.objects.cache


# --------------------------------------------------------------------------- bytes


def test_cache_put_and_ack_are_nnrp_pys_bytes() -> None:
    """Suite case l1.cache.lifecycle.roundtrip's values, in our codec and nnrp-py's."""
    ours = nnrp.CachePut(cache_namespace=1, object_kind=4, cache_key_hi=0x01020304,
                         cache_key_lo=0x05060708, ttl_ms=15_000, object_bytes=2048,
                         codec_bitmap=3, flags=3)
    theirs = CachePutMetadata(1, 0x01020304, 0x05060708, nnrp.CacheObjectKind.CODEC_TABLE,
                              15_000, 2048, 3, 3).pack()
    layout = nnrp.CachePut.LAYOUT
    assert layout.pack_struct.pack(*layout.get_values(ours)) == theirs
    ack = nnrp.CacheAck(cache_namespace=1, status=0, cache_key_hi=0x01020304,
                        cache_key_lo=0x05060708, accepted_ttl_ms=15_000, max_object_bytes=8192)
    layout = nnrp.CacheAck.LAYOUT
    assert layout.pack_struct.pack(*layout.get_values(ack)) == CacheAckMetadata(
        1, 0x01020304, 0x05060708, 0, 15_000, 8192, 0).pack()


# --------------------------------------------------------------------------- C1, C2, C4


def test_a_put_is_acked_and_referenced_silently_and_a_missing_key_misses() -> None:
    conn = connected()
    ack = ack_of(conn.receive_data(put(2, ttl_ms=30_000)))
    assert ack == nnrp.CacheAck(cache_namespace=7, status=int(nnrp.CacheAckStatus.ACCEPTED),
                                cache_key_hi=1, cache_key_lo=2, accepted_ttl_ms=30_000,
                                max_object_bytes=MAX_KEPT, detail_code=0)
    session = conn.session(SESSION)
    assert session is not None
    assert session.objects.kept_bytes == len(PNG)  # the session's kept bytes (C3)
    assert conn.receive_data(reference(2)) == []  # a hit: nothing to say (C4)
    (miss,) = replies(conn.receive_data(reference(3)))
    assert (miss.session_id, miss.frame_id) == (SESSION, 0)
    assert miss.message == nnrp.CacheMiss(cache_namespace=7, profile_id=2,
                                          miss_reason=int(nnrp.CacheMissReason.NOT_FOUND),
                                          cache_key_hi=1, cache_key_lo=3)
    # Another namespace is another key.
    (other,) = replies(conn.receive_data(reference(2, namespace=8)))
    assert other.message.miss_reason == nnrp.CacheMissReason.NOT_FOUND


def test_ttl_defaults_caps_and_expires() -> None:
    clock = Clock()
    conn = connected(clock)
    assert ack_of(conn.receive_data(put(1))).accepted_ttl_ms == DEFAULT_TTL_MS
    assert ack_of(conn.receive_data(put(2, ttl_ms=10_000_000))).accepted_ttl_ms == MAX_TTL_MS
    assert ack_of(conn.receive_data(put(3, ttl_ms=5_000))).accepted_ttl_ms == 5_000
    clock.now += 4.999
    assert conn.receive_data(reference(3)) == []
    clock.now += 0.001
    (miss,) = replies(conn.receive_data(reference(3)))  # its ttl has passed: gone
    assert miss.message.miss_reason == nnrp.CacheMissReason.EXPIRED
    assert cache_of(conn).held_bytes == 2 * len(PNG)
    (miss,) = replies(conn.receive_data(reference(3)))
    assert miss.message.miss_reason == nnrp.CacheMissReason.NOT_FOUND
    # A put sweeps whatever else has expired: its bytes go back.
    clock.now += DEFAULT_TTL_MS / 1000
    ack_of(conn.receive_data(put(4, b"x")))
    assert len(cache_of(conn)) == 2 and cache_of(conn).held_bytes == len(PNG) + 1


def test_a_replay_of_the_same_put_renews_it_and_other_bytes_replace_it() -> None:
    clock = Clock()
    conn = connected(clock)
    ack_of(conn.receive_data(put(2, ttl_ms=1_000)))
    clock.now += 0.9
    again = ack_of(conn.receive_data(put(2, ttl_ms=1_000)))
    assert again.status == nnrp.CacheAckStatus.ACCEPTED
    clock.now += 0.9  # 1.8 s after the first put, 0.9 s after the replay: still held
    assert conn.receive_data(reference(2)) == []
    assert cache_of(conn).held_bytes == len(PNG)  # nothing kept twice
    replaced = ack_of(conn.receive_data(put(2, b"GIF89a-other")))
    assert replaced.status == nnrp.CacheAckStatus.REPLACED
    assert cache_of(conn).held_bytes == len(b"GIF89a-other")
    # Another kind under the same key replaces it too.
    assert ack_of(conn.receive_data(put(2, b"GIF89a-other", kind=TILES))).status == (
        nnrp.CacheAckStatus.REPLACED)


# --------------------------------------------------------------------------- C3


def test_bounds_entries_session_bytes_and_the_process_pool() -> None:
    pool = nnrp.ObjectBytes(capacity=40)
    conn = connected(cache=nnrp.CacheLimits(max_entries=2),
                     objects=nnrp.ObjectLimits(max_kept_bytes=30), object_bytes=pool)
    conn.receive_data(put(1, b"a" * 10) + put(2, b"b" * 10))
    full = ack_of(conn.receive_data(put(3, b"c")))
    assert (full.status, full.detail_code, full.accepted_ttl_ms) == (
        nnrp.CacheAckStatus.REJECTED, nnrp.ErrorCode.LIMIT_EXCEEDED, 0)
    assert full.max_object_bytes == 30
    # Replacing a held key needs no new entry, only its extra bytes: 10 + 21 > 30.
    over = ack_of(conn.receive_data(put(2, b"B" * 21)))
    assert (over.status, over.detail_code) == (nnrp.CacheAckStatus.REJECTED,
                                              nnrp.ErrorCode.LIMIT_EXCEEDED)
    assert conn.receive_data(reference(2)) == []  # the refused put changed nothing
    session = conn.session(SESSION)
    assert session is not None
    assert session.objects.cache.read((7, 1, 2), 0) == b"b" * 10
    assert (session.objects.kept_bytes, pool.used) == (20, 20)
    # The process's pool, shared with another session: SERVER_BUSY, try later.
    other = connected(objects=nnrp.ObjectLimits(max_kept_bytes=30), object_bytes=pool)
    ack_of(other.receive_data(put(9, b"z" * 15)))
    busy = ack_of(conn.receive_data(put(2, b"B" * 16)))
    assert (busy.status, busy.detail_code) == (nnrp.CacheAckStatus.REJECTED,
                                              nnrp.ErrorCode.SERVER_BUSY)
    # A smaller replacement gives bytes back.
    assert ack_of(conn.receive_data(put(2, b"s"))).status == nnrp.CacheAckStatus.REPLACED
    assert (session.objects.kept_bytes, pool.used) == (11, 26)
    # Every refusal left the session serving.
    assert replies(conn.receive_data(pk(nnrp.Ping(), session_id=SESSION)))[0].msg_type is (
        nnrp.MsgType.PONG)


def _with_object_and_entry(clock: Clock, *, max_kept_bytes: int, ttl_ms: int = 0
                           ) -> tuple[nnrp.ServerConnection, bytes]:
    """A session with objects negotiated, a 20-byte cache entry and a 16-byte object
    declared: the connection, and the patch that would write the object's bytes."""
    tokens = ("object.delta", "object.lifecycle")
    conn = connected(clock, objects=nnrp.ObjectLimits(max_kept_bytes=max_kept_bytes),
                     runtime_tokens=frozenset(tokens))
    body = nnrp.pack_tokens(tokens)
    conn.receive_data(pk(nnrp.CapabilityNegotiation(profile_id=2, capability_count=2,
                                                    body_bytes=len(body)),
                         session_id=SESSION, body=body))
    ack_of(conn.receive_data(put(1, b"c" * 20, ttl_ms=ttl_ms)))
    conn.receive_data(pk(nnrp.ObjectDeclare(object_id=5, session_id=SESSION, byte_size=16),
                         session_id=SESSION))
    patch = pk(nnrp.ObjectPatch(object_id=5, delta_sequence=1, region_bytes=16,
                                delta_bytes=16,
                                flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION)),
               session_id=SESSION, body=b"o" * 16)
    return conn, patch


def test_expired_entries_of_an_idle_session_never_hold_room_another_needs() -> None:
    """C2 and O9: a bound about to refuse first takes back what has expired: the pool
    every session's, a session's bound its own (an object's patch included); with
    nothing expired, a refusal costs each cache one comparison, not a sweep."""
    clock = Clock()
    pool = nnrp.ObjectBytes(capacity=40)
    idle = connected(clock, objects=nnrp.ObjectLimits(max_kept_bytes=30), object_bytes=pool)
    ack_of(idle.receive_data(put(1, b"i" * 25, ttl_ms=1_000)))
    busy = connected(clock, objects=nnrp.ObjectLimits(max_kept_bytes=30), object_bytes=pool)
    refused = ack_of(busy.receive_data(put(1, b"b" * 20)))
    assert (refused.status, refused.detail_code) == (nnrp.CacheAckStatus.REJECTED,
                                                    nnrp.ErrorCode.SERVER_BUSY)
    sweeps: list[int] = []
    idle_cache = cache_of(idle)
    sweep = idle_cache.sweep
    idle_cache.sweep = lambda: (sweeps.append(1), sweep())[1]  # type: ignore[method-assign]
    ack_of(busy.receive_data(put(1, b"b" * 20)))
    assert sweeps == []  # nothing had expired: no sweep of the idle session
    clock.now += 1.0  # the idle session's entry expires; it sends nothing
    accepted = ack_of(busy.receive_data(put(1, b"b" * 20)))
    assert accepted.status == nnrp.CacheAckStatus.ACCEPTED and sweeps == [1]
    assert len(idle_cache) == 0 and pool.used == 20

    # The session's own bound: an object's patch takes back its own expired entry.
    own, patch = _with_object_and_entry(clock, max_kept_bytes=32, ttl_ms=1_000)
    (refusal,) = replies(own.receive_data(patch))
    assert refusal.message.error_code == nnrp.ErrorCode.LIMIT_EXCEEDED
    clock.now += 1.0
    assert own.receive_data(patch) == []  # applied: the expired entry gave its bytes back
    assert len(cache_of(own)) == 0


def test_cached_bytes_and_object_bytes_share_one_bound() -> None:
    """A client cannot double its memory by using both (C3, O9)."""
    conn, patch = _with_object_and_entry(Clock(), max_kept_bytes=32)
    (refusal,) = replies(conn.receive_data(patch))
    assert refusal.message.error_code == nnrp.ErrorCode.LIMIT_EXCEEDED
    assert b"32 kept bytes" in refusal.body
    conn.receive_data(invalidate(nnrp.CacheInvalidateScope.WHOLE_SESSION))
    assert conn.receive_data(patch) == []  # the cache's bytes went back: the object fits
    over = ack_of(conn.receive_data(put(1, b"c" * 20)))
    assert over.status == nnrp.CacheAckStatus.REJECTED


# --------------------------------------------------------------------------- C5


@pytest.mark.parametrize(("scope", "fields", "left"), [
    (nnrp.CacheInvalidateScope.WHOLE_SESSION, {}, set()),
    (nnrp.CacheInvalidateScope.NAMESPACE, {"namespace": 7}, {(8, 1)}),
    (nnrp.CacheInvalidateScope.OBJECT_KIND, {"key_hi": TILES}, {(7, 1), (8, 1)}),
    (nnrp.CacheInvalidateScope.OBJECT_KIND, {"namespace": 8, "key_hi": CAMERA},
     {(7, 1), (7, 2)}),
    (nnrp.CacheInvalidateScope.OBJECT_KEY, {"namespace": 7, "key_hi": 1, "key_lo": 2},
     {(7, 1), (8, 1)}),
    (nnrp.CacheInvalidateScope.OBJECT_KEY, {"namespace": 7, "key_hi": 1, "key_lo": 9},
     {(7, 1), (7, 2), (8, 1)}),
])
def test_invalidate_drops_what_its_scope_names_silently(
        scope: nnrp.CacheInvalidateScope, fields: dict[str, int],
        left: set[tuple[int, int]]) -> None:
    conn = connected()
    conn.receive_data(put(1) + put(2, kind=TILES) + put(1, namespace=8))
    assert conn.receive_data(invalidate(scope, **fields)) == []
    held = {(namespace, key_lo) for namespace, key_lo in ((7, 1), (7, 2), (8, 1))
            if not replies(conn.receive_data(reference(key_lo, namespace=namespace)))}
    assert held == left
    assert cache_of(conn).held_bytes == len(PNG) * len(left)


# --------------------------------------------------------------------------- C6: submits


def test_a_submit_naming_held_entries_runs_and_a_missing_one_is_refused() -> None:
    """Suite case l1.result_push.object_reference.resolve, server side: resolved."""
    conn = connected()
    conn.receive_data(put(1) + put(2, b"tiles", kind=TILES))
    events = conn.receive_data(submit(10, 1, block(1), block(2, TILES)))
    (submitted,) = of(events, nnrp.OperationSubmitted)
    assert submitted.typed_body is not None and submitted.body_error is None
    assert not replies(events)  # no CACHE_MISS
    assert cache_of(conn).dependents((7, 1, 1)) == {10}
    # One block misses: its CACHE_MISS alone, on the submit's frame, then the refusal.
    events = conn.receive_data(submit(11, 2, block(1), block(3, TILES)))
    (miss,) = replies(events)
    assert (miss.frame_id, miss.message.cache_key_lo, miss.message.miss_reason) == (
        2, 3, nnrp.CacheMissReason.NOT_FOUND)
    (refusal,) = of(events, nnrp.SubmitRefused)
    assert refusal.reason is nnrp.RefusalReason.OBJECT_REFERENCE_UNRESOLVED
    assert "not_found" in refusal.message and "CACHE_PUT" in refusal.message
    assert cache_of(conn).dependents((7, 1, 1)) == {10}  # the refused one holds nothing
    # An entry of another kind is not the object the block names.
    events = conn.receive_data(submit(12, 3, block(2)))
    (miss,) = replies(events)
    assert miss.message.miss_reason == nnrp.CacheMissReason.SCHEMA_MISMATCH
    assert of(events, nnrp.SubmitRefused)


def test_an_expired_reference_misses_expired() -> None:
    clock = Clock()
    conn = connected(clock)
    conn.receive_data(put(1, ttl_ms=100))
    clock.now += 0.1
    (miss,) = replies(conn.receive_data(submit(10, 1, block(1))))
    assert miss.message.miss_reason == nnrp.CacheMissReason.EXPIRED


def test_invalidating_or_replacing_an_entry_drops_the_operations_that_depend_on_it() -> None:
    conn = connected()
    conn.receive_data(put(1) + put(2, kind=TILES))
    conn.receive_data(submit(10, 1, block(1)) + submit(11, 2, block(2, TILES))
                      + submit(12, 3))
    events = conn.receive_data(invalidate(nnrp.CacheInvalidateScope.OBJECT_KEY, 7, 1, 1))
    (cancelled,) = of(events, nnrp.OperationCancelled)
    assert (cancelled.operation_id, cancelled.source, cancelled.reason) == (
        10, nnrp.CancelSource.OBJECT_INVALIDATED, nnrp.ControlReason.DEPENDENCY_FAILED)
    assert b"invalidated" in cancelled.diagnostic
    (drop,) = [nnrp.decode_packet(raw) for raw in conn.send_drop(
        SESSION, 10, nnrp.DropReason.OBJECT_INVALIDATED, b"object_invalidated")][1:]
    assert drop.message.drop_reason == nnrp.DropReason.OBJECT_INVALIDATED
    # A replay of the same bytes keeps operation 11; other bytes replace the entry and
    # drop it.
    assert not of(conn.receive_data(put(2, kind=TILES)), nnrp.OperationCancelled)
    events = conn.receive_data(put(2, b"new", kind=TILES))
    assert ack_of(events).status == nnrp.CacheAckStatus.REPLACED
    (cancelled,) = of(events, nnrp.OperationCancelled)
    assert cancelled.operation_id == 11 and b"replaced" in cancelled.diagnostic
    # Operation 12 referenced nothing and runs on.
    session = conn.session(SESSION)
    assert session is not None and session.operation_state(12) is nnrp.OpState.ACTIVE


def test_a_reader_depends_on_the_entry_until_it_ends() -> None:
    conn = connected()
    conn.receive_data(put(1) + submit(10, 1))
    cache = cache_of(conn)
    data = cache.read((7, 1, 1), 10)
    assert data == PNG and cache.read((7, 1, 1), 10) is data  # one shared copy (C7)
    assert cache.dependents((7, 1, 1)) == {10}
    assert cache.read((7, 1, 9), 10) is nnrp.CacheMissReason.NOT_FOUND
    conn.send_result(SESSION, 10, 200, b"{}")
    assert cache.dependents((7, 1, 1)) == frozenset()  # retired with its operation
    # A reader that ended already holds nothing.
    cache.read((7, 1, 1), 10, operation_in_flight=False)
    assert cache.dependents((7, 1, 1)) == frozenset()
    assert not of(conn.receive_data(invalidate(nnrp.CacheInvalidateScope.WHOLE_SESSION)),
                  nnrp.OperationCancelled)


# --------------------------------------------------------------------------- C8


@pytest.mark.parametrize("end", SESSION_ENDS)
def test_every_end_of_a_session_gives_its_cached_bytes_back(end: str) -> None:
    pool = nnrp.ObjectBytes(capacity=64)
    clock = Clock()
    sessions = book(clock, window=10.0)
    conn = connection(sessions, object_bytes=pool)
    conn.receive_data(pk(RESUMABLE) + put(1, b"A" * 16))
    assert pool.used == 16
    end_session(conn, sessions, clock, end, session_id=SESSION, pool=pool)
    assert pool.used == 0


def test_a_resumed_session_keeps_its_cache() -> None:
    from tests.support.resume import resume

    clock = Clock()
    sessions = book(clock, window=10.0)
    conn = connection(sessions)
    (opened,) = [p for p in replies(conn.receive_data(pk(RESUMABLE)))
                 if isinstance(p.message, nnrp.SessionOpenAck)]
    token = opened.body[-opened.message.resume_token_bytes:]
    conn.receive_data(put(1))
    conn.connection_lost()
    again = connection(sessions)
    again.receive_data(resume(token))
    assert again.receive_data(reference(1)) == []


# --------------------------------------------------------------------------- what the codec refuses


def test_a_put_whose_body_is_not_its_object_bytes_is_malformed() -> None:
    """A peer that lies about object_bytes sent a malformed packet (the body length must
    equal the ``*_bytes`` field): the codec refuses it and the connection fails (rule 2),
    as every such packet does; nothing is kept."""
    conn = connected()
    raw = bytearray(put(1, b"12345678"))
    raw[16:20] = (4).to_bytes(4, "little")  # header body_len 4: the metadata says 8
    events = conn.receive_data(bytes(raw[:-4]))
    (failed,) = of(events, nnrp.ConnectionFailed)
    (error,) = [nnrp.decode_packet(raw) for raw in failed.replies]
    assert isinstance(error.message, nnrp.Error)
    assert (error.message.code, error.message.is_fatal) == (nnrp.ErrorCode.MALFORMED_BODY, 1)
    assert b"metadata announces 8" in error.body


def test_cache_frames_need_no_negotiation_and_the_token_is_granted() -> None:
    conn = connected(runtime_tokens=frozenset({"cache.reference"}))
    body = nnrp.pack_tokens(("cache.reference",))
    (reply,) = replies(conn.receive_data(pk(nnrp.CapabilityNegotiation(
        profile_id=2, capability_count=1, body_bytes=len(body)), session_id=SESSION,
        body=body)))
    assert nnrp.parse_tokens(reply.body, 1) == ("cache.reference",)
    from gateway.profile import runtime_tokens

    assert "cache.reference" in runtime_tokens(priority_scheduling=False)
    assert "cache.reference" in nnrp.KNOWN_TOKENS  # nnrp-py's client knows it


def test_a_replacement_whose_entry_expires_while_the_bounds_are_asked_is_counted_once(
        ) -> None:
    """The clock moves between the put's own sweep and the bound's (O9): the entry being
    replaced must not be swept and given back there, then given back again by the put
    (a 1,200-byte object in a 1,000-byte bound, and the count wrong for good)."""
    now = [0.0]
    pool = nnrp.ObjectBytes(1 << 20)
    table = nnrp.ObjectTable(SESSION, nnrp.ObjectLimits(max_kept_bytes=1000), pool,
                             clock=lambda: now[0])
    cache = table.cache

    def put_object(body: bytes) -> nnrp.PutOutcome:
        return cache.put(nnrp.CachePut(cache_namespace=0, object_kind=CAMERA, cache_key_hi=0,
                                       cache_key_lo=0, ttl_ms=10, object_bytes=len(body)),
                         body)

    assert put_object(b"a" * 600).status == nnrp.CacheAckStatus.ACCEPTED
    sweep = cache.sweep

    def sweep_then_tick() -> None:
        sweep()
        now[0] = 0.011  # past the entry's ttl, after the put's own sweep

    cache.sweep = sweep_then_tick  # type: ignore[method-assign]
    refused = put_object(b"b" * 1200)
    assert (refused.status, refused.detail_code) == (nnrp.CacheAckStatus.REJECTED,
                                                    nnrp.ErrorCode.LIMIT_EXCEEDED)
    assert table.kept_bytes == cache.held_bytes == pool.used == 600
    cache.sweep = sweep  # type: ignore[method-assign]
    cache.sweep()  # it expired meanwhile: now it goes, once
    assert table.kept_bytes == cache.held_bytes == pool.used == 0
