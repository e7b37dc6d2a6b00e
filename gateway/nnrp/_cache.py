"""One session's cache of CACHE_PUT objects (preview4 0x14-0x16, 0x46-0x47): the sans-IO
table behind ``_server_controls``' cache rules and the submit's object-reference region
(``_server_session`` rule 5).

The spec gives the frames (docs/reference/nnrp-wire.md: CACHE_PUT with the object as its
body, CACHE_ACK, CACHE_INVALIDATE, CACHE_REFERENCE / CACHE_MISS; a 128-bit key
``(cache_namespace, cache_key_hi, cache_key_lo)``) and no generic ACK. nnrp-py's native
server (1.0.0rc4) keeps no cache: it hands CACHE_REFERENCE, CACHE_INVALIDATE and a
submit's reference blocks to its application unanswered, and a client's CACHE_PUT fails
its session (native detail 105, nothing on the wire;
tests/interop/test_cache_objects.py). So where nnrp-py answers nothing the gateway
answers nothing either, and CACHE_PUT gets the answer its spec pairs it with, CACHE_ACK.

Rules (cited as C1..C8):

C1. CACHE_PUT keeps its body, the object (``object_bytes`` long: the codec refuses a
    packet whose body is not, and an unknown object_kind, as malformed, which closes the
    connection, ``_server`` rule 2), under its key, with its object_kind. Answered
    CACHE_ACK echoing namespace and key: ``accepted`` with the accepted ttl, ``replaced``
    when the key held other bytes (or another kind), or ``rejected`` (C3). Every ack
    says ``max_object_bytes``: the session's kept-byte bound, the largest object it can
    hold. A replay of the same put (same kind, same bytes) is accepted again: its ttl
    starts over and its dependents (C6) keep it. The body is kept as it came: a big
    one is a read-only view of the packet's own memory (``_codec``), never copied on the
    event loop; a replay is told by a C-speed compare (``hmac.compare_digest`` on two
    buffers: 44 ms for 64 MiB here, where ``==`` on a view took 140).
C2. ttl. ``ttl_ms`` 0 takes ``default_ttl_ms``; more than ``max_ttl_ms`` is cut to it; the
    ack says what was accepted. An entry is gone once its ttl has passed (``clock``,
    monotonic): a lookup of it misses ``expired``, and every put first sweeps what has
    expired, as does a kept-byte bound about to refuse (``_objects`` O9: the session's
    own entries for its bound, every session's for the process's pool), so an idle
    session's expired entries hold no room another needs. The put's flags (pinned,
    reusable) are noted only: every entry expires.
C3. Bounds. At most ``max_entries`` entries per session. The bytes are the session's
    *kept bytes*, the same reservation as its runtime objects' bytes (``_objects`` O9:
    the session's ``max_kept_bytes`` and the process's ``ObjectBytes`` pool), so a
    client cannot double its memory by using both. A put past one is ``rejected``,
    ``detail_code`` LIMIT_EXCEEDED (the session's bounds: entries, kept bytes) or
    SERVER_BUSY (the process's pool: others hold it; try later), and changes nothing:
    a key it would have replaced keeps its old bytes.
C4. CACHE_REFERENCE naming a held entry is answered with nothing (the protocol has no
    hit message, and nnrp-py's server sends none); one naming no entry gets CACHE_MISS
    ``not_found`` (``expired`` when its ttl has just passed), echoing namespace, key and
    profile.
C5. CACHE_INVALIDATE drops what its scope names (the whole session, a namespace, an
    object_kind, one key) and says nothing (no ack exists). Each operation that depended
    on a dropped entry (C6) is dropped ``object_invalidated``, as an invalidating
    OBJECT_RELEASE drops it (``_objects`` O6). A replacement (C1, other bytes) drops them
    the same way: what they depended on is no longer there.
C6. Dependencies. A submit whose object-reference region names only held entries, each
    of the block's object_kind, runs, and depends on each (C5). Any other block is
    answered CACHE_MISS on the submit's frame (``not_found``, ``expired``, or
    ``schema_mismatch`` for an entry of another kind), and the submit is refused
    ``object_reference_unresolved`` (``_server_session`` rule 5). A request reading an
    entry as media (``nnrp:cache/NS/KEY``, ``gateway.profile._media`` M9) depends on it
    from then on. An operation's dependencies end with it (``retire``). An entry that
    expires drops no one: its bytes were read already, or it was a mark of intent.
C7. Readers share one immutable copy of an entry's bytes (``read``), never a copy each.
C8. The cache lives with its session (a resumed session keeps it) and is emptied, its
    bytes given back, whenever the session ends (``_objects.ObjectTable.clear``: closed,
    its connection lost, its resume window over, the process stopping).

Negotiation grants ``cache.reference`` (``gateway.profile.RUNTIME_TOKENS``); the frames are
served without it too, as nnrp-py's server takes them: C4's miss is the wire suite's
capability-route-cache answer to a client that negotiated nothing.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import attrs

from ._constants import (
    CacheAckStatus,
    CacheInvalidateScope,
    CacheMissReason,
    ErrorCode,
)

if TYPE_CHECKING:
    from ._messages import CacheInvalidate, CachePut

#: A u32 field's largest value (the ack's max_object_bytes, accepted_ttl_ms).
_U32 = 0xFFFFFFFF

#: (cache_namespace, cache_key_hi, cache_key_lo): the 128-bit key of the wire digest.
CacheKey = tuple[int, int, int]


class KeptBytes(Protocol):
    """The session's kept-byte reservation (``_objects.ObjectTable``, O9), shared with its
    runtime objects (C3)."""

    @property
    def max_kept_bytes(self) -> int: ...

    def take_kept(self, size: int) -> ErrorCode | None:
        """Reserve ``size`` bytes; None, or the ack's detail code of the bound passed."""
        ...

    def give_kept(self, size: int) -> None: ...

    def expires_at(self, at: float) -> None:
        """An entry whose bytes a bound may take back from ``at`` (C2)."""
        ...


@attrs.frozen
class CacheLimits:
    """A session's cache bounds (C2, C3)."""

    #: Entries per session: each costs a lookup entry and its dependents' sets.
    max_entries: int = 64
    #: C2: an agent shows the same screenshot over several turns, minutes apart.
    default_ttl_ms: int = 10 * 60 * 1000
    #: C2: an hour at most; a session that needs longer puts again (a replay is cheap).
    max_ttl_ms: int = 60 * 60 * 1000


@attrs.frozen
class CacheMissed:
    """One block of a submit that did not resolve (C6): its key and why."""

    key: CacheKey
    reason: CacheMissReason


@attrs.define
class _Entry:
    object_kind: int
    data: bytes | memoryview = attrs.field(repr=False)
    expires_at: float
    #: Operations that depend on the entry (C6).
    dependents: set[int] = attrs.field(factory=set)


@attrs.frozen
class PutOutcome:
    """An applied or refused CACHE_PUT: its ack's status, accepted ttl and detail code, and
    the operations a replacement invalidated (C5)."""

    status: CacheAckStatus
    ttl_ms: int = 0
    detail_code: int = 0
    invalidated: tuple[int, ...] = ()


class CacheTable:
    """The cache of one session (C1-C8)."""

    def __init__(self, kept: KeptBytes, limits: CacheLimits | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kept = kept
        self.limits = limits if limits is not None else CacheLimits()
        self.clock = clock
        self._entries: dict[CacheKey, _Entry] = {}
        self._bytes = 0
        #: C2: no entry expires before this (it may be earlier than the earliest: a
        #: sweep then finds nothing, and sets it right).
        self._next_expiry = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """C3: the bytes the entries hold (part of the session's kept bytes)."""
        return self._bytes

    @property
    def max_object_bytes(self) -> int:
        """C1: the largest object this session can hold, as the ack says it (u32)."""
        return min(self.kept.max_kept_bytes, _U32)

    def dependents(self, key: CacheKey) -> frozenset[int]:
        entry = self._entries.get(key)
        return frozenset(entry.dependents) if entry is not None else frozenset()

    # ------------------------------------------------------------------ CACHE_PUT (C1-C3)

    def put(self, request: CachePut, body: bytes | memoryview) -> PutOutcome:
        limits = self.limits
        ttl_ms = min(request.ttl_ms or limits.default_ttl_ms, limits.max_ttl_ms)
        key = (request.cache_namespace, request.cache_key_hi, request.cache_key_lo)
        self.sweep()
        old = self._entries.get(key)
        if (old is not None and old.object_kind == request.object_kind
                and len(old.data) == len(body)
                and hmac.compare_digest(old.data, body)):  # a replay: the same object (C1)
            old.expires_at = self.clock() + ttl_ms / 1000
            return PutOutcome(CacheAckStatus.ACCEPTED, ttl_ms)
        if old is None and len(self._entries) >= limits.max_entries:
            return PutOutcome(CacheAckStatus.REJECTED, detail_code=int(ErrorCode.LIMIT_EXCEEDED))
        size = len(body)
        freed = len(old.data) if old is not None else 0
        if size > freed:
            # Out of the table while the bounds are asked: a bound about to refuse sweeps
            # (O9), and must not drop (and give back) the entry this put replaces.
            self._entries.pop(key, None)
            refused = self.kept.take_kept(size - freed)
            if old is not None:
                self._entries[key] = old
            if refused is not None:
                return PutOutcome(CacheAckStatus.REJECTED, detail_code=int(refused))
        elif size < freed:
            self.kept.give_kept(freed - size)
        self._bytes += size - freed
        expires_at = self.clock() + ttl_ms / 1000
        self._entries[key] = _Entry(request.object_kind, body, expires_at)
        self._next_expiry = min(self._next_expiry, expires_at)
        self.kept.expires_at(expires_at)
        if old is None:
            return PutOutcome(CacheAckStatus.ACCEPTED, ttl_ms)
        return PutOutcome(CacheAckStatus.REPLACED, ttl_ms, invalidated=tuple(
            sorted(old.dependents)))

    def sweep(self) -> None:
        """C2: every entry whose ttl has passed goes."""
        now = self.clock()
        for key in [key for key, entry in self._entries.items() if entry.expires_at <= now]:
            self._drop(key)
        self._next_expiry = min((entry.expires_at for entry in self._entries.values()),
                                default=math.inf)

    @property
    def next_expiry(self) -> float:
        """No entry expires before this (C2)."""
        return self._next_expiry

    def sweep_due(self) -> None:
        """C2 for a bound about to refuse: a sweep, when an entry may have expired (one
        comparison otherwise: the pool asks every session's cache)."""
        if self._next_expiry <= self.clock():
            self.sweep()

    # ------------------------------------------------------------------ lookups (C4, C6, C7)

    def lookup(self, key: CacheKey, object_kind: int | None = None
               ) -> _Entry | CacheMissReason:
        """The entry under ``key`` (of ``object_kind`` when given), or why it misses."""
        entry = self._entries.get(key)
        if entry is None:
            return CacheMissReason.NOT_FOUND
        if entry.expires_at <= self.clock():
            self._drop(key)
            return CacheMissReason.EXPIRED
        if object_kind is not None and entry.object_kind != object_kind:
            return CacheMissReason.SCHEMA_MISMATCH
        return entry

    def resolve(self, blocks: Iterable[tuple[CacheKey, int]], operation_id: int
                ) -> tuple[CacheMissed, ...]:
        """C6: a submit's blocks ((key, object_kind) each). Every miss, in order; when
        there is none the operation now depends on each entry."""
        found: list[_Entry] = []
        missed: list[CacheMissed] = []
        for key, object_kind in blocks:
            entry = self.lookup(key, object_kind)
            if isinstance(entry, CacheMissReason):
                missed.append(CacheMissed(key, entry))
            else:
                found.append(entry)
        if not missed:
            for entry in found:
                entry.dependents.add(operation_id)
        return tuple(missed)

    def read(self, key: CacheKey, operation_id: int, *, operation_in_flight: bool = True
             ) -> bytes | memoryview | CacheMissReason:
        """C6, C7: the entry's bytes, shared, read by ``operation_id``, which depends on it
        from now on if it is still in flight; or why there are none."""
        entry = self.lookup(key)
        if isinstance(entry, CacheMissReason):
            return entry
        if operation_in_flight:
            entry.dependents.add(operation_id)
        return entry.data

    # ------------------------------------------------------------------ CACHE_INVALIDATE (C5)

    def invalidate(self, request: CacheInvalidate) -> tuple[int, ...]:
        """Drop what the scope names; the operations that depended on it, to be dropped."""
        scope = request.scope
        namespace = request.cache_namespace
        if scope == CacheInvalidateScope.WHOLE_SESSION:
            keys = list(self._entries)
        elif scope == CacheInvalidateScope.NAMESPACE:
            keys = [key for key in self._entries if key[0] == namespace]
        elif scope == CacheInvalidateScope.OBJECT_KIND:
            # The kind travels in cache_key_hi (``CacheInvalidate.check``); a namespace of
            # 0 means every namespace.
            keys = [key for key, entry in self._entries.items()
                    if entry.object_kind == request.cache_key_hi
                    and (not namespace or key[0] == namespace)]
        else:
            key = (namespace, request.cache_key_hi, request.cache_key_lo)
            keys = [key] if key in self._entries else []
        invalidated: set[int] = set()
        for key in keys:
            invalidated |= self._drop(key)
        return tuple(sorted(invalidated))

    # ------------------------------------------------------------------ ends (C6, C8)

    def retire(self, operation_id: int) -> None:
        """The operation ended: it depends on nothing any more."""
        if not self._entries:
            return  # the hot path: most sessions cache nothing
        for entry in self._entries.values():
            entry.dependents.discard(operation_id)

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: CacheKey) -> set[int]:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.data)
        self.kept.give_kept(len(entry.data))
        return entry.dependents
