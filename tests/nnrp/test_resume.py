"""Resume and migration in the sans-IO server (gateway/nnrp/_server.py rule 4, and rule 5
of _server_session.py), with a store the test holds: what goes on the wire for each
answer, and when a submit is a resubmission."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from tests.support.resume import Store, exercise
from tests.support.wire import of, pk, replies, submit

HELLO = nnrp.ClientHello(profile_bitmap=0b11)
RESUMABLE = nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3,
                             max_in_flight=4, session_flags=nnrp.SessionFlag.ALLOW_RESUME)
TOKEN = b"t" * 24


def connection(store: Store, **config: Any) -> nnrp.ServerConnection:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(**config), store=store,
                                 transport_id=nnrp.TransportId.TCP)
    conn.receive_data(pk(HELLO))
    return conn


def opened(store: Store) -> tuple[nnrp.ServerConnection, bytes]:
    conn = connection(store)
    events = conn.receive_data(pk(RESUMABLE))
    (ack,) = replies(events)
    assert of(events, nnrp.SessionOpened)[0].resumable
    return conn, ack.body


def cut(store: Store, conn: nnrp.ServerConnection, session_id: int = 1
        ) -> nnrp.ServerSession:
    """The connection ends: the session detaches."""
    session = conn.detach(session_id)
    assert session is not None
    store.attached.discard(id(session))
    return session


def resume(token: bytes, session_id: int = 1, *, auth: bytes = b"",
           flags: int = nnrp.SessionFlag.ALLOW_RESUME) -> bytes:
    return pk(attrs.evolve(RESUMABLE, requested_session_id=session_id, session_flags=flags,
                           resume_token_bytes=len(token), auth_bytes=len(auth)),
              body=token + auth)


def test_an_open_that_asks_for_resume_gets_a_token_and_the_window() -> None:
    store = Store()
    conn = connection(store)
    (ack,) = replies(conn.receive_data(pk(RESUMABLE)))
    message = ack.message
    assert (message.status, message.session_flags_ack) == (nnrp.SessionOpenStatus.OPENED, 1)
    assert (message.resume_window_ms, message.resume_token_bytes) == (120_000, 24)
    assert ack.body == bytes([1]) * 24 and ack.session_id == 1


@pytest.mark.parametrize("why", ["not asked", "not granted", "no store"])
def test_without_a_grant_the_session_opens_without_resume(why: str) -> None:
    store = Store(granting=why != "not granted")
    conn = (nnrp.ServerConnection() if why == "no store" else connection(store))
    if why == "no store":
        conn.receive_data(pk(HELLO))
    request = attrs.evolve(RESUMABLE, session_flags=0) if why == "not asked" else RESUMABLE
    events = conn.receive_data(pk(request))
    (ack,) = replies(events)
    assert ack.message.status == nnrp.SessionOpenStatus.OPENED
    assert (ack.message.session_flags_ack, ack.message.resume_window_ms,
            ack.message.resume_token_bytes, ack.body) == (0, 0, 0, b"")
    assert not of(events, nnrp.SessionOpened)[0].resumable


def test_a_resume_on_a_new_connection_rotates_the_token_and_keeps_the_id() -> None:
    store = Store()
    first, token = opened(store)
    first.receive_data(submit(1, 7001, 1))
    session = cut(store, first)
    second = connection(store)
    events = second.receive_data(resume(token))
    (ack,) = replies(events)
    assert (ack.session_id, ack.message.status) == (1, nnrp.SessionOpenStatus.RESUMED)
    assert ack.message.session_flags_ack == 1 and ack.message.resume_token_bytes == 24
    assert ack.body != token  # rotated: the old token is spent
    assert of(events, nnrp.SessionResumed)[0].session_id == 1
    assert second.session(1) is session
    assert session.awaiting == {7001: 1}  # its results wait for the resubmission


def test_a_resubmission_on_its_frame_is_not_a_duplicate_on_another_it_is() -> None:
    store = Store()
    first, token = opened(store)
    first.receive_data(submit(1, 7001, 1) + submit(1, 7002, 2))
    cut(store, first)
    second = connection(store)
    second.receive_data(resume(token))
    events = second.receive_data(submit(1, 7001, 1, b'{"a":1}'))
    (resubmitted,) = of(events, nnrp.OperationResubmitted)
    assert (resubmitted.operation_id, resubmitted.frame_id) == (7001, 1)
    assert resubmitted.typed_body.frames[0].payload == b'{"a":1}'
    assert not of(events, nnrp.OperationSubmitted)
    # Once is enough: again, its frame is a reused one (refused to the session, rule 5).
    again = second.receive_data(submit(1, 7001, 1))
    assert not of(again, nnrp.OperationResubmitted) and not of(again, nnrp.SubmitRefused)
    assert replies(again)[0].msg_type is nnrp.MsgType.ERROR_RECOVERABLE
    (other,) = of(second.receive_data(submit(1, 7002, 9)), nnrp.SubmitRefused)
    assert "resubmit it on its frame 2" in other.message
    # A new operation on a new frame is an ordinary submit.
    assert of(second.receive_data(submit(1, 7003, 3)), nnrp.OperationSubmitted)


def test_released_results_are_not_awaited() -> None:
    store = Store()
    first, token = opened(store)
    first.receive_data(submit(1, 7001, 1))
    session = cut(store, first)
    session.release_results(7001)
    second = connection(store)
    second.receive_data(resume(token))
    assert session.awaiting == {}
    # Answered on its frame (the client waits for a terminal there), not as a duplicate.
    (refused,) = of(second.receive_data(submit(1, 7001, 1)), nnrp.SubmitRefused)
    assert refused.reason is nnrp.RefusalReason.RESULTS_UNAVAILABLE
    assert refused.frame_id == 1


@pytest.mark.parametrize(("case", "status"), [
    ("wrong token", nnrp.SessionOpenStatus.REJECTED),
    ("used token", nnrp.SessionOpenStatus.REJECTED),
    ("other identity", nnrp.SessionOpenStatus.REJECTED),
    ("no allow_resume flag", nnrp.SessionOpenStatus.REJECTED),
    ("no session id", nnrp.SessionOpenStatus.REJECTED),
    ("still attached", nnrp.SessionOpenStatus.RETRY_LATER),
    ("draining", nnrp.SessionOpenStatus.RETRY_LATER),
])
def test_refused_resumes_are_typed_and_say_nothing_more(case: str,
                                                        status: nnrp.SessionOpenStatus) -> None:
    store = Store()
    first, token = opened(store)
    if case != "still attached":
        cut(store, first)
    second = connection(store)
    request = resume(token)
    if case == "wrong token":
        request = resume(b"x" * 24)
    elif case == "used token":
        second.receive_data(resume(token))
        third_session = cut(store, second)
        assert third_session.session_id == 1
        second = connection(store)
    elif case == "other identity":
        request = resume(token, auth=b"someone else")
    elif case == "no allow_resume flag":
        request = resume(token, flags=0)
    elif case == "no session id":
        request = resume(token, session_id=0)
    elif case == "draining":
        second.start_draining()
    events = second.receive_data(request)
    (ack,) = replies(events)
    assert ack.session_id == 0
    assert ack.message.status == status
    assert ack.message.session_error_code == nnrp.SessionError.RESUME_REJECTED
    assert ack.message.resume_token_bytes == 0 and ack.message.session_flags_ack == 0
    assert of(events, nnrp.SessionOpenRefused)
    if case in ("wrong token", "used token", "other identity"):
        # One answer for every token that opens nothing: no hint whether a session exists.
        assert ack.body == b"resume rejected: no session can be resumed with this token"
    assert second.session(1) is None


def test_a_session_id_already_open_here_cannot_be_resumed_here() -> None:
    store = Store()
    first, token = opened(store)
    cut(store, first)
    second = connection(store)
    second.receive_data(pk(RESUMABLE))  # takes id 1 on this connection
    (ack,) = replies(second.receive_data(resume(token)))
    assert ack.message.status == nnrp.SessionOpenStatus.REJECTED


def test_a_resume_is_authenticated_like_an_open() -> None:
    store = Store()
    conn = nnrp.ServerConnection(nnrp.ServerConfig(authenticate=lambda auth: auth == b"key"),
                                 store=store)
    conn.receive_data(pk(HELLO))
    (ack,) = replies(conn.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=3), body=b"key")))
    token = ack.body
    cut(store, conn)
    second = nnrp.ServerConnection(nnrp.ServerConfig(authenticate=lambda auth: auth == b"key"),
                                   store=store)
    second.receive_data(pk(HELLO))
    (refused,) = replies(second.receive_data(resume(token, auth=b"bad")))
    assert refused.message.session_error_code == nnrp.SessionError.AUTH_FAILED
    (resumed,) = replies(second.receive_data(resume(token, auth=b"key")))
    assert resumed.message.status == nnrp.SessionOpenStatus.RESUMED


# --------------------------------------------------------------------------- migrate


def migrate(token: bytes, *, old: int = nnrp.TransportId.QUIC,
            new: int = nnrp.TransportId.TCP, last: int = 0, session_id: int = 1) -> bytes:
    return pk(nnrp.SessionMigrate(old_transport_id=old, new_transport_id=new,
                                  last_result_frame_id=last), session_id=session_id,
              body=token)


def test_a_migration_moves_the_session_here_with_a_cursor_past_every_frame() -> None:
    store = Store()
    first, token = opened(store)
    first.receive_data(submit(1, 7001, 4) + submit(1, 7002, 5))
    session = first.detach(1)
    second = connection(store)
    events = second.receive_data(migrate(token, last=4))
    (ack,) = replies(events)
    assert ack.session_id == 1
    assert ack.message.accept_code == nnrp.MigrateAccept.ACCEPTED
    assert ack.message.resume_from_frame_id == 6  # >= last_result_frame_id, past frame 5
    (moved,) = of(events, nnrp.SessionMigrated)
    assert (moved.last_result_frame_id, moved.resume_from_frame_id) == (4, 6)
    assert second.session(1) is session
    assert session.awaiting == {}  # the client keeps its session: nothing to resubmit
    assert of(second.receive_data(submit(1, 7003, 6)), nnrp.OperationSubmitted)


@pytest.mark.parametrize(("case", "code"), [
    ("wrong token", nnrp.MigrateAccept.REFUSED),
    ("no token", nnrp.MigrateAccept.REFUSED),
    ("same transport", nnrp.MigrateAccept.SAME_TRANSPORT),
    ("other transport", nnrp.MigrateAccept.TRANSPORT_MISMATCH),
    ("draining", nnrp.MigrateAccept.DRAINING),
])
def test_a_refused_migration_moves_nothing(case: str, code: nnrp.MigrateAccept) -> None:
    store = Store()
    first, token = opened(store)
    second = connection(store)
    request = {"wrong token": migrate(b"y" * 24), "no token": migrate(b""),
               "same transport": migrate(token, old=nnrp.TransportId.TCP),
               "other transport": migrate(token, old=nnrp.TransportId.IPC,
                                          new=nnrp.TransportId.QUIC),
               "draining": migrate(token)}[case]
    if case == "draining":
        second.start_draining()
    events = second.receive_data(request)
    (ack,) = replies(events)
    assert ack.message.accept_code == code
    assert not of(events, nnrp.SessionMigrated)
    assert second.session(1) is None and first.session(1) is not None


def test_a_migration_on_the_sessions_own_connection_is_acknowledged_in_place() -> None:
    store = Store()
    conn, _token = opened(store)
    conn.receive_data(submit(1, 7001, 3))
    events = conn.receive_data(migrate(b"", last=2))
    (ack,) = replies(events)
    assert (ack.message.accept_code, ack.message.resume_from_frame_id) == (0, 4)
    assert not of(events, nnrp.SessionMigrated)


def test_a_migration_cannot_land_on_an_id_this_connection_already_uses() -> None:
    """A token on SESSION_MIGRATE names a session of another connection; one of this
    connection's own sessions has the id: the token cannot take it over."""
    store = Store()
    first, token = opened(store)
    second, _own = opened(store)
    own = second.session(1)
    (ack,) = replies(second.receive_data(migrate(token)))
    assert ack.message.accept_code == nnrp.MigrateAccept.REFUSED
    assert second.session(1) is own and first.session(1) is not None


def test_a_migration_must_come_from_the_sessions_own_credentials() -> None:
    """SESSION_MIGRATE carries no credentials of its own: with session auth on, the
    connection must have opened a session with the credentials the moving one was
    opened with; a leaked token alone moves nothing."""
    store = Store()

    def authenticated(key: bytes) -> nnrp.ServerConnection:
        conn = nnrp.ServerConnection(
            nnrp.ServerConfig(authenticate=lambda auth: auth in (b"alice", b"mallory")),
            store=store, transport_id=nnrp.TransportId.TCP)
        conn.receive_data(pk(HELLO))
        if key:
            conn.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=len(key),
                                              requested_session_id=9), body=key))
        return conn

    victim = authenticated(b"")
    (ack,) = replies(victim.receive_data(pk(attrs.evolve(RESUMABLE, auth_bytes=5),
                                            body=b"alice")))
    token = ack.body
    for thief in (authenticated(b""), authenticated(b"mallory")):
        (refused,) = replies(thief.receive_data(migrate(token)))
        assert refused.message.accept_code == nnrp.MigrateAccept.REFUSED
    owner = authenticated(b"alice")
    (accepted,) = replies(owner.receive_data(migrate(token)))
    assert accepted.message.accept_code == nnrp.MigrateAccept.ACCEPTED


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_tokens_and_migrations_keep_the_contract(data: bytes) -> None:
    """tests/support/resume.py ``exercise``: the fuzzer's ``resume`` target, in CI."""
    exercise(data)
