"""The limits and advertised values of the server role (one object, shared by every
connection of a server)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs

from ._cache import CacheLimits
from ._constants import DEFAULT_MAX_PACKET, StandardProfile
from ._objects import ObjectBytes, ObjectLimits
from ._spill import SpillMemory, spill_digest_update

if TYPE_CHECKING:
    from ._body import TypedBody


@attrs.frozen
class ResubmissionRead:
    """A resubmission as the profile reads it: the key of the request it asks for (the
    same as ``ResubmissionRule.key`` of the original when it is the same request), the
    position it declares (the last result the client holds), or why that position is
    none (a malformed value: the client is told, naming the field)."""

    key: bytes = attrs.field(repr=False)
    position: int | None = None
    problem: str | None = None


class ResubmissionRule(Protocol):
    """How a profile tells a resubmission from another request (``_journal`` rule J3):
    a key of the request without what may differ in a resubmission (the position). A
    pure function of the submit's typed body (None: one that did not parse), run in a
    worker thread for a big one (``_server_session`` rule 5c): it must never raise."""

    def read(self, body: TypedBody | None) -> ResubmissionRead: ...


class SameBytes:
    """Without a profile: a resubmission is the same bytes, and declares no position.
    Each frame's bytes are hashed where they lie (hashlib releases the GIL on a big
    one), its length first, so that no two bodies' frames run together."""

    def read(self, body: TypedBody | None) -> ResubmissionRead:
        digest = hashlib.sha256()
        for _, payload in body.frames if body is not None else ():
            digest.update(len(payload).to_bytes(8, "big"))
            spill_digest_update(digest, payload)  # a spill's in slices (_spill S3)
        return ResubmissionRead(digest.digest())


@attrs.frozen
class ServerConfig:
    """Limits and advertised values of one server connection."""

    max_packet: int = DEFAULT_MAX_PACKET
    max_sessions: int = 64
    max_in_flight: int = 64
    #: Profiles a session may open: the stock clients' token profile (the openai
    #: profile is chosen per frame) plus the typed profile 0 itself.
    session_profiles: frozenset[int] = frozenset({int(StandardProfile.TOKEN),
                                                  int(StandardProfile.OPENAI_TYPED)})
    #: Hello profile bitmap, bit (profile_id - 1): the token profile.
    hello_profile_bitmap: int = 1 << (int(StandardProfile.TOKEN) - 1)
    max_pending_deadlines: int = 64
    max_pending_supersedes: int = 64
    #: How long a superseded operation waits for its replacement before it is dropped
    #: anyway (rule 9): a client that never submits one must not hold vLLM's work.
    supersede_hold_ms: int = 5_000
    lease_ttl_ms: int = 30_000
    token_ttl_ms: int = 120_000
    #: The runtime tokens capability negotiation may grant (what the adapter implements).
    runtime_tokens: frozenset[str] = frozenset()
    #: The retry time sent with a busy refusal (in-flight limit, draining).
    busy_retry_after_ms: int = 1000
    #: Checks SESSION_OPEN auth bytes; None accepts any (auth is then the transport's job).
    authenticate: Callable[[bytes], bool] | None = None
    #: Asked before a new (not resumed) session opens: None admits it; a text refuses it
    #: with SESSION_OPEN_ACK retry_later (limit_reached) and that text as diagnostic (the
    #: gateway's load-aware admission: vLLM is too busy, open the session elsewhere).
    admit_session: Callable[[], str | None] | None = None
    #: Each session's runtime-object bounds (``_objects`` rules O2, O4, O6).
    objects: ObjectLimits = attrs.field(factory=ObjectLimits)
    #: The bytes every session's objects keep, together (``_objects`` O9): one pool per
    #: config, so per process.
    object_bytes: ObjectBytes = attrs.field(factory=ObjectBytes, eq=False, repr=False)
    #: Each session's cache bounds (``_cache`` C2, C3; its bytes count as kept bytes).
    cache: CacheLimits = attrs.field(factory=CacheLimits)
    #: How a resubmission after a resume is compared with its request (the profile's).
    resubmission: ResubmissionRule = attrs.field(factory=SameBytes)
    #: A submit whose frames hold this many bytes or more has its request key computed
    #: by the I/O layer, off the event loop (``_server_session`` rule 5c); a smaller one's here.
    key_off_loop_bytes: int = 1 << 20
    #: Where a big FRAME_SUBMIT's bytes are held while it is read and served, when not in
    #: the process's memory (``_spill``: the media directory's files; None: memory).
    spill: SpillMemory | None = attrs.field(default=None, eq=False, repr=False)
    #: Refused session opens and resumes (bad credentials, a token that opens nothing)
    #: one connection may make at once, and per second after that (``_server_lifecycle`` rule 4e).
    refusal_burst: int = 8
    refusals_per_second: float = 1.0
