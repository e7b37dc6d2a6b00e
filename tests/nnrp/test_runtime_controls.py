"""The server's rule for every client-sent frame (gateway/nnrp/_server.py, rules 2-16), as
pure data: bytes in, events and reply frames out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from gateway.nnrp._server import _RULES
from tests.support.controls import OPEN, Clock, connected, submit
from tests.support.strategies import ALL_CLASSES, packets
from tests.support.tiers import examples
from tests.support.wire import of, pk, replies, unpacked


@pytest.fixture
def server() -> nnrp.ServerConnection:
    return connected()


# --------------------------------------------------------------------------- the table


def test_every_preview4_type_has_a_rule() -> None:
    assert set(_RULES) == set(nnrp.MsgType)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.MSG_TYPE.name)
@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_no_well_formed_frame_closes_a_session_connection(cls: type[Any],
                                                          data: st.DataObject) -> None:
    # Rule 2: only malformed or unknown input closes a connection. Any well-formed frame
    # of any type, for the open session or for none, leaves it serving.
    conn = connected()
    packet = data.draw(packets(cls))
    session_id = data.draw(st.sampled_from([0, 1, 7]))
    events = conn.receive_data(nnrp.encode(packet._replace(session_id=session_id)))
    if cls is nnrp.ClientHello:  # a second hello is a protocol violation
        assert of(events, nnrp.ConnectionFailed)
        return
    if cls is nnrp.Close or (cls is nnrp.Error and packet.message.is_fatal):
        assert conn.state is nnrp.ConnState.CLOSED  # the peer ends it, not us
        return
    assert not of(events, nnrp.ConnectionFailed)
    assert conn.state is nnrp.ConnState.READY
    follow_up = conn.receive_data(submit(0xFEED, 0xFEED))
    if cls is nnrp.SessionClose and session_id == 1:  # the session itself is closing
        assert of(follow_up, nnrp.SubmitRefused)
    else:
        assert of(follow_up, nnrp.OperationSubmitted)


# --------------------------------------------------------------------------- rule 6


def test_an_operation_control_may_carry_frame_0(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(5, 3))
    (cancelled,) = server.receive_data(pk(nnrp.Cancel(operation_id=5), session_id=1))
    assert cancelled.operation_id == 5 and cancelled.frame_id == 3


def test_an_exact_repeat_is_ignored_other_types_with_the_same_sequence_are_not(
        server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(201, 1))
    priority = pk(nnrp.PriorityUpdate(operation_id=201, control_sequence=201, priority_class=10),
                  session_id=1, frame_id=1)
    (requested,) = server.receive_data(priority)
    assert isinstance(requested, nnrp.PriorityRequested) and requested.priority_class == 10
    (repeat,) = server.receive_data(priority)
    assert isinstance(repeat, nnrp.FrameIgnored)
    # The Rust runner's client sends control_sequence = operation_id on every control.
    (expired,) = server.receive_data(pk(nnrp.ExpireAt(operation_id=201, control_sequence=201,
                                                      deadline_unix_ms=1, flags=3),
                                        session_id=1, frame_id=1))
    assert isinstance(expired, nnrp.DeadlineUpdated)


def test_controls_after_the_terminal_are_a_silent_race(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(5, 3))
    server.send_result(1, 5, 200, b"{}")
    for message in (nnrp.Cancel(operation_id=5), nnrp.PriorityUpdate(operation_id=5),
                    nnrp.Deadline(operation_id=5, deadline_unix_ms=9),
                    nnrp.BudgetUpdate(operation_id=5, token_budget=3)):
        assert server.receive_data(pk(message, session_id=1)) == []


# --------------------------------------------------------------------------- rule 8


def test_a_held_deadline_applies_only_to_the_frame_it_named(
        server: nnrp.ServerConnection) -> None:
    assert server.receive_data(pk(nnrp.Deadline(operation_id=151, deadline_unix_ms=7),
                                  session_id=1, frame_id=1)) == []
    events = server.receive_data(submit(151, 2))
    (submitted,) = of(events, nnrp.OperationSubmitted)
    assert submitted.deadline_unix_ms is None
    (refusal,) = replies(events)
    assert isinstance(refusal.message, nnrp.ErrorRecoverable)
    assert b"named frame 1" in refusal.body


def test_a_held_deadline_may_not_name_a_used_frame(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1))
    (refusal,) = replies(server.receive_data(pk(nnrp.Deadline(
        operation_id=9, deadline_unix_ms=7), session_id=1, frame_id=1)))
    assert b"already used" in refusal.body


# --------------------------------------------------------------------------- rule 9


def test_supersede_of_an_admitted_replacement_drops_the_old_one_at_once(
        server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1) + submit(2, 2))
    (cancelled,) = server.receive_data(pk(nnrp.Supersede(
        old_operation_id=1, new_operation_id=2, diagnostic_bytes=5), session_id=1, body=b"newer"))
    assert isinstance(cancelled, nnrp.OperationCancelled)
    assert (cancelled.operation_id, cancelled.source, cancelled.diagnostic) == (
        1, nnrp.CancelSource.SUPERSEDE, b"newer")


def test_supersede_waits_for_its_replacement_which_is_admitted_at_the_limit(
        server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1) + submit(2, 2))  # the session's limit is 2
    # The hold begins: nothing of operation 1 can be delivered, so its work stops now.
    assert server.receive_data(pk(nnrp.Supersede(old_operation_id=1, new_operation_id=3),
                                  session_id=1)) == [nnrp.OperationSuperseding(1, 1, 1)]
    events = server.receive_data(submit(3, 3))
    submitted, cancelled = events
    assert isinstance(submitted, nnrp.OperationSubmitted) and submitted.operation_id == 3
    assert isinstance(cancelled, nnrp.OperationCancelled) and cancelled.operation_id == 1
    # A fourth submit is still over the limit.
    (refused,) = server.receive_data(submit(4, 4))
    assert refused.reason is nnrp.RefusalReason.OPERATION_LIMIT


def test_supersede_abort_now_and_a_held_operation_may_only_drop(
        server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1))
    (cancelled,) = server.receive_data(pk(nnrp.Supersede(
        old_operation_id=1, new_operation_id=9, flags=1), session_id=1))
    assert cancelled.operation_id == 1
    server.receive_data(submit(2, 2))
    server.receive_data(pk(nnrp.Supersede(old_operation_id=2, new_operation_id=3), session_id=1))
    assert server.superseding(1, 2) and len(server.session(1).pending_supersedes) == 1
    # The client counts it superseded: no partial, progress or result may follow (rule 15).
    for send in (lambda: server.send_partial(1, 2, b"x"),
                 lambda: server.send_progress(1, 2, nnrp.Stage.EXECUTING),
                 lambda: server.send_result(1, 2, 200, b"{}")):
        with pytest.raises(nnrp.LocalProtocolError, match="superseding"):
            send()
    server.send_drop(1, 2, nnrp.DropReason.SUPERSEDED, b"")  # its hold ran out, say
    assert server.session(1).pending_supersedes == {}
    assert of(server.receive_data(submit(3, 3)), nnrp.OperationCancelled) == []


def test_a_hold_ends_in_time_and_frees_everything() -> None:
    clock = Clock()
    conn = connected(clock=clock, supersede_hold_ms=2000)
    conn.receive_data(submit(1, 1))
    conn.receive_data(pk(nnrp.Supersede(old_operation_id=1, new_operation_id=5), session_id=1))
    assert conn.supersede_hold_left(1, 1) == pytest.approx(2.0)
    clock.now += 1.5
    assert conn.supersede_hold_left(1, 1) == pytest.approx(0.5)
    assert conn.supersede_hold_left(1, 7) is None  # not held
    # A second SUPERSEDE naming the same replacement, or of the held one: refused.
    conn.receive_data(submit(2, 2))
    (refused,) = replies(conn.receive_data(pk(nnrp.Supersede(
        old_operation_id=2, new_operation_id=5, control_sequence=2), session_id=1)))
    assert isinstance(refused.message, nnrp.ErrorRecoverable)
    assert b"already the replacement" in refused.body
    (refused,) = replies(conn.receive_data(pk(nnrp.Supersede(
        old_operation_id=1, new_operation_id=6, control_sequence=3), session_id=1)))
    assert b"already waits" in refused.body
    assert not conn.superseding(1, 2)


@pytest.mark.parametrize("why", ["refused", "session_close", "reused_frame"])
def test_a_replacement_that_cannot_come_drops_the_old_one_now(why: str) -> None:
    conn = connected(max_in_flight=1)
    conn.receive_data(submit(1, 1))
    conn.receive_data(pk(nnrp.Supersede(old_operation_id=1, new_operation_id=5,
                                        diagnostic_bytes=3), session_id=1, body=b"new"))
    if why == "refused":  # the server began draining: the replacement is refused
        conn.start_draining()
        events = conn.receive_data(submit(5, 2))
    elif why == "reused_frame":
        events = conn.receive_data(submit(5, 1))
    else:
        events = conn.receive_data(pk(nnrp.SessionClose(), session_id=1))
    (cancelled,) = of(events, nnrp.OperationCancelled)
    assert (cancelled.operation_id, cancelled.source, cancelled.diagnostic) == (
        1, nnrp.CancelSource.SUPERSEDE, b"new")
    session = conn.session(1)
    assert session is not None
    assert session.pending_supersedes == {}


def test_a_refused_submit_leaves_no_held_deadline_behind() -> None:
    conn = connected(max_in_flight=1)
    conn.receive_data(submit(1, 1))
    for attempt in range(80):  # more than max_pending_deadlines
        operation_id = 100 + attempt
        conn.receive_data(pk(nnrp.Deadline(operation_id=operation_id,
                                           deadline_unix_ms=4_000_000_000_000),
                             session_id=1, frame_id=10 + attempt))
        (_refused,) = of(conn.receive_data(submit(operation_id, 10 + attempt)),
                        nnrp.SubmitRefused)
    # The retry of a refused operation brings its own (looser) deadline, and it applies.
    conn.send_result(1, 1, 200, b"{}")
    conn.receive_data(pk(nnrp.Deadline(operation_id=500, deadline_unix_ms=1_000),
                         session_id=1, frame_id=0))
    conn.receive_data(pk(nnrp.Deadline(operation_id=500, deadline_unix_ms=9_000_000_000_000),
                         session_id=1, frame_id=0))
    (submitted,) = of(conn.receive_data(submit(500, 500)), nnrp.OperationSubmitted)
    assert submitted.deadline_unix_ms == 9_000_000_000_000


def test_held_deadlines_past_their_time_are_forgotten() -> None:
    conn = connected(max_pending_deadlines=2)
    for operation_id in (1, 2):  # deadlines in 1970: long past
        conn.receive_data(pk(nnrp.Deadline(operation_id=operation_id, deadline_unix_ms=5),
                             session_id=1))
    # Held, not refused "too many": nothing comes back.
    assert conn.receive_data(pk(nnrp.Deadline(operation_id=3,
                                              deadline_unix_ms=4_000_000_000_000),
                                session_id=1)) == []
    assert of(conn.receive_data(submit(1, 1)), nnrp.OperationSubmitted)[0].deadline_unix_ms \
        is None


# --------------------------------------------------------------------------- rule 10


def test_budgets_for_an_operation_for_the_session_and_without_tokens(
        server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1))
    (budget,) = server.receive_data(pk(nnrp.BudgetUpdate(operation_id=1, token_budget=5,
                                                         flags=2), session_id=1, frame_id=1))
    assert isinstance(budget, nnrp.BudgetRequested)
    assert (budget.operation_id, budget.token_budget, budget.increment) == (1, 5, True)
    (session_budget,) = server.receive_data(pk(nnrp.BudgetUpdate(token_budget=7), session_id=1))
    assert session_budget.operation_id is None
    (submitted,) = server.receive_data(submit(2, 2))
    assert submitted.token_budget == 7
    (refusal,) = replies(server.receive_data(pk(nnrp.BudgetUpdate(operation_id=2,
                                                                  compute_units=9),
                                                session_id=1)))
    assert refusal.message.error_code == nnrp.ErrorCode.UNSUPPORTED_CAPABILITY


@pytest.mark.parametrize("cls", [nnrp.RouteHint, nnrp.ExecutionHint])
def test_hints_must_honour_is_refused_best_effort_is_noted(server: nnrp.ServerConnection,
                                                           cls: type[Any]) -> None:
    (refusal,) = replies(server.receive_data(pk(cls(route_id=9, flags=1), session_id=1)))
    assert refusal.message.error_code == nnrp.ErrorCode.UNSUPPORTED_CAPABILITY
    (noted,) = server.receive_data(pk(cls(route_id=9, flags=2), session_id=1))
    assert isinstance(noted, nnrp.FrameIgnored)


# --------------------------------------------------------------------------- rule 11


def test_credits_windows_and_pauses() -> None:
    clock = Clock()
    conn = connected(clock=clock)
    conn.receive_data(submit(1, 1))
    assert not conn.flow.active and conn.flow_wait(1, 1) == 0  # no window: unlimited
    (changed,) = conn.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=2),
                                      session_id=1))
    assert isinstance(changed, nnrp.FlowChanged)
    conn.send_partial(1, 1, b"a")
    assert conn.flow_wait(1, 1) == 0
    conn.send_partial(1, 1, b"b")
    assert conn.flow_wait(1, 1) is None  # the window is spent
    conn.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=5), session_id=1))
    assert conn.flow_wait(1, 1) == 0
    conn.receive_data(pk(nnrp.Backpressure(scope_id=1, level=3), session_id=1))
    assert conn.flow_wait(1, 1) is None  # paused
    conn.receive_data(pk(nnrp.Backpressure(scope_id=1, level=1, credit_window=4,
                                           retry_after_ms=500), session_id=1))
    assert conn.flow_wait(1, 1) == pytest.approx(0.5)
    clock.now += 1
    assert conn.flow_wait(1, 1) == 0
    # BACKPRESSURE soft without a window keeps the one there was; after a pause,
    # FLOW_UPDATE resume without credits removes the window altogether.
    conn.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=0), session_id=1))
    conn.receive_data(pk(nnrp.Backpressure(scope_id=1, level=1), session_id=1))
    assert conn.flow_wait(1, 1) is None
    conn.receive_data(pk(nnrp.Backpressure(scope_id=1, level=3), session_id=1))
    conn.receive_data(pk(nnrp.FlowUpdate(scope=int(nnrp.FlowScope.SESSION),
                                         reason=int(nnrp.FlowReason.RESUME)), session_id=1))
    assert conn.flow_wait(1, 1) == 0
    for _ in range(100):
        conn.send_partial(1, 1, b"x")
    assert conn.flow_wait(1, 1) == 0
    # Operation scope (flags bit1, scope_id = operation) and connection scope (bit0).
    conn.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=0, flags=2),
                         session_id=1))
    assert conn.flow_wait(1, 1) is None
    conn.receive_data(submit(2, 2))
    assert conn.flow_wait(1, 2) == 0
    conn.receive_data(pk(nnrp.CreditUpdate(credit_window=0, flags=1), session_id=1))
    assert conn.flow_wait(1, 2) is None


def test_flow_update_pause_resume_and_stale_epochs() -> None:
    conn = connected()
    conn.receive_data(submit(1, 1))
    pause = nnrp.FlowUpdate(scope=1, reason=2, credit_epoch=5)
    conn.receive_data(pk(pause, session_id=1))
    assert conn.flow_wait(1, 1) is None
    (stale,) = conn.receive_data(pk(nnrp.FlowUpdate(scope=1, reason=3, credit_epoch=4),
                                    session_id=1))
    assert isinstance(stale, nnrp.FrameIgnored)
    assert conn.flow_wait(1, 1) is None
    conn.receive_data(pk(nnrp.FlowUpdate(scope=1, reason=3, session_credit=1, flags=1,
                                         credit_epoch=6), session_id=1))
    conn.send_partial(1, 1, b"x")
    assert conn.flow_wait(1, 1) is None  # resumed with a window of one
    conn.receive_data(pk(nnrp.FlowUpdate(scope=0, reason=2)))  # connection scope, session 0
    conn.receive_data(pk(nnrp.FlowUpdate(scope=1, reason=0, session_credit=9, flags=1),
                         session_id=1))
    assert conn.flow_wait(1, 1) is None  # still paused for the whole connection


# --------------------------------------------------------------------------- rule 12


def offer(*tokens: str, flags: int = 0, profile_id: int = 2, raw: bytes | None = None) -> bytes:
    body = nnrp.pack_tokens(tuple(tokens)) if raw is None else raw
    return pk(nnrp.CapabilityNegotiation(profile_id=profile_id, capability_count=len(tokens),
                                         body_bytes=len(body), flags=flags),
              session_id=1, body=body)


def test_capability_negotiation_grants_what_we_implement(server: nnrp.ServerConnection) -> None:
    events = server.receive_data(offer("control.cancel_abort", "control.trace_context"))
    (reply,) = replies(events)
    assert isinstance(reply.message, nnrp.CapabilityNegotiation) and reply.session_id == 1
    assert nnrp.parse_tokens(reply.body, reply.message.capability_count) == (
        "control.cancel_abort", "control.trace_context")
    assert of(events, nnrp.CapabilitiesNegotiated)[0].tokens == {
        "control.cancel_abort", "control.trace_context"}


def test_dropped_tokens_degrade_or_refuse(server: nnrp.ServerConnection) -> None:
    (degrade,) = replies(server.receive_data(offer("cache.reference", "control.cancel_abort",
                                                   flags=2)))
    assert isinstance(degrade.message, nnrp.DegradeProfile)
    assert degrade.body == nnrp.pack_tokens(("control.cancel_abort",))
    reply, refusal = replies(server.receive_data(offer("object.lifecycle", flags=1)))
    assert reply.message.capability_count == 0
    assert refusal.message.error_code == nnrp.ErrorCode.UNSUPPORTED_CAPABILITY
    assert b"capability_mismatch" in refusal.body


def test_an_opaque_offer_gets_no_reply(server: nnrp.ServerConnection) -> None:
    # The Rust runner's capability-route-cache offer: count 2, body "cap!".
    raw = pk(nnrp.CapabilityNegotiation(profile_id=2, capability_count=2, cost_model=1,
                                        preference_rank=1, limit_bytes=4096, limit_units=8,
                                        body_bytes=4), session_id=1, body=b"cap!")
    (noted,) = server.receive_data(raw)
    assert isinstance(noted, nnrp.FrameIgnored)


def test_negotiated_credit_advertises_free_slots(server: nnrp.ServerConnection) -> None:
    events = server.receive_data(offer("control.credit_backpressure"))
    _negotiation, credit = replies(events)
    assert isinstance(credit.message, nnrp.CreditUpdate)
    assert (credit.message.scope_id, credit.message.credit_window) == (1, 2)
    (credit,) = replies(server.receive_data(submit(1, 1)))
    assert credit.message.credit_window == 1
    (full,) = replies(server.receive_data(submit(2, 2)))
    assert isinstance(full.message, nnrp.Backpressure)
    assert (full.message.level, full.message.credit_window) == (nnrp.PressureLevel.HARD, 0)
    packets = unpacked(server.send_result(1, 1, 200, b"{}"))
    assert [type(p.message) for p in packets] == [nnrp.ResultPush, nnrp.CreditUpdate]


def test_degrade_from_the_client_narrows_the_session(server: nnrp.ServerConnection) -> None:
    server.receive_data(offer("control.cancel_abort", "control.trace_context"))
    body = nnrp.pack_tokens(("control.trace_context",))
    (negotiated,) = server.receive_data(pk(nnrp.DegradeProfile(
        capability_count=1, body_bytes=len(body)), session_id=1, body=body))
    assert negotiated.tokens == {"control.trace_context"}


def test_session_optional_controls_may_name_session_0_when_there_is_one(
        server: nnrp.ServerConnection) -> None:
    raw = offer("control.cancel_abort").replace(b"\x01\x00\x00\x00", b"\x00\x00\x00\x00", 1)
    (packet,) = nnrp.Decoder().feed(raw)
    assert packet.session_id == 0
    (reply,) = replies(server.receive_data(raw))
    assert reply.session_id == 1


# --------------------------------------------------------------------------- rule 13


def test_features_not_served_are_refused_in_their_own_form(
        server: nnrp.ServerConnection) -> None:
    (patch_ack,) = replies(server.receive_data(pk(nnrp.SessionPatch(
        profile_id=2, patch_mask=0x03), session_id=1)))
    assert patch_ack.message == nnrp.SessionPatchAck(
        ack_status=2, reject_reason=1, rejected_patch_mask=0x03, effective_profile_id=2)
    # SESSION_MIGRATE on the session's own connection is the reference runtime's exchange
    # (rule 4c): acknowledged, nothing moves; the cursor is past every frame used.
    (migrate_ack,) = replies(server.receive_data(pk(nnrp.SessionMigrate(
        old_transport_id=2, new_transport_id=1, last_result_frame_id=7), session_id=1)))
    assert migrate_ack.message.accept_code == nnrp.MigrateAccept.ACCEPTED
    assert migrate_ack.message.resume_from_frame_id == 7
    (same,) = replies(server.receive_data(pk(nnrp.SessionMigrate(
        old_transport_id=2, new_transport_id=2, last_result_frame_id=7), session_id=1)))
    assert same.message.accept_code == nnrp.MigrateAccept.SAME_TRANSPORT
    (cache_ack,) = replies(server.receive_data(pk(nnrp.CachePut(
        cache_namespace=3, object_kind=7, cache_key_hi=1, cache_key_lo=2, object_bytes=2),
        session_id=1, body=b"xy")))
    # The cache is served now (gateway/nnrp/_cache.py; tests/nnrp/test_cache.py).
    assert (cache_ack.message.status, cache_ack.message.cache_key_lo) == (0, 2)
    # The capability-route-cache case's reference: CACHE_MISS echoing namespace and key.
    (miss,) = replies(server.receive_data(pk(nnrp.CacheReference(
        cache_namespace=1, profile_id=2, reuse_scope=1, cache_key_hi=0x1122334455667788,
        cache_key_lo=0x99AABBCCDDEEFF00, metadata_bytes=4), body=b"ref!")))
    assert (miss.session_id, miss.frame_id, miss.body) == (1, 0, b"")
    assert nnrp.encode(nnrp.Packet(miss.message))[40:].hex() == (
        "01000000" "0200" "0100" "8877665544332211" "00ffeeddccbbaa99" "00000000" "00000000")


@pytest.mark.parametrize("message", [
    nnrp.Progress(operation_id=1, stage=5), nnrp.ResultDropReason(operation_id=1,
                                                                  drop_reason=3),
    nnrp.ErrorRecoverable(), nnrp.RetryAfter(), nnrp.Pong(), nnrp.ResultHint(),
])
def test_frames_with_nothing_to_do_are_noted(server: nnrp.ServerConnection,
                                            message: Any) -> None:
    (noted,) = server.receive_data(pk(message, session_id=1))
    assert isinstance(noted, nnrp.FrameIgnored) and noted.reason


# --------------------------------------------------------------------------- outputs


def test_progress_only_while_the_operation_runs(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 4))
    progress = nnrp.decode_packet(server.send_progress(1, 1, nnrp.Stage.EXECUTING))
    assert (progress.message.progress_sequence, progress.message.stage, progress.frame_id) == (
        1, 5, 4)
    assert nnrp.decode_packet(server.send_progress(1, 1, nnrp.Stage.FINALIZING)
                              ).message.progress_sequence == 2
    server.receive_data(pk(nnrp.Cancel(operation_id=1), session_id=1))
    with pytest.raises(nnrp.LocalProtocolError):
        server.send_progress(1, 1, nnrp.Stage.DROPPED)


def test_a_recoverable_result_says_when_to_retry(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 4))
    error, retry, result = unpacked(server.send_result(1, 1, 503, b"{}",
                                                                  retry_after_ms=750))
    assert isinstance(error.message, nnrp.ErrorRecoverable)
    assert (error.message.error_code, error.message.scope, error.message.retry_after_ms) == (
        nnrp.ErrorCode.SERVER_BUSY, nnrp.ErrorScope.FRAME, 750)
    assert (error.frame_id, error.message.related_frame_id) == (4, 4)
    assert (retry.message.scope_id, retry.message.retry_after_ms, retry.message.flags) == (
        1, 750, nnrp.RetryScopeFlag.OPERATION)
    assert result.message.status_code == 503


def test_an_untraced_drop_is_the_drop_alone(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(201, 1))
    (drop,) = unpacked(server.send_drop(1, 201, nnrp.DropReason.SUPERSEDED, b"",
                                                   traced=False))
    assert (drop.message.drop_reason, drop.message.diagnostic_bytes, drop.frame_id) == (2, 0, 1)


def test_draining_refuses_new_sessions_and_submits_recoverably(
        server: nnrp.ServerConnection) -> None:
    server.start_draining()
    (ack,) = replies(server.receive_data(pk(OPEN)))
    assert ack.message.status == nnrp.SessionOpenStatus.RETRY_LATER
    (refused,) = server.receive_data(submit(1, 1))
    assert refused.reason is nnrp.RefusalReason.DRAINING


def test_windows_exist_only_for_what_is_in_flight() -> None:
    """A client cannot make the server keep flow state without bound (_flow rule 6)."""
    conn = connected()
    conn.receive_data(submit(1, 1))
    for operation_id in range(100, 1100):
        (ignored,) = conn.receive_data(pk(nnrp.CreditUpdate(
            scope_id=operation_id, credit_window=1, flags=int(nnrp.PressureFlag.OPERATION)),
            session_id=1))
        assert isinstance(ignored, nnrp.FrameIgnored)
    (ignored,) = conn.receive_data(pk(nnrp.FlowUpdate(
        scope=int(nnrp.FlowScope.OPERATION), operation_id=77), session_id=1))
    assert isinstance(ignored, nnrp.FrameIgnored)
    assert conn.flow.operations == {} and not conn.flow.active
    conn.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=1,
                                           flags=int(nnrp.PressureFlag.OPERATION)),
                         session_id=1))
    assert list(conn.flow.operations) == [(1, 1)]
    conn.send_result(1, 1, 200, b"{}")
    assert conn.flow.operations == {}  # forgotten with its operation


def test_connection_scope_pressure_needs_no_session_id() -> None:
    conn = connected()
    conn.receive_data(pk(OPEN))  # two sessions now
    (changed,) = conn.receive_data(pk(nnrp.Backpressure(level=3, flags=1), session_id=0))
    assert isinstance(changed, nnrp.FlowChanged)
    assert conn.flow.connection.paused


def test_backpressure_level_none_is_malformed() -> None:
    """Level none is CREDIT_UPDATE's; nnrp-py's native peers refuse it in BACKPRESSURE."""
    conn = connected()
    (failure,) = conn.receive_data(pk(nnrp.Backpressure(scope_id=1, level=0), session_id=1))
    assert isinstance(failure, nnrp.ConnectionFailed)
    assert "backpressure.level" in str(failure.error)
