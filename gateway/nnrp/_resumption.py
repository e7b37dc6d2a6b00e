"""Resumable sessions, decided sans-IO: which session a token opens, when tokens rotate,
how long a session waits for its client, and what one client may hold.

``SessionBook`` is the one owner of this state for a whole gateway process: every
connection's ``ServerConnection`` asks it (``_server_lifecycle`` rule 4), and the I/O layer only
runs its timer (``next_deadline`` / ``expire``) and moves bytes. Time is the caller's
clock (seconds, monotonic); randomness is the caller's source (the OS CSPRNG in
production). Nothing here imports trio.

A session's phases:

    (granted) ──▶ ATTACHED ──(connection ends without SESSION_CLOSE)──▶ DETACHED
                     ▲  │                                                │  │
                     │  └──(SESSION_CLOSE, failure)──▶ ENDED ◀──(window)─┘  │
                     └────────────(resume, migrate: the token)──────────────┘
                     (a migrate also takes it from a live connection)

Rules (docs/resume.md; cited as R1..R12 in code):

R1. Grant: a SESSION_OPEN with ``allow_resume`` gets a token and the window when resume
    is on, the process is not draining, it holds fewer than ``max_sessions`` resumable
    sessions and the client fewer than ``max_sessions_per_client``. Otherwise the
    session opens without resume (``resume_enabled`` clear: the client sees it), so
    every window already granted is honoured (``NotGranted`` says why: metrics, logs).
R2. A client is its authenticated identity (session auth on), else its TLS client
    certificate, else its address. Its resumable sessions and the bytes their journals
    hold are capped (R1; ``client_bytes``: a ``Budget`` its journals share). Every
    session keeps its ``floor`` whatever other clients hold (``_journal`` J4).
R3. Tokens: ``token_bytes`` from the caller's CSPRNG (with several workers, the first
    byte names the issuing worker; in a fleet, a route naming the pod comes first, R11),
    looked up by digest and compared in constant time, bound to how the session was
    secured (``Binding``): the auth identity, the TLS client certificate, and whether
    the carrier was encrypted. A token opens its session only for the same identity,
    for the same certificate once one was presented, and never in clear once the
    session was on TLS. The binding only ever tightens: a session resumed or migrated
    over TLS (or with a certificate) is bound to it from then on. Never logged, never
    in a repr.
R4. Rotation without loss: every accepted resume or migration issues a new token (the
    ACK carries it), and the token the client used stays good: a client that never got
    the ACK (lost with its connection) resumes again with the token it holds, which
    discards the unanswered one and issues another. So at most two tokens open a
    session: the one the client is known to hold, and the newest. The older one is let
    go ``confirm_grace`` seconds after the client shows, on the connection the ACK went
    to, that it holds the newest (its first packet naming the session after the ACK, or
    a PING: ``_server_lifecycle`` rule 4f, ``confirm``); the grace covers a client that sent that
    packet before the ACK reached it (pipelining) and then lost the connection.
R5. Lookups never change anything (``find``); a refused resume or migration (a wrong
    profile, a live holder, a full connection) spends nothing: the same token can try
    again.
R6. Detach: the session's connection ended without SESSION_CLOSE (and did not fail):
    it waits ``window`` seconds (during a drain, at most until the drain ends). Its
    operations run on and write to its journal. A second drop restarts the window:
    whatever window ran before (a detached one, or the resubmissions') is over.
R7. Resume: the token of a detached session attaches it to the new connection; the
    operations whose results it holds wait for their resubmission for one ``window``
    (``ServerSession.resumed``); those not resubmitted then end unseen (``expire``,
    ``RESUBMISSIONS``).
R8. A session still attached when a resume with its token arrives: its connection may be
    dead without the server knowing yet (a cut with no FIN or RST, a balancer still
    acknowledging). The resume is answered retry_later, and the holder is probed: a PING,
    and if nothing at all arrives on it within ``probe_timeout`` it is closed (the I/O
    layer), which detaches the session for the next attempt. A client also can take it
    at once with SESSION_MIGRATE (R9).
R9. Migration takes the session from wherever it is, a live connection included, which
    is told (a non-fatal ERROR naming the session) and lets it go. It rotates the token
    as a resume does (R4; the ACK's body carries the new one).
R10. Expiry: a session still detached when its window passes ends (``WINDOW``): the I/O
    layer cancels its operations (vLLM aborts). Its id and tokens are forgotten at once.
R11. Workers and pods: a token that names another worker (its first byte) or, in a
    fleet, another pod (its route, ``_fleet`` F1) is ``Elsewhere`` (``where``,
    ``find``); the connection is handed there at most once (``_server_lifecycle`` rule 4d), and a
    token naming no session where it points is refused there like any other. A fleet
    token that no fleet key authenticates and that this process did not issue (F2), or
    one naming a worker this pod does not have, is refused here.
R12. Drain: no new grants; resumes and migrations of the sessions held are still
    accepted, so a client collects what finished while it was away; detached sessions
    wait until the drain ends at the latest.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import hmac
import itertools
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs

from ._fleet import Elsewhere, FleetIdentity, ForwardOutcome
from ._journal import Budget, Journal
from ._session_ids import SessionIds

if TYPE_CHECKING:
    from ._server_session import ServerSession


class Holder(Protocol):
    """A connection a session is attached to, as the book sees it (``_server``'s
    ``ServerConnection``): it can let the session go (a migration takes it, R9) and be
    asked to show it is alive (R8)."""

    def detach(self, session_id: int) -> object: ...

    def start_probe(self) -> bytes | None: ...


@attrs.frozen
class ResumePolicy:
    """What resume allows and costs (``--resume-*``)."""

    #: Seconds a detached session waits for its client; 0 turns resume off.
    window: float = 120.0
    #: Resumable sessions in the process, attached or detached (R1).
    max_sessions: int = 1024
    #: Resumable sessions one client may hold (R2).
    max_sessions_per_client: int = 64
    #: Bytes one session's journal holds (``_journal`` rule J4).
    session_bytes: int = 4 << 20
    #: Bytes the journals of one client hold together (R2).
    client_bytes: int = 64 << 20
    #: Bytes every journal of the process holds together.
    total_bytes: int = 256 << 20
    token_bytes: int = 24
    #: With several workers (``--workers``): this process's index, and every worker's
    #: relay socket, by index (R11; the I/O layer listens and connects there).
    worker: int = 0
    relays: tuple[str, ...] = ()
    #: In a fleet (``--fleet-advertise``): this pod, its address and the fleet's keys
    #: (R11, ``_fleet``); None: a single pod.
    fleet: FleetIdentity | None = None
    #: How long the holder of an attached session has to answer a probe (R8).
    probe_timeout: float = 2.0
    #: How long the older of a session's two tokens stays good once the client has
    #: shown it holds the newest (R4).
    confirm_grace: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.window > 0

    @property
    def workers(self) -> int:
        return max(1, len(self.relays))

    @property
    def window_ms(self) -> int:
        return min(int(self.window * 1000), 0xFFFFFFFF)


@attrs.frozen
class PeerCredentials:
    """What the carrier says about the client (the I/O layer knows it): its address
    (without the port), whether the carrier is encrypted (tcps, wss, quic), and the
    SHA-256 of the TLS certificate it presented, if any."""

    address: str = ""
    secure: bool = False
    certificate: bytes = b""


@attrs.frozen
class Binding:
    """What a token is bound to (R3): never in a repr."""

    auth: bytes = attrs.field(repr=False)
    certificate: bytes = attrs.field(repr=False)
    secure: bool

    @classmethod
    def of(cls, auth: bytes, peer: PeerCredentials) -> Binding:
        digest = hashlib.sha256(auth).digest() if auth else b""
        return cls(digest, peer.certificate, peer.secure)

    def admits(self, other: Binding) -> bool:
        """Whether a resume presenting ``other`` may take a session bound to this."""
        same_auth = hmac.compare_digest(self.auth, other.auth)
        same_certificate = (not self.certificate
                            or hmac.compare_digest(self.certificate, other.certificate))
        return same_auth and same_certificate and (other.secure or not self.secure)

    def tightened(self, other: Binding) -> Binding:
        """The binding after a move that ``other`` was admitted for (R3: it only ever
        tightens)."""
        return Binding(self.auth, self.certificate or other.certificate,
                       self.secure or other.secure)


class Phase(enum.Enum):
    ATTACHED = "attached"
    DETACHED = "detached"
    ENDED = "ended"


class Lookup(enum.Enum):
    """Why ``find`` found nothing to resume here."""

    #: No session answers to this id, token and binding: the same answer whatever was
    #: wrong, so nothing says whether a session exists (R3).
    REJECTED = "rejected"


class NotGranted(enum.Enum):
    """Why a session that asked for resume opened without it (R1)."""

    OFF = "off"
    DRAINING = "draining"
    PROCESS_CAP = "process_cap"
    CLIENT_CAP = "client_cap"


class ExpiryKind(enum.Enum):
    WINDOW = "window"  # detached past its window: the session ends (R10)
    RESUBMISSIONS = "resubmissions"  # resumed, but some were never resubmitted (R7)


@attrs.frozen
class ResumeGrant:
    """What a resumable session's ACK carries: its (next) token and the window."""

    token: bytes = attrs.field(repr=False)
    window_ms: int


@attrs.frozen
class Expiry:
    record: ResumeRecord
    kind: ExpiryKind
    #: RESUBMISSIONS: the operations that end unseen.
    abandoned: tuple[int, ...] = ()


@attrs.define
class ResumeStats:
    """Counters (exported by the metrics at scrape time)."""

    detached_total: int = 0
    resumed_total: int = 0
    migrated_total: int = 0
    expired_total: int = 0
    refused_total: int = 0
    relayed_total: int = 0
    replayed_events_total: int = 0
    replayed_bytes_total: int = 0
    #: Sessions that asked for resume and opened without it, by ``NotGranted`` value.
    not_granted: dict[str, int] = attrs.field(factory=dict)
    #: Forwards to other pods of the fleet, and from them, by ``ForwardOutcome`` value.
    fleet_forwards: dict[str, int] = attrs.field(factory=dict)
    #: Holders of an attached session probed (R8), and those closed for their silence.
    probes_total: int = 0
    probe_failures_total: int = 0

    def count_forward(self, outcome: ForwardOutcome) -> None:
        """One forward more that ended so (``fleet_forwards``)."""
        self.fleet_forwards[outcome.value] = self.fleet_forwards.get(outcome.value, 0) + 1


class ResumeRecord:
    """One resumable session, as the book keeps it."""

    __slots__ = ("binding", "client", "confirm_on", "deadline", "holder", "phase", "session",
                 "tokens")

    def __init__(self, session: ServerSession, binding: Binding, client: bytes,
                 holder: Holder) -> None:
        self.session = session
        #: The tokens that open it (R4), oldest first, each with when it stops (None:
        #: not before another token is confirmed). Never more than two.
        self.tokens: dict[bytes, float | None] = {}
        self.binding = binding
        self.client = client
        self.holder: Holder | None = holder
        self.phase = Phase.ATTACHED
        #: When its window ends (detached), or its resubmissions' (attached; None: none).
        self.deadline: float | None = None
        #: The connection whose next packet for the session confirms the newest (R4).
        self.confirm_on: Holder | None = None

    @property
    def newest(self) -> bytes:
        """The token the last ACK carried."""
        return next(reversed(self.tokens))

    def __repr__(self) -> str:
        return (f"ResumeRecord(session_id={self.session.session_id}, "
                f"phase={self.phase.value})")


@attrs.define
class _Client:
    """One client's share (R2)."""

    sessions: int
    budget: Budget


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class SessionBook:
    """Every resumable session of one gateway process (R1-R12), and the process's
    session ids (``SessionIds``). ``clock``: seconds, monotonic; ``random_bytes``: the
    CSPRNG; ``on_earlier_deadline``: called when a deadline earlier than every other appears
    (the I/O layer's timer sleeps until ``next_deadline``)."""

    def __init__(self, policy: ResumePolicy | None = None, *, ids: SessionIds | None = None,
                 clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        self.policy = policy or ResumePolicy()
        self.ids = ids if ids is not None else SessionIds()
        self.clock = clock
        self._random_bytes = random_bytes
        self.total = Budget(self.policy.total_bytes)
        self.stats = ResumeStats()
        self.records: dict[int, ResumeRecord] = {}
        self._clients: dict[bytes, _Client] = {}
        self._by_token: dict[bytes, ResumeRecord] = {}
        self._deadlines: list[tuple[float, int, int]] = []
        self._sequence = itertools.count()
        self.draining = False
        self._drain_deadline: float | None = None
        #: The drain is over: nothing detaches any more (every session that loses its
        #: connection ends).
        self.closed = False
        self.on_earlier_deadline: Callable[[], None] | None = None

    # ------------------------------------------------------------------ figures

    @property
    def sessions(self) -> int:
        return len(self.records)

    @property
    def floor(self) -> int:
        """What a session's journal may hold whatever the shared bounds say (``_journal``
        J4): its share of the process's bound (256 KiB by default), at most its own."""
        policy = self.policy
        return min(policy.session_bytes, policy.total_bytes // max(1, policy.max_sessions))

    @property
    def detached(self) -> int:
        return sum(1 for record in self.records.values() if record.phase is Phase.DETACHED)

    def client_budget(self, client: bytes) -> Budget | None:
        share = self._clients.get(client)
        return share.budget if share is not None else None

    def record_of(self, session_id: int) -> ResumeRecord | None:
        return self.records.get(session_id)

    # ------------------------------------------------------------------ grant (R1, R2)

    def grant(self, session: ServerSession, binding: Binding, client: bytes,
              holder: Holder) -> ResumeGrant | NotGranted:
        policy = self.policy
        refusal = None
        share = self._clients.get(client)
        if not policy.enabled:
            refusal = NotGranted.OFF
        elif self.draining:
            refusal = NotGranted.DRAINING
        elif len(self.records) >= policy.max_sessions:
            refusal = NotGranted.PROCESS_CAP
        elif share is not None and share.sessions >= policy.max_sessions_per_client:
            refusal = NotGranted.CLIENT_CAP
        if refusal is not None:
            counts = self.stats.not_granted
            counts[refusal.value] = counts.get(refusal.value, 0) + 1
            return refusal
        if share is None:
            share = self._clients[client] = _Client(0, Budget(policy.client_bytes))
        share.sessions += 1
        record = ResumeRecord(session, binding, client, holder)
        token = self._issue(record)
        self.records[session.session_id] = record
        session.journal = Journal(policy.session_bytes, (share.budget,),
                                  pooled=(self.total,), floor=self.floor)
        session.resumable = True
        return ResumeGrant(token, policy.window_ms)

    def _issue(self, record: ResumeRecord) -> bytes:
        """A new token for ``record`` (R3), mapped to it: its newest."""
        while True:
            token = self._random_bytes(self.policy.token_bytes)
            if self.policy.fleet is not None:  # R11: the route names the pod and worker
                token = self.policy.fleet.seal(self.policy.worker, token)
            elif self.policy.workers > 1:  # R11: the first byte names the worker
                token = bytes([self.policy.worker]) + token[1:]
            digest = _digest(token)
            if digest not in self._by_token:
                break
        self._by_token[digest] = record
        record.tokens[token] = None
        return token

    def _drop_token(self, record: ResumeRecord, token: bytes) -> None:
        record.tokens.pop(token, None)
        self._by_token.pop(_digest(token), None)

    def _opens(self, record: ResumeRecord, token: bytes) -> bool:
        """Whether ``token`` opens ``record`` now (R4); a token past its grace goes."""
        for held, until in list(record.tokens.items()):
            if until is not None and self.clock() >= until:
                self._drop_token(record, held)
            elif hmac.compare_digest(held, token):
                return True
        return False

    # ------------------------------------------------------------------ lookups (R3, R5)

    def where(self, token: bytes) -> Elsewhere | Lookup | None:
        """Where ``token``'s session lives (R11): None for this process, ``Elsewhere`` for
        another worker or pod, ``Lookup.REJECTED`` for a token no process of this fleet
        issued (a fleet token no key authenticates, F2; a worker this pod lacks)."""
        policy = self.policy
        if policy.fleet is not None:
            route = policy.fleet.route(token)
            if route is None:
                # F2: no key opens its route; if it is one of ours, under a key retired
                # since, it still opens its session here.
                return None if _digest(token) in self._by_token else Lookup.REJECTED
            if not policy.fleet.is_here(route):
                return Elsewhere(route.worker, route.pod)
            worker = route.worker
        elif policy.workers > 1 and token:
            worker = token[0]
        else:
            return None
        if worker >= policy.workers:
            return Lookup.REJECTED
        return None if worker == policy.worker else Elsewhere(worker)

    def find(self, session_id: int, token: bytes, binding: Binding | None
             ) -> ResumeRecord | Lookup | Elsewhere:
        """The session ``token`` opens for ``binding`` (R3; None: the caller checks the
        binding itself, ``admits``), or where it lives if not here (R11); changes
        nothing (R5)."""
        place = self.where(token)
        if isinstance(place, Elsewhere):
            return place
        record = self._by_token.get(_digest(token)) if place is None else None
        if (record is None or record.phase is Phase.ENDED
                or record.session.session_id != session_id
                or not self._opens(record, token)
                or (binding is not None and not record.binding.admits(binding))):
            self.stats.refused_total += 1
            return Lookup.REJECTED
        return record

    def admitted(self, record: ResumeRecord, bindings: list[Binding]) -> Binding | None:
        """The first of ``bindings`` that may take ``record`` (R3); a refusal is counted."""
        for binding in bindings:
            if record.binding.admits(binding):
                return binding
        self.stats.refused_total += 1
        return None

    # ------------------------------------------------------------------ moving (R4, R6-R9)

    def resume(self, record: ResumeRecord, used: bytes, connection: Holder,
               binding: Binding) -> ResumeGrant:
        """R7: ``record``'s detached session is attached to ``connection`` (which presented
        ``binding``); its next token."""
        assert record.phase is Phase.DETACHED, "only a detached session is resumed"
        record.binding = record.binding.tightened(binding)
        token = self._rotate(record, used)
        self._attach(record, connection)
        if record.session.resumed():  # operations wait for their resubmission
            self._set_deadline(record, self._window_end())
        self.stats.resumed_total += 1
        return ResumeGrant(token, self.policy.window_ms)

    def migrate(self, record: ResumeRecord, used: bytes, connection: Holder,
                binding: Binding) -> tuple[ResumeGrant, Holder | None]:
        """R9: ``record``'s session moves to ``connection`` (which presented ``binding``)
        from wherever it is; its next token, and the connection it was taken from (to be
        told), if any."""
        record.binding = record.binding.tightened(binding)
        token = self._rotate(record, used)
        previous = record.holder
        if previous is not None:
            previous.detach(record.session.session_id)
        self._attach(record, connection)
        self.stats.migrated_total += 1
        return ResumeGrant(token, self.policy.window_ms), previous

    def _rotate(self, record: ResumeRecord, used: bytes) -> bytes:
        """R4: the token the client showed is known to be held (it stays good); every
        other goes, and a new one is issued."""
        for held in list(record.tokens):
            if not hmac.compare_digest(held, used):
                self._drop_token(record, held)
        record.tokens[used] = None
        return self._issue(record)

    def _attach(self, record: ResumeRecord, connection: Holder) -> None:
        record.phase = Phase.ATTACHED
        record.holder = connection
        record.confirm_on = connection
        record.deadline = None

    def confirm(self, record: ResumeRecord) -> None:
        """R4: the client sent a packet for the session on the connection its newest
        token went to: every older one goes ``confirm_grace`` from now."""
        newest = record.newest
        until = self.clock() + self.policy.confirm_grace
        for held, current in record.tokens.items():
            if held != newest and current is None:
                record.tokens[held] = until
        record.confirm_on = None

    def detach(self, record: ResumeRecord) -> bool:
        """R6: the session's connection ended; False when it cannot wait (it ended, or
        the drain is over)."""
        if record.phase is Phase.ENDED or self.closed:
            return False
        record.phase = Phase.DETACHED
        record.holder = None
        record.confirm_on = None
        self._set_deadline(record, self._window_end())
        self.stats.detached_total += 1
        return True

    def end(self, record: ResumeRecord) -> None:
        """The session is over (closed, failed, expired): its tokens and id go, and its
        client's share. Its journal is the session's to clear once its operations end."""
        if record.phase is Phase.ENDED:
            return
        record.phase = Phase.ENDED
        record.holder = record.confirm_on = None
        record.deadline = None
        record.session.objects.clear()  # expired or closed: its kept bytes go (_objects O9)
        for held in list(record.tokens):
            self._drop_token(record, held)
        session_id = record.session.session_id
        if self.records.get(session_id) is record:
            del self.records[session_id]
            self.ids.release(session_id)
        share = self._clients.get(record.client)
        if share is not None:
            share.sessions -= 1
            self.forget_client_if_idle(record.client)

    def forget_client_if_idle(self, client: bytes) -> None:
        """A client's last journal bytes went: its share goes too."""
        share = self._clients.get(client)
        if share is not None and share.sessions <= 0 and share.budget.held <= 0:
            del self._clients[client]

    # ------------------------------------------------------------------ time (R6, R7, R10, R12)

    def _window_end(self) -> float:
        end = self.clock() + self.policy.window
        if self._drain_deadline is not None:
            end = min(end, self._drain_deadline)
        return end

    def _set_deadline(self, record: ResumeRecord, deadline: float) -> None:
        earliest = self.next_deadline()
        record.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._sequence),
                                         record.session.session_id))
        if len(self._deadlines) > 4 * len(self.records) + 64:
            # Stale entries (a session that detached and came back many times) only leave
            # from the top: rebuild from the live deadlines, so the heap stays bounded by
            # the sessions, not by how often they moved.
            self._deadlines = [(r.deadline, next(self._sequence), r.session.session_id)
                               for r in self.records.values() if r.deadline is not None]
            heapq.heapify(self._deadlines)
        if (earliest is None or deadline < earliest) and self.on_earlier_deadline:
            self.on_earlier_deadline()

    def next_deadline(self) -> float | None:
        """When ``expire`` next has something to do (None: nothing waits)."""
        heap = self._deadlines
        while heap:
            deadline, _, session_id = heap[0]
            record = self.records.get(session_id)
            if record is not None and record.deadline == deadline:
                return deadline
            heapq.heappop(heap)  # stale: the record moved on
        return None

    def expire(self) -> list[Expiry]:
        """Every window that has passed by now (R7, R10)."""
        now = self.clock()
        expired: list[Expiry] = []
        while (deadline := self.next_deadline()) is not None and deadline <= now:
            _, _, session_id = heapq.heappop(self._deadlines)
            record = self.records[session_id]
            record.deadline = None
            if record.phase is Phase.DETACHED:
                self.stats.expired_total += 1
                self.end(record)
                expired.append(Expiry(record, ExpiryKind.WINDOW))
            else:
                abandoned = record.session.abandon_awaiting()
                if abandoned:
                    expired.append(Expiry(record, ExpiryKind.RESUBMISSIONS, abandoned))
        return expired

    def close(self) -> list[ResumeRecord]:
        """The drain is over (R12): every session still detached ends; those attached
        end with their connections. What ended here, for the I/O layer."""
        self.closed = True
        ended = [record for record in self.records.values() if record.phase is Phase.DETACHED]
        for record in ended:
            self.end(record)
        return ended

    def start_draining(self, deadline: float) -> None:
        """R12: no new grants; every window ends by ``deadline``."""
        self.draining = True
        self._drain_deadline = deadline
        for record in list(self.records.values()):
            if record.deadline is not None and record.deadline > deadline:
                self._set_deadline(record, deadline)
