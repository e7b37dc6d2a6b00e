"""Resume and migration in the sans-IO layer (gateway/nnrp/_resumption.py R1-R12,
gateway/nnrp/_server_lifecycle.py rule 4, gateway/nnrp/_server_session.py rule 5), with the real
``SessionBook``, a clock the test moves and deterministic tokens: what goes on the wire
for each answer, when a token opens what, and what a resubmission gets.

Issue 34's findings each have a test here or in tests/e2e (named in its docstring)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from gateway.nnrp._server_lifecycle import MAX_HAND_OFF_BYTES
from gateway.transport import READ_SIZE
from tests.support.resume import (
    RESUMABLE,
    Clock,
    book,
    connection,
    cut,
    exercise,
    migrate,
    resume,
)
from tests.support.tiers import examples
from tests.support.wire import of, pk, replies

REQUEST = json.dumps({"schema_version": 1, "operation": "chat.completions.create",
                      "body": {"model": "m", "messages": [], "stream": True}}).encode()


def submit(operation_id: int, frame_id: int, payload: bytes = REQUEST, session_id: int = 1
           ) -> bytes:
    return pk(nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=0x10,
                               payload_frame_count=1),
              session_id=session_id, frame_id=frame_id, body=nnrp.pack_single_frame(payload))


def with_position(position: Any, payload: bytes = REQUEST) -> bytes:
    document = json.loads(payload)
    document["nnrp"] = {"resume_after_sequence": position}
    return json.dumps(document).encode()


def opened(sessions: nnrp.SessionBook, **config: Any) -> tuple[nnrp.ServerConnection, bytes]:
    conn = connection(sessions, **config)
    events = conn.receive_data(pk(RESUMABLE))
    (ack,) = replies(events)
    assert of(events, nnrp.SessionOpened)[0].resumable
    return conn, ack.body


def streamed(conn: nnrp.ServerConnection, operation_id: int = 7001, frame_id: int = 1,
             partials: int = 3, *, end: bool = False) -> list[bytes]:
    """Submit one operation and send ``partials`` results (and its 200, with ``end``)."""
    conn.receive_data(submit(operation_id, frame_id))
    sent = [conn.send_partial(1, operation_id, b"p%d" % n) for n in range(1, partials + 1)]
    if end:
        sent += conn.send_result(1, operation_id, 200, b"done")
    return [packet for packet in sent if packet is not None]


def resumed(sessions: nnrp.SessionBook, token: bytes, session_id: int = 1, **config: Any
            ) -> tuple[nnrp.ServerConnection, bytes]:
    conn = connection(sessions, **config)
    (ack,) = replies(conn.receive_data(resume(token, session_id)))
    assert ack.message.status == nnrp.SessionOpenStatus.RESUMED, ack.body
    return conn, ack.body


# --------------------------------------------------------------------------- grant (R1, R2)


def test_an_open_that_asks_for_resume_gets_a_token_and_the_window() -> None:
    conn = connection(book())
    (ack,) = replies(conn.receive_data(pk(RESUMABLE)))
    message = ack.message
    assert (message.status, message.session_flags_ack) == (nnrp.SessionOpenStatus.OPENED, 1)
    assert (message.resume_window_ms, message.resume_token_bytes) == (120_000, 24)
    assert ack.body == (1).to_bytes(24, "big") and ack.session_id == 1


@pytest.mark.parametrize(("why", "reason"), [
    ("not asked", None), ("resume off", "off"), ("process cap", "process_cap"),
    ("client cap", "client_cap"), ("draining", "draining"), ("no book", None)])
def test_without_a_grant_the_session_opens_without_resume(why: str, reason: str | None) -> None:
    sessions = book(window=0 if why == "resume off" else 120.0,
                    max_sessions=1 if why == "process cap" else 1024,
                    max_sessions_per_client=1 if why == "client cap" else 64)
    if why in ("process cap", "client cap"):
        opened(sessions)  # the one allowed
    if why == "no book":
        conn = nnrp.ServerConnection()
        conn.receive_data(pk(nnrp.ClientHello(profile_bitmap=0b11)))
    else:
        conn = connection(sessions)
    if why == "draining":
        sessions.start_draining(sessions.clock() + 30)
    request = attrs.evolve(RESUMABLE, session_flags=0) if why == "not asked" else RESUMABLE
    events = conn.receive_data(pk(request))
    (ack,) = replies(events)
    assert ack.message.status == nnrp.SessionOpenStatus.OPENED
    assert (ack.message.session_flags_ack, ack.message.resume_window_ms,
            ack.message.resume_token_bytes, ack.body) == (0, 0, 0, b"")
    (event,) = of(events, nnrp.SessionOpened)
    assert (event.resumable, event.not_granted) == (False, reason)
    if reason is not None:
        assert sessions.stats.not_granted[reason] == 1


def test_a_client_is_its_identity_else_its_certificate_else_its_address() -> None:
    """Finding 6: four connections of one client took every resumable slot. The cap is
    per client: another address (or identity) still gets resume."""
    sessions = book(max_sessions_per_client=2)
    alice = nnrp.PeerCredentials(address="10.0.0.1")
    for _ in range(2):
        conn = connection(sessions, peer=alice)
        assert of(conn.receive_data(pk(RESUMABLE)), nnrp.SessionOpened)[0].resumable
    conn = connection(sessions, peer=alice)
    assert not of(conn.receive_data(pk(RESUMABLE)), nnrp.SessionOpened)[0].resumable
    bob = connection(sessions, peer=nnrp.PeerCredentials(address="10.0.0.2"))
    assert of(bob.receive_data(pk(RESUMABLE)), nnrp.SessionOpened)[0].resumable
    # Mutual TLS: one certificate is one client, whatever its address.
    certified = nnrp.PeerCredentials(address="10.0.0.3", secure=True, certificate=b"c" * 32)
    for address in ("10.0.0.3", "10.0.0.4"):
        conn = connection(sessions, peer=attrs.evolve(certified, address=address))
        assert of(conn.receive_data(pk(RESUMABLE)), nnrp.SessionOpened)[0].resumable
    conn = connection(sessions, peer=certified)
    assert not of(conn.receive_data(pk(RESUMABLE)), nnrp.SessionOpened)[0].resumable


def test_a_clients_journals_share_its_byte_bound() -> None:
    """Finding 6: held bytes are capped per client too (``client_bytes``)."""
    sessions = book(client_bytes=4096, session_bytes=1 << 20, total_bytes=1 << 30)
    first, _ = opened(sessions)
    second, _ = opened(sessions)
    for session_id, conn in ((1, first), (2, second)):
        conn.receive_data(submit(7001, 1, session_id=session_id))
    journals = [conn.session(session_id) for session_id, conn in ((1, first), (2, second))]
    assert journals[0] is not None and journals[1] is not None
    first_journal, second_journal = journals[0].journal, journals[1].journal
    assert first_journal is not None and second_journal is not None
    assert first_journal.budgets[0] is second_journal.budgets[0]  # one client, one bound
    for _ in range(100):
        first.send_partial(1, 7001, b"x" * 64)
    assert first_journal.budgets[0].held <= 4096  # attached: trimmed within it
    cut(first)
    for _ in range(100):
        first_journal_session = journals[0]
        first_journal_session.send_partial(7001, b"y" * 64)
    assert second_journal.over_budget()  # the other session of the client must wait


# --------------------------------------------------------------------------- resume (R3-R7)


def test_a_resume_rotates_the_token_keeps_the_id_and_awaits_the_resubmission() -> None:
    sessions = book()
    first, token = opened(sessions)
    streamed(first)
    session = first.session(1)
    assert cut(first).detached == (1,)
    second = connection(sessions)
    events = second.receive_data(resume(token))
    (ack,) = replies(events)
    assert (ack.session_id, ack.message.status) == (1, nnrp.SessionOpenStatus.RESUMED)
    assert ack.message.session_flags_ack == 1 and ack.message.resume_token_bytes == 24
    assert ack.body != token
    assert of(events, nnrp.SessionResumed)[0].session_id == 1
    assert second.session(1) is session
    assert session is not None and session.awaiting == {7001: 1}


def test_a_lost_resume_answer_does_not_lose_the_session() -> None:
    """Finding 3: the token rotated before the client had the new one; if the ACK was
    lost with its connection, the retry with the token the client holds was rejected and
    vLLM generated for nobody. Now the token the client used stays good (R4): the older
    of the two lets go only ``confirm_grace`` after the client shows, by a packet for the
    session on the resumed connection, that the newest arrived."""
    clock = Clock()
    sessions = book(clock, confirm_grace=10.0)
    first, token = opened(sessions)
    streamed(first)
    cut(first)
    second, lost = resumed(sessions, token)  # the answer never reaches the client
    cut(second)
    third, newer = resumed(sessions, token)  # the client retries with what it holds
    assert newer not in (token, lost)
    cut(third)
    # The token whose answer was lost is gone with it (never confirmed, replaced).
    (refused,) = replies(connection(sessions).receive_data(resume(lost)))
    assert refused.message.status == nnrp.SessionOpenStatus.REJECTED
    # The newest works; once the client sends anything for the session after it, the
    # older ones go when the grace has passed (a pipelining client's packet may have gone
    # before the ACK reached it: within the grace, the old token still opens).
    fourth, _ = resumed(sessions, newer)
    fourth.receive_data(submit(7001, 1))  # a packet for the session: confirms
    cut(fourth)
    clock.now += 9.9
    fifth, _ = resumed(sessions, newer)  # still within the grace
    fifth.receive_data(pk(nnrp.Ping()))
    cut(fifth)
    clock.now += 10.0
    for spent in (token, newer):
        (refused,) = replies(connection(sessions).receive_data(resume(spent)))
        assert refused.message.status == nnrp.SessionOpenStatus.REJECTED


def test_a_pipelined_packet_never_makes_a_lost_answer_fatal() -> None:
    """The client sends its resubmission (or a PING) right behind its resume, before the
    ACK reaches it, then loses the connection: the token it holds still resumes."""
    for follow in (submit(7001, 1), pk(nnrp.Ping())):
        clock = Clock()
        sessions = book(clock)
        first, token = opened(sessions)
        streamed(first)
        cut(first)
        second = connection(sessions)
        second.receive_data(resume(token) + follow)  # one write: pipelined
        cut(second)
        clock.now += 1.0
        resumed(sessions, token)


@pytest.mark.parametrize(("case", "status", "code"), [
    ("wrong token", nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.RESUME_REJECTED),
    ("confirmed away", nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.RESUME_REJECTED),
    ("other identity", nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.RESUME_REJECTED),
    ("no allow_resume flag", nnrp.SessionOpenStatus.REJECTED,
     nnrp.SessionError.RESUME_REJECTED),
    ("no session id", nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.RESUME_REJECTED),
    ("still attached", nnrp.SessionOpenStatus.RETRY_LATER, nnrp.SessionError.RESUME_REJECTED),
])
def test_refused_resumes_are_typed_and_say_nothing_more(
        case: str, status: nnrp.SessionOpenStatus, code: nnrp.SessionError) -> None:
    sessions = book()
    first, token = opened(sessions)
    if case != "still attached":
        cut(first)
    request = resume(token)
    if case == "wrong token":
        request = resume(b"x" * 24)
    elif case == "confirmed away":
        second, _ = resumed(sessions, token)
        second.receive_data(pk(nnrp.Ping()))  # the new token arrived
        cut(second)
        sessions.clock.now += sessions.policy.confirm_grace  # type: ignore[attr-defined]
    elif case == "other identity":
        request = resume(token, auth=b"someone else")
    elif case == "no allow_resume flag":
        request = resume(token, flags=0)
    elif case == "no session id":
        request = resume(token, session_id=0)
    conn = connection(sessions)
    events = conn.receive_data(request)
    (ack,) = replies(events)
    assert ack.session_id == 0
    assert (ack.message.status, ack.message.session_error_code) == (status, code)
    assert ack.message.resume_token_bytes == 0 and ack.message.session_flags_ack == 0
    assert of(events, nnrp.SessionOpenRefused)[0].resume
    if case in ("wrong token", "confirmed away", "other identity"):
        # One answer for every token that opens nothing: no hint whether a session exists.
        assert ack.body == b"resume rejected: no session can be resumed with this token"
    assert conn.session(1) is None


def test_a_refused_resume_never_spends_the_token() -> None:
    """Finding 11: a resume asking another profile was rejected and spent the token; the
    right one was then rejected too and the session orphaned. Now it is refused as
    nnrp-py's server refuses it (profile_unsupported, or schema_unsupported) and the same
    token then resumes (R5). So do a full connection and a live holder."""
    sessions = book()
    first, token = opened(sessions)
    cut(first)
    conn = connection(sessions)
    for fields, code in (({"profile_id": 0, "schema_id": 0, "schema_version": 0},
                          nnrp.SessionError.PROFILE_UNSUPPORTED),
                         ({"profile_id": 2, "schema_id": 0, "schema_version": 0},
                          nnrp.SessionError.SCHEMA_UNSUPPORTED)):
        (ack,) = replies(conn.receive_data(resume(token, **fields)))
        assert (ack.message.status, ack.message.session_error_code) == (
            nnrp.SessionOpenStatus.REJECTED, code)
    full = connection(sessions, max_sessions=1)
    full.receive_data(pk(attrs.evolve(RESUMABLE, session_flags=0)))
    (ack,) = replies(full.receive_data(resume(token)))
    assert ack.message.session_error_code == nnrp.SessionError.LIMIT_REACHED
    (ack,) = replies(conn.receive_data(resume(token)))
    assert ack.message.status == nnrp.SessionOpenStatus.RESUMED


def test_a_session_attached_elsewhere_is_retry_later_and_its_holder_is_probed() -> None:
    """Finding 9: a silent old connection that something still acknowledges held every
    resume at retry_later for as long as it lasted. Now the holder is probed (rule 18):
    a PING, and if nothing arrives within ``probe_timeout`` it is dead (the I/O layer
    closes it), which detaches the session for the next attempt."""
    clock = Clock()
    sessions = book(clock, probe_timeout=2.0)
    holder, token = opened(sessions)
    conn = connection(sessions)
    events = conn.receive_data(resume(token))
    (ack,) = replies(events)
    assert ack.message.status == nnrp.SessionOpenStatus.RETRY_LATER
    (probed,) = of(events, nnrp.HolderProbed)
    assert (probed.holder, probed.timeout) == (holder, 2.0)
    assert nnrp.Decoder().feed(probed.ping)[0].msg_type is nnrp.MsgType.PING
    # Another attempt meanwhile probes nothing more.
    assert not of(connection(sessions).receive_data(resume(token)), nnrp.HolderProbed)
    clock.now += 2.0
    assert holder.probe_failed()  # nothing came: dead
    assert cut(holder).detached == (1,)
    (ack,) = replies(conn.receive_data(resume(token)))
    assert ack.message.status == nnrp.SessionOpenStatus.RESUMED
    assert sessions.stats.probes_total == 1


def test_a_holder_that_answers_the_probe_keeps_its_session() -> None:
    clock = Clock()
    sessions = book(clock)
    holder, token = opened(sessions)
    connection(sessions).receive_data(resume(token))
    clock.now += 0.5
    holder.receive_data(pk(nnrp.Pong()))  # anything at all is an answer
    clock.now += 2.0
    assert not holder.probe_failed()
    assert holder.start_probe() is not None  # a later probe starts afresh


def test_a_tls_session_is_never_continued_in_clear_nor_under_another_certificate() -> None:
    """Finding 7: a session opened under client certificate A was resumed under B, and
    one opened on tcps continued on plain tcp. A token is bound to the certificate and to
    the carrier's security (R3): clear to TLS is fine, TLS to clear is not."""
    sessions = book()
    a = nnrp.PeerCredentials("10.0.0.1", secure=True, certificate=b"A" * 32)
    first, token = opened(sessions, peer=a)
    cut(first)
    for peer in (nnrp.PeerCredentials("10.0.0.1"),  # in clear
                 attrs.evolve(a, certificate=b"B" * 32),  # another certificate
                 attrs.evolve(a, certificate=b"")):  # none
        (ack,) = replies(connection(sessions, peer=peer).receive_data(resume(token)))
        assert ack.message.status == nnrp.SessionOpenStatus.REJECTED, peer
    resumed(sessions, token, peer=attrs.evolve(a, address="10.9.9.9"))  # moved, same cert
    # Clear to TLS is fine (its token went in clear already), with a certificate too; from
    # then on the session is bound to TLS and that certificate (the binding tightens).
    clear_book = book()
    plain, plain_token = opened(clear_book, peer=nnrp.PeerCredentials("10.0.0.2"))
    cut(plain)
    upgraded, upgraded_token = resumed(clear_book, plain_token, peer=a)
    upgraded.receive_data(pk(nnrp.Ping()))
    cut(upgraded)
    for peer in (nnrp.PeerCredentials("10.0.0.2"), attrs.evolve(a, certificate=b"B" * 32)):
        (ack,) = replies(connection(clear_book, peer=peer).receive_data(
            resume(upgraded_token)))
        assert ack.message.status == nnrp.SessionOpenStatus.REJECTED, peer
    resumed(clear_book, upgraded_token, peer=a)


def test_refused_resumes_are_rate_limited_per_connection() -> None:
    """Finding 12: resume guesses were unlimited (about 5,900/s on one connection, a log
    line each). A connection may be refused ``refusal_burst`` times, then one a second;
    past that it is retry_later without a lookup (rule 4e)."""
    clock = Clock()
    sessions = book(clock)
    conn = connection(sessions, refusal_burst=3, refusals_per_second=1.0)
    answers = [replies(conn.receive_data(resume(bytes([n]) * 24)))[0].message.status
               for n in range(5)]
    assert answers == [nnrp.SessionOpenStatus.REJECTED] * 3 + [
        nnrp.SessionOpenStatus.RETRY_LATER] * 2
    assert sessions.stats.refused_total == 3
    clock.now += 1.0
    (ack,) = replies(conn.receive_data(resume(b"z" * 24)))
    assert ack.message.status == nnrp.SessionOpenStatus.REJECTED
    # Accepted resumes cost nothing: a client resuming many sessions is never limited.
    owner = book(clock)
    tokens = []
    for _ in range(4):
        conn, token = opened(owner)
        cut(conn)
        tokens.append((conn, token))
    back = connection(owner, refusal_burst=1)
    for session_id, (_, token) in enumerate(tokens, start=1):
        (ack,) = replies(back.receive_data(resume(token, session_id=session_id)))
        assert ack.message.status == nnrp.SessionOpenStatus.RESUMED


def test_session_ids_are_unique_in_the_process_so_two_connections_resume_on_one() -> None:
    """Finding 12: session ids were per connection, so two sessions from two connections
    could not both be resumed on one new connection. Ids are the process's now, lowest
    free first, as nnrp-py's server numbers them (tests/interop)."""
    sessions = book()
    first, first_token = opened(sessions)
    second, second_token = opened(sessions)
    assert (first.sessions[0].session_id, second.sessions[0].session_id) == (1, 2)
    cut(first)
    cut(second)
    back = connection(sessions)
    for session_id, token in ((1, first_token), (2, second_token)):
        (ack,) = replies(back.receive_data(resume(token, session_id=session_id)))
        assert (ack.message.status, ack.session_id) == (nnrp.SessionOpenStatus.RESUMED,
                                                        session_id)


def test_a_relayed_connection_is_never_handed_off_again() -> None:
    """Finding 1: a connection relayed from the other worker could be relayed again, and
    two made-up tokens bounced one connection between two workers forever. A token of
    another worker hands off only the first session message of a connection that was not
    itself relayed (rule 4d); otherwise it is refused like any other."""
    relays = ("w0.sock", "w1.sock")
    worker0 = book(worker=0, relays=relays)
    fresh = connection(worker0)
    forged = bytes([1]) + b"\x07" * 23  # names worker 1
    (handed,) = of(fresh.receive_data(resume(forged)), nnrp.HandedOff)
    assert handed.destination.worker == 1
    assert fresh.state is nnrp.ConnState.HANDED_OFF
    relayed = connection(worker0, relayed=True)
    events = relayed.receive_data(resume(forged) + resume(bytes([0]) + b"\x07" * 23))
    assert not of(events, nnrp.HandedOff)
    # Worker 1 may hold it: not "gone" (retry_later: resume it first thing elsewhere);
    # worker 0 (this one) holds no such session: rejected.
    assert [ack.message.status for ack in replies(events)] == [
        nnrp.SessionOpenStatus.RETRY_LATER, nnrp.SessionOpenStatus.REJECTED]
    second_message = connection(worker0)
    second_message.receive_data(resume(bytes([0]) + b"\x01" * 23))  # refused here
    events = second_message.receive_data(resume(forged))
    assert not of(events, nnrp.HandedOff)
    assert replies(events)[0].message.status == nnrp.SessionOpenStatus.RETRY_LATER
    assert of(connection(worker0).receive_data(resume(bytes([7]) + b"\x01" * 23)),
              nnrp.SessionOpenRefused)  # no such worker: refused, not relayed


def test_a_connection_that_sent_more_than_is_kept_is_not_handed_off() -> None:
    """Rule 4d: the I/O layer keeps a connection's bytes, to relay them, only while
    ``may_hand_off``; one whose opening went past ``MAX_HAND_OFF_BYTES`` is answered as
    a relayed one is (retry_later), never handed off with nothing to relay."""
    worker0 = book(worker=0, relays=("w0.sock", "w1.sock"))
    forged = bytes([1]) + b"\x07" * 23  # names worker 1
    ping = pk(nnrp.Ping())
    half, over = (ping * (MAX_HAND_OFF_BYTES // len(ping) // 2),
                  ping * (MAX_HAND_OFF_BYTES // len(ping) + 1))
    assert MAX_HAND_OFF_BYTES >= (16 << 10) + READ_SIZE  # a hello, a message, a read
    within = connection(worker0)
    within.receive_data(half)
    assert within.may_hand_off
    (handed,) = of(within.receive_data(resume(forged)), nnrp.HandedOff)
    assert handed.destination.worker == 1 and not within.may_hand_off
    past = connection(worker0)
    past.receive_data(over)
    assert not past.may_hand_off
    events = past.receive_data(resume(forged))
    assert not of(events, nnrp.HandedOff)
    assert replies(events)[0].message.status == nnrp.SessionOpenStatus.RETRY_LATER
    migrating = connection(worker0)
    migrating.receive_data(over)
    events = migrating.receive_data(migrate(forged))
    assert not of(events, nnrp.HandedOff)
    assert of(events, nnrp.SendBytes)  # refused on the wire (rule 4c)


# --------------------------------------------------------------------------- windows


def test_a_detached_session_ends_when_its_window_passes() -> None:
    clock = Clock()
    sessions = book(clock, window=10.0)
    first, token = opened(sessions)
    cut(first)
    assert sessions.next_deadline() == clock.now + 10.0
    clock.now += 9.9
    assert sessions.expire() == []
    clock.now += 0.1
    (expiry,) = sessions.expire()
    assert expiry.kind is nnrp.ExpiryKind.WINDOW and sessions.sessions == 0
    (ack,) = replies(connection(sessions).receive_data(resume(token)))
    assert ack.message.status == nnrp.SessionOpenStatus.REJECTED
    assert 1 not in sessions.ids  # its id is free again


def test_a_second_drop_restarts_the_window_and_cancels_the_resubmissions_one() -> None:
    """Finding 12: the wait-for-resubmission timer of one resume kept running after a
    second drop (a 410 inside the new window). Each drop starts one window (R6)."""
    clock = Clock()
    sessions = book(clock, window=10.0)
    first, token = opened(sessions)
    streamed(first)
    cut(first)
    clock.now += 5
    second, token = resumed(sessions, token)  # its resubmissions' window: until +10
    clock.now += 4
    cut(second)  # a second drop, before any resubmission: a fresh detached window
    clock.now += 2  # past the first resume's resubmission window
    assert sessions.expire() == []
    third, _ = resumed(sessions, token)
    events = third.receive_data(submit(7001, 1, with_position(3)))
    assert of(events, nnrp.OperationResumed)


def test_operations_not_resubmitted_in_their_window_end_unseen() -> None:
    clock = Clock()
    sessions = book(clock, window=10.0)
    first, token = opened(sessions)
    streamed(first)
    cut(first)
    second, _ = resumed(sessions, token)
    clock.now += 10
    (expiry,) = sessions.expire()
    assert (expiry.kind, expiry.abandoned) == (nnrp.ExpiryKind.RESUBMISSIONS, (7001,))
    session = second.session(1)
    assert session is not None and session.awaiting == {}
    assert not session.delivers(7001)  # muted: nothing of it reaches the client
    assert second.send_partial(1, 7001, b"late") is None


def test_during_a_drain_resumes_are_answered_and_windows_end_with_it() -> None:
    """Finding 8 (sans-IO side): resumes of detached sessions are accepted while the
    server drains (R12); new sessions are retry_later; every window ends by the drain's
    end."""
    clock = Clock()
    sessions = book(clock, window=120.0)
    first, token = opened(sessions)
    cut(first)
    sessions.start_draining(clock.now + 30)
    assert sessions.next_deadline() == clock.now + 30
    conn = connection(sessions)
    conn.start_draining()
    (fresh,) = replies(conn.receive_data(pk(RESUMABLE)))
    assert fresh.message.status == nnrp.SessionOpenStatus.RETRY_LATER
    (ack,) = replies(conn.receive_data(resume(token)))
    assert ack.message.status == nnrp.SessionOpenStatus.RESUMED
    assert [r.session.session_id for r in sessions.close()] == []  # it is attached
    assert not sessions.detach(sessions.records[1])  # after the drain, nothing waits


# --------------------------------------------------------------------------- resubmissions


def test_a_resubmission_gets_what_follows_its_position_then_goes_on_live() -> None:
    sessions = book()
    first, token = opened(sessions)
    sent = streamed(first, partials=5)
    cut(first)
    second, _ = resumed(sessions, token)
    session = second.session(1)
    assert session is not None and not session.delivers(7001)
    (resumed_event,) = of(second.receive_data(submit(7001, 1, with_position(3))),
                          nnrp.OperationResumed)
    assert resumed_event.replay == tuple(sent[3:]) and resumed_event.replayed_events == 2
    assert (resumed_event.after, resumed_event.running) == (3, True)
    assert session.delivers(7001)
    packet = second.send_partial(1, 7001, b"p6")
    assert packet is not None
    assert nnrp.Decoder().feed(packet)[0].message.result_sequence == 6


def test_an_identical_resubmission_of_a_long_answer_is_served_from_the_earliest_held() -> None:
    """Finding 10: nnrp-py's client resubmits the request unchanged (no position) and
    takes a continued sequence; after more results than the session bound holds, that
    got 410 and vLLM was aborted. It is served from the earliest result held (J2)."""
    sessions = book(session_bytes=nnrp.RECORD_COST + 600)
    first, token = opened(sessions)
    sent = streamed(first, partials=40)
    cut(first)
    second, _ = resumed(sessions, token)
    (event,) = of(second.receive_data(submit(7001, 1)), nnrp.OperationResumed)
    assert event.after is None and 0 < len(event.replay) < 40
    assert event.replay == tuple(sent[40 - len(event.replay):])  # a suffix: no hole
    assert not of(second.receive_data(b""), nnrp.SubmitRefused)


@pytest.mark.parametrize("position", [-1, "x", 2.5, True])
def test_a_malformed_position_is_a_400_naming_the_field_and_the_operation_waits_on(
        position: Any) -> None:
    """Finding 12: a malformed ``resume_after_sequence`` killed the generation as 409
    resubmission_differs. It is refused naming the field; the operation still waits for
    a resubmission it can serve."""
    sessions = book()
    first, token = opened(sessions)
    streamed(first)
    cut(first)
    second, _ = resumed(sessions, token)
    events = second.receive_data(submit(7001, 1, with_position(position)))
    (refused,) = of(events, nnrp.SubmitRefused)
    assert refused.reason is nnrp.RefusalReason.INVALID_NNRP_POLICY
    assert "nnrp.resume_after_sequence" in refused.message
    assert not of(events, nnrp.OperationAbandoned)
    assert of(second.receive_data(submit(7001, 1, with_position(1))), nnrp.OperationResumed)


def test_a_position_past_the_last_result_is_refused_and_skips_nothing() -> None:
    """Finding 12: a position past what was produced silently skipped events (4-10
    lost). It is refused, naming the last result; the operation waits on."""
    sessions = book()
    first, token = opened(sessions)
    streamed(first, partials=3)
    cut(first)
    second, _ = resumed(sessions, token)
    (refused,) = of(second.receive_data(submit(7001, 1, with_position(10))),
                    nnrp.SubmitRefused)
    assert refused.reason is nnrp.RefusalReason.INVALID_NNRP_POLICY
    assert "(3)" in refused.message
    (event,) = of(second.receive_data(submit(7001, 1, with_position(3))),
                  nnrp.OperationResumed)
    assert event.replay == ()


def test_another_request_or_a_gap_is_refused_and_the_operation_abandoned() -> None:
    sessions = book(session_bytes=nnrp.RECORD_COST + 600)
    first, token = opened(sessions)
    streamed(first, 7001, 1, partials=40)
    streamed(first, 7002, 2, partials=1)
    cut(first)
    second, _ = resumed(sessions, token)
    other = json.dumps({"schema_version": 1, "operation": "chat.completions.create",
                        "body": {"model": "other", "messages": []}}).encode()
    events = second.receive_data(submit(7002, 2, other))
    assert of(events, nnrp.SubmitRefused)[0].reason is nnrp.RefusalReason.RESUBMISSION_DIFFERS
    assert of(events, nnrp.OperationAbandoned)[0].operation_id == 7002
    events = second.receive_data(submit(7001, 1, with_position(1)))  # trimmed long ago
    assert of(events, nnrp.SubmitRefused)[0].reason is nnrp.RefusalReason.RESULTS_UNAVAILABLE
    assert of(events, nnrp.OperationAbandoned)[0].operation_id == 7001


def test_a_cancel_of_an_operation_awaiting_its_resubmission_gets_its_terminal() -> None:
    """Finding 12: a CANCEL of a resumed-but-not-resubmitted operation got no terminal,
    and a later resubmission replayed partials after the cancel. The cancel ends its
    wait: a running one is cancelled and its drop goes out; an ended one's terminal goes
    out again; a later resubmission reuses an ended frame: ERROR_RECOVERABLE, no second
    terminal and no replay."""
    sessions = book()
    first, token = opened(sessions)
    streamed(first, 7001, 1)
    streamed(first, 7002, 2, end=True)
    cut(first)
    second, _ = resumed(sessions, token)
    cancel = pk(nnrp.Cancel(operation_id=7001, control_sequence=1), session_id=1)
    (cancelled,) = of(second.receive_data(cancel), nnrp.OperationCancelled)
    assert cancelled.operation_id == 7001
    drop = second.send_drop(1, 7001, nnrp.DropReason.PEER_CANCELLED, b"")
    assert drop  # it reaches the client now
    events = second.receive_data(pk(nnrp.Cancel(operation_id=7002, control_sequence=1),
                                    session_id=1))
    (terminal,) = [p for p in replies(events)]
    assert terminal.msg_type is nnrp.MsgType.RESULT_PUSH
    for operation_id, frame_id in ((7001, 1), (7002, 2)):
        events = second.receive_data(submit(operation_id, frame_id))
        assert not of(events, nnrp.SubmitRefused) and not of(events, nnrp.OperationResumed)
        assert [p.msg_type for p in replies(events)] == [nnrp.MsgType.ERROR_RECOVERABLE]


def test_no_request_body_is_kept_once_its_operation_ends() -> None:
    """Finding 2 (sans-IO side): request bodies were kept for every operation of a
    resumable session, outside every bound. Only a 32-byte key is."""
    sessions = book()
    conn, _ = opened(sessions)
    big = json.dumps({"schema_version": 1, "operation": "chat.completions.create",
                      "body": {"model": "m", "messages": [{"role": "user",
                                                            "content": "x" * 100_000}]}
                      }).encode()
    conn.receive_data(submit(1, 1, big))
    conn.send_result(1, 1, 200, b"ok")
    session = conn.session(1)
    assert session is not None and session.journal is not None
    record = session.journal.records[1]
    assert not hasattr(record, "request") and len(record.key) < 64
    assert session.journal.held < 2048


def keyed(conn: nnrp.ServerConnection, events: list[Any]) -> list[Any]:
    """What the I/O layer does with each ``RequestKeyWanted`` (rule 5c), here on this
    thread: the events that came before it, and those after its key came back."""
    assert of(events, nnrp.RequestKeyWanted)
    handled: list[Any] = []
    while events and isinstance(wanted := events[-1], nnrp.RequestKeyWanted):
        handled += events[:-1]
        events = conn.request_keyed(conn.config.resubmission.read(wanted.body))
    return handled + events


BIG = json.dumps({"schema_version": 1, "operation": "chat.completions.create",
                  "body": {"model": "m", "messages": [{"role": "user", "content": [
                      {"type": "text", "text": "x" * 2000}]}], "stream": True}}).encode()


def test_a_big_submit_is_held_with_what_follows_until_its_key_comes_back() -> None:
    """Rule 5c: the key of a big request is computed off the event loop; nothing the
    client sent after it is handled before it, and then all of it is, in order."""
    sessions = book()
    conn, _ = opened(sessions, key_off_loop_bytes=1000)
    events = conn.receive_data(submit(1, 1, BIG) + pk(nnrp.Ping()) + submit(2, 2))
    assert [type(event) for event in events] == [nnrp.RequestKeyWanted]
    assert not replies(conn.receive_data(pk(nnrp.Ping())))  # still behind it
    events = keyed(conn, events)
    assert [e.operation_id for e in of(events, nnrp.OperationSubmitted)] == [1, 2]
    assert [p.msg_type for p in replies(events)].count(nnrp.MsgType.PONG) == 2
    session = conn.session(1)
    assert session is not None and session.journal is not None
    assert session.journal.records[1].key == conn.config.resubmission.read(
        nnrp.parse_typed_body(nnrp.pack_single_frame(BIG), payload_kind_bitmap=0x10,
                              payload_frame_count=1)).key
    with pytest.raises(nnrp.LocalProtocolError, match="no request key"):
        conn.request_keyed(nnrp.ResubmissionRead(b"k"))


def test_a_session_that_is_not_resumable_keys_nothing() -> None:
    conn = connection(book(), key_off_loop_bytes=1000)
    conn.receive_data(pk(attrs.evolve(RESUMABLE, session_flags=0)))
    assert of(conn.receive_data(submit(1, 1, BIG)), nnrp.OperationSubmitted)


def test_a_big_resubmission_is_compared_by_the_key_computed_off_the_loop() -> None:
    """Rule 5c with 5b: the same request (with its position) is replayed; one character
    changed is another request (409), the same as a small one."""
    sessions = book()
    first, token = opened(sessions, key_off_loop_bytes=1000)
    keyed(first, first.receive_data(submit(7001, 1, BIG) + submit(7002, 2, BIG)))
    for operation_id in (7001, 7002):
        first.send_partial(1, operation_id, b"p1")
        first.send_partial(1, operation_id, b"p2")
    cut(first)
    second, _ = resumed(sessions, token, key_off_loop_bytes=1000)
    events = keyed(second, second.receive_data(submit(7001, 1, with_position(1, BIG))))
    (event,) = of(events, nnrp.OperationResumed)
    assert (event.after, len(event.replay)) == (1, 1)
    other = BIG.replace(b"xxx", b"xyx", 1)
    events = keyed(second, second.receive_data(submit(7002, 2, other)))
    assert of(events, nnrp.SubmitRefused)[0].reason is nnrp.RefusalReason.RESUBMISSION_DIFFERS


def test_a_key_is_its_submits_alone_even_when_that_submit_is_refused_before_reading_it(
        ) -> None:
    """A review found it: a big submit refused once its key came (a drain begun while the
    key was computed) left the key to the next submit held behind it, here a small
    resubmission, refused 409 and abandoned with it, its results lost."""
    sessions = book()
    first, token = opened(sessions, key_off_loop_bytes=1000)
    first.receive_data(submit(7002, 2))
    first.send_partial(1, 7002, b"p1")
    cut(first)
    second, _ = resumed(sessions, token, key_off_loop_bytes=1000)
    events = second.receive_data(submit(3, 3, BIG) + submit(7002, 2))
    assert [type(event) for event in events] == [nnrp.RequestKeyWanted]
    second.start_draining()  # SIGTERM while a worker thread computes the key
    events = keyed(second, events)
    assert [(r.operation_id, r.reason) for r in of(events, nnrp.SubmitRefused)] == [
        (3, nnrp.RefusalReason.DRAINING)]
    (resumed_event,) = of(events, nnrp.OperationResumed)
    assert resumed_event.operation_id == 7002


def test_a_connection_lost_while_a_key_is_computed_handles_nothing_more() -> None:
    sessions = book()
    conn, _ = opened(sessions, key_off_loop_bytes=1000)
    events = conn.receive_data(submit(1, 1, BIG))
    cut(conn)
    assert keyed(conn, events) == []


# --------------------------------------------------------------------------- migrate (R9)


def test_a_migration_moves_the_session_rotates_the_token_and_tells_the_old_holder() -> None:
    """Finding 12: SESSION_MIGRATE of a live session told the old connection nothing and
    did not rotate the token, so whoever saw it could take the session again and again."""
    sessions = book()
    first, token = opened(sessions)
    streamed(first, 7001, 4)
    first.receive_data(submit(7002, 5))
    session = first.session(1)
    second = connection(sessions)
    events = second.receive_data(migrate(token, last=4))
    (ack,) = replies(events)
    assert ack.session_id == 1
    assert ack.message.accept_code == nnrp.MigrateAccept.ACCEPTED
    assert ack.message.resume_from_frame_id == 6  # >= last_result_frame_id, past frame 5
    assert len(ack.body) == 24 and ack.body != token  # the next token
    (taken,) = of(events, nnrp.SessionTaken)
    assert taken.previous is first
    notice = nnrp.Decoder().feed(taken.notice)[0]
    assert notice.message.related_session_id == 1 and not notice.message.is_fatal
    (moved,) = of(events, nnrp.SessionMigrated)
    assert (moved.last_result_frame_id, moved.resume_from_frame_id) == (4, 6)
    assert second.session(1) is session and first.session(1) is None
    second.receive_data(pk(nnrp.Ping()))  # confirms the new token
    sessions.clock.now += sessions.policy.confirm_grace  # type: ignore[attr-defined]
    (again,) = replies(connection(sessions, transport=nnrp.TransportId.QUIC).receive_data(
        migrate(token, old=nnrp.TransportId.TCP, new=nnrp.TransportId.QUIC)))
    assert again.message.accept_code == nnrp.MigrateAccept.REFUSED  # spent


def test_a_migration_replays_what_is_held_and_ends_any_wait_for_resubmissions() -> None:
    sessions = book()
    first, token = opened(sessions)
    sent = streamed(first, 7001, 1, partials=3)
    cut(first)
    _second, token = resumed(sessions, token)  # 7001 awaits its resubmission
    third = connection(sessions, transport=nnrp.TransportId.QUIC)
    events = third.receive_data(migrate(token, old=nnrp.TransportId.TCP,
                                        new=nnrp.TransportId.QUIC))
    (moved,) = of(events, nnrp.SessionMigrated)
    assert moved.replay == tuple(sent) and moved.replayed_events == 3
    session = third.session(1)
    assert session is not None and session.delivers(7001) and session.awaiting == {}


def test_a_migration_between_two_connections_of_one_kind_is_a_move() -> None:
    """A client that reconnected over the same transport (tcp to tcp) takes its session
    with SESSION_MIGRATE when a resume answers retry_later; only a migration of nothing
    is "the same transport" (nnrp-py's server implements no migration at all)."""
    sessions = book()
    _first, token = opened(sessions)
    second = connection(sessions)
    (ack,) = replies(second.receive_data(migrate(token, old=nnrp.TransportId.TCP)))
    assert ack.message.accept_code == nnrp.MigrateAccept.ACCEPTED


@pytest.mark.parametrize(("case", "code"), [
    ("wrong token", nnrp.MigrateAccept.REFUSED),
    ("no token", nnrp.MigrateAccept.SAME_TRANSPORT),
    ("no token, transports differ", nnrp.MigrateAccept.REFUSED),
    ("other transport", nnrp.MigrateAccept.TRANSPORT_MISMATCH),
])
def test_a_refused_migration_moves_nothing(case: str, code: nnrp.MigrateAccept) -> None:
    sessions = book()
    first, token = opened(sessions)
    second = connection(sessions)
    request = {"wrong token": migrate(b"y" * 24),
               "no token": migrate(b"", old=nnrp.TransportId.TCP),
               "no token, transports differ": migrate(b""),
               "other transport": migrate(token, old=nnrp.TransportId.IPC,
                                          new=nnrp.TransportId.QUIC)}[case]
    events = second.receive_data(request)
    (ack,) = replies(events)
    assert ack.message.accept_code == code
    assert not of(events, nnrp.SessionMigrated)
    assert second.session(1) is None and first.session(1) is not None


def test_a_migration_on_the_sessions_own_connection_is_acknowledged_in_place() -> None:
    sessions = book()
    conn, _token = opened(sessions)
    conn.receive_data(submit(7001, 3))
    events = conn.receive_data(migrate(b"", last=2))
    (ack,) = replies(events)
    assert (ack.message.accept_code, ack.message.resume_from_frame_id, ack.body) == (0, 4, b"")
    assert not of(events, nnrp.SessionMigrated)


def test_a_migration_must_come_from_the_sessions_own_credentials() -> None:
    """SESSION_MIGRATE carries no credentials of its own: with session auth on, the
    connection must have opened a session with the credentials the moving one was
    opened with; a leaked token alone moves nothing."""
    sessions = book()

    def authenticated(key: bytes) -> nnrp.ServerConnection:
        conn = connection(sessions,
                          authenticate=lambda auth: auth in (b"alice", b"mallory"))
        if key:
            conn.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=len(key)), body=key))
        return conn

    victim = authenticated(b"")
    (ack,) = replies(victim.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=5),
                                            body=b"alice")))
    token = ack.body
    for thief in (authenticated(b""), authenticated(b"mallory")):
        (refused,) = replies(thief.receive_data(migrate(token, session_id=ack.session_id)))
        assert refused.message.accept_code == nnrp.MigrateAccept.REFUSED
    owner = authenticated(b"alice")
    (accepted,) = replies(owner.receive_data(migrate(token, session_id=ack.session_id)))
    assert accepted.message.accept_code == nnrp.MigrateAccept.ACCEPTED


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_tokens_and_migrations_keep_the_contract(data: bytes) -> None:
    """tests/support/resume.py ``exercise``: the fuzzer's ``resume`` target, in CI."""
    exercise(data)


def test_what_the_book_keeps_is_bounded_by_the_sessions_not_by_how_often_they_move() -> None:
    """A client that cuts and resumes one session over and over, or opens and closes one
    requested id over and over, leaves nothing growing behind it. (An earlier session's
    deadline sits at the heap's top, so stale entries below it would never leave alone;
    ids taken up front put 5 under the high mark, so a release pushes it each time.)"""
    clock = Clock()
    sessions = book(clock, window=100.0)
    early, _ = opened(sessions)
    cut(early)
    clock.now += 1
    conn, token = opened(sessions)
    for _ in range(2000):
        cut(conn)
        conn, token = resumed(sessions, token, 2)
        conn.receive_data(pk(nnrp.Ping()))
    assert len(sessions._deadlines) <= 4 * sessions.sessions + 64
    ids = nnrp.SessionIds()
    assert [ids.take() for _ in range(10)] == list(range(1, 11))
    for _ in range(2000):
        ids.release(5)
        assert ids.take(5) == 5
    assert len(ids._free) <= 1


def test_one_clients_detached_sessions_do_not_take_the_others_results_away() -> None:
    """Review of issue 34: when one client's detached sessions filled the process's
    bound, every attached session of every client trimmed its journal to nothing on
    every packet (and a resubmission declaring its position got 410). A session keeps its
    floor (its share of the process's bound) whatever the shared bounds say."""
    policy = {"total_bytes": 200_000, "max_sessions": 4, "session_bytes": 1 << 20,
              "client_bytes": 1 << 20}
    sessions = book(**policy)
    hog = nnrp.PeerCredentials("10.0.0.66")
    for _ in range(2):  # the hog's sessions stream while detached, to the process bound
        conn, _ = opened(sessions, peer=hog)
        (server_session,) = conn.sessions
        conn.receive_data(submit(1, 1, session_id=server_session.session_id))
        cut(conn)
        while server_session.journal is not None and not server_session.journal.over_budget():
            server_session.send_partial(1, b"h" * 200)
    assert sessions.total.over
    victim, token = opened(sessions, peer=nnrp.PeerCredentials("10.0.0.7"))
    (mine,) = victim.sessions
    victim.receive_data(submit(7001, 1, session_id=mine.session_id))
    for n in range(1, 41):
        victim.send_partial(mine.session_id, 7001, b"v%d" % n)
    journal = mine.journal
    assert journal is not None and journal.floor >= 50_000
    assert journal.records[7001].dropped_through == 0  # nothing of it trimmed
    cut(victim)
    back = connection(sessions)
    (ack,) = replies(back.receive_data(resume(token, mine.session_id)))
    assert ack.message.status == nnrp.SessionOpenStatus.RESUMED
    events = back.receive_data(submit(7001, 1, with_position(5), session_id=mine.session_id))
    assert of(events, nnrp.OperationResumed)[0].replayed_events == 35


def test_bad_credentials_are_rate_limited_like_tokens_that_open_nothing() -> None:
    """Review of issue 34: with session auth on, a wrong auth token was answered (and
    logged) every time. It spends the connection's allowance as a refused resume does;
    past it, nothing is looked at. A connection that opens sessions fine never runs out."""
    clock = Clock()
    sessions = book(clock)
    conn = connection(sessions, authenticate=lambda auth: auth == b"key", refusal_burst=3)
    codes = []
    for _ in range(5):
        events = conn.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=5), body=b"guess"))
        (ack,) = replies(events)
        codes.append((ack.message.status, ack.message.session_error_code,
                      of(events, nnrp.SessionOpenRefused)[0].rate_limited))
    assert codes == [(nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.AUTH_FAILED,
                      False)] * 3 + [(nnrp.SessionOpenStatus.RETRY_LATER,
                                      nnrp.SessionError.LIMIT_REACHED, True)] * 2
    honest = connection(sessions, authenticate=lambda auth: auth == b"key", refusal_burst=1)
    for _ in range(10):
        (ack,) = replies(honest.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=3),
                                                body=b"key")))
        assert ack.message.status == nnrp.SessionOpenStatus.OPENED
