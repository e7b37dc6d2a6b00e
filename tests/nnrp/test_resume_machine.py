"""Resume as a state machine (hypothesis's stateful testing): arbitrary interleavings of
open, submit, results, cut (with what was in flight lost), resume (with its answer lost
or not), resubmit (with or without a position), cancel, migrate, window expiry and drain,
over the real sans-IO layer (``SessionBook``, ``ServerConnection``, ``ServerSession``)
and a client that keeps what it received.

The invariants (issue 34, "What to build" 1), checked after every step:

* every result sequence reaches a client at most once per connection, and never two
  different payloads under one sequence;
* at most one terminal per operation, ever (a replay of it is byte for byte the same);
* what the server produced for a session its client holds is, once the client is
  back and has resubmitted, delivered whole: no hole, but one the server cannot avoid:
  a replay with no position (an identical resubmission, a migration) starts at the
  earliest result still held, and while attached the journal trims what its client most
  likely holds; if that was in the network when the connection died, the client misses
  it (gateway/nnrp/_journal.py J2, J4). A client that declares its position is told
  instead (410), which the machine's declaring client checks;
* no operation runs for nobody past its window (every detached session's deadline is
  ahead of the clock once ``expire`` has run);
* a journal holds no more than its bounds (plus one packet: the bound is checked before
  an operation produces, as the I/O layer's port does).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from gateway import nnrp
from tests.support.resume import RESUMABLE, Clock, book, connection, migrate, resume
from tests.support.tiers import examples
from tests.support.wire import pk

WINDOW = 10.0
SESSION_BYTES = nnrp.RECORD_COST * 2 + 2000
REQUEST = json.dumps({"schema_version": 1, "operation": "chat.completions.create",
                      "body": {"model": "m", "messages": [], "stream": True}}).encode()


def request_with(position: int | None) -> bytes:
    if position is None:
        return REQUEST
    document = json.loads(REQUEST)
    document["nnrp"] = {"resume_after_sequence": position}
    return json.dumps(document).encode()


@attrs.define
class ClientOp:
    operation_id: int
    frame_id: int
    received: dict[int, bytes] = attrs.field(factory=dict)
    terminal: bytes | None = None
    #: On the current connection: results go on (False: waits for its resubmission).
    live: bool = True
    #: A replay without a position started past what it held (J4's trimmed results).
    holed: bool = False


@attrs.define
class ClientSession:
    session_id: int
    token: bytes
    ops: dict[int, ClientOp] = attrs.field(factory=dict)
    connection: int | None = None  # index in the machine's connections
    gone: bool = False  # refused for good, or closed


@attrs.define
class Wire:
    """One connection: the server's state, what it sent that is not yet read, and what
    was read on it."""

    protocol: nnrp.ServerConnection
    in_flight: list[bytes] = attrs.field(factory=list)
    seen: set[tuple[int, int, int]] = attrs.field(factory=set)
    alive: bool = True


class ResumeMachine(RuleBasedStateMachine):
    sessions_bundle = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.book = book(self.clock, window=WINDOW, session_bytes=SESSION_BYTES,
                         total_bytes=SESSION_BYTES * 3, max_sessions_per_client=10_000)
        self.wires: list[Wire] = []
        self.clients: dict[int, ClientSession] = {}
        self.next_operation = 1
        self.produced: dict[tuple[int, int], int] = {}
        #: The highest result each operation's journal ever trimmed (J4): a replay with
        #: no position may start past a client's position only up to there.
        self.trimmed: dict[tuple[int, int], int] = {}

    # ------------------------------------------------------------------ plumbing

    def _wire(self) -> int:
        wire = Wire(connection(self.book))
        if self.book.draining:
            wire.protocol.start_draining()  # as the server takes connections then
        self.wires.append(wire)
        return len(self.wires) - 1

    def _feed(self, index: int, data: bytes) -> list[Any]:
        wire = self.wires[index]
        events = wire.protocol.receive_data(data)
        for event in events:
            self._apply(index, event)
        return events

    def _apply(self, index: int, event: Any) -> None:
        wire = self.wires[index]
        if isinstance(event, nnrp.SendBytes):
            wire.in_flight.append(event.data)
        elif isinstance(event, nnrp.OperationResumed | nnrp.SessionMigrated):
            wire.in_flight.extend(event.replay)
        elif isinstance(event, nnrp.OperationCancelled | nnrp.OperationAbandoned):
            self._end_operation(event.session_id, event.operation_id, index)
        elif isinstance(event, nnrp.SessionTaken):
            for other in self.wires:
                if other.protocol is event.previous:
                    other.in_flight.append(event.notice)

    def _session(self, session_id: int) -> nnrp.ServerSession | None:
        record = self.book.record_of(session_id)
        return record.session if record is not None else None

    def _end_operation(self, session_id: int, operation_id: int, index: int | None = None
                       ) -> None:
        """What the I/O layer does with a cancelled or abandoned operation: its drop."""
        session = self._session(session_id)
        if session is None or operation_id not in session.operations:
            return
        packets = session.send_drop(operation_id, nnrp.DropReason.PEER_CANCELLED, b"")
        self._write(session, packets)

    def _note_trims(self, session: nnrp.ServerSession) -> None:
        journal = session.journal
        if journal is None:
            return
        for operation_id, record in journal.records.items():
            key = (session.session_id, operation_id)
            self.trimmed[key] = max(self.trimmed.get(key, 0), record.dropped_through)

    def _write(self, session: nnrp.ServerSession, packets: list[bytes]) -> None:
        if not packets:
            return
        for wire in self.wires:
            if wire.protocol is session.connection and wire.alive:
                wire.in_flight.extend(packets)
                return
        raise AssertionError("output for a session attached nowhere")

    def _read(self, index: int) -> None:
        """The client reads what came on a connection."""
        wire = self.wires[index]
        decoder = nnrp.Decoder()
        for data in wire.in_flight:
            for packet in decoder.feed(data):
                self._receive(index, packet)
        wire.in_flight.clear()

    def _receive(self, index: int, packet: nnrp.Packet) -> None:
        client = self.clients.get(packet.session_id)
        message = packet.message
        if client is None:
            return
        operation = next((op for op in client.ops.values()
                          if op.frame_id == packet.frame_id), None)
        if isinstance(message, nnrp.PartialResult):
            assert operation is not None, "a result for no operation of the client"
            key = (packet.session_id, message.operation_id, message.result_sequence)
            assert key not in self.wires[index].seen, "a sequence twice on one connection"
            self.wires[index].seen.add(key)
            body = bytes(packet.body)
            previous = operation.received.get(message.result_sequence)
            assert previous is None or previous == body, "two payloads under one sequence"
            expected = max(operation.received, default=0) + 1
            if previous is None and message.result_sequence != expected:
                trimmed = self.trimmed.get((packet.session_id, message.operation_id), 0)
                assert trimmed >= expected, (
                    f"a hole: sequence {message.result_sequence} after {expected - 1}, "
                    f"and the journal trimmed only through {trimmed}")
                operation.holed = True
            operation.received[message.result_sequence] = body
        elif isinstance(message, nnrp.ResultPush | nnrp.ResultDropReason):
            assert operation is not None, "a terminal for no operation of the client"
            data = nnrp.encode(packet)
            assert operation.terminal is None or operation.terminal == data, (
                "a second, different terminal")
            operation.terminal = data

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.book.draining)
    @rule(target=sessions_bundle)
    def open_session(self) -> int:
        index = self._wire()
        events = self._feed(index, pk(RESUMABLE))
        (opened,) = [e for e in events if isinstance(e, nnrp.SessionOpened)]
        self._read(index)
        record = self.book.record_of(opened.session_id)
        assert record is not None
        self.clients[opened.session_id] = ClientSession(opened.session_id, record.newest,
                                                        connection=index)
        return opened.session_id

    @rule(session_id=sessions_bundle)
    def submit(self, session_id: int) -> None:
        client = self.clients[session_id]
        if client.gone or client.connection is None or len(client.ops) >= 3:
            return
        operation_id = self.next_operation
        self.next_operation += 1
        client.ops[operation_id] = ClientOp(operation_id, operation_id)
        self._feed(client.connection, pk(
            nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=0x10,
                             payload_frame_count=1),
            session_id=session_id, frame_id=operation_id,
            body=nnrp.pack_single_frame(REQUEST)))

    @rule(session_id=sessions_bundle, count=st.integers(1, 30), finish=st.booleans())
    def produce(self, session_id: int, count: int, finish: bool) -> None:
        """The operations' tasks: results while the bound allows (the port's ``room``)."""
        session = self._session(session_id)
        if session is None:
            return
        for operation_id in list(session.operations):
            for _ in range(count):
                if operation_id not in session.operations:
                    break
                journal = session.journal
                if (not session.delivers(operation_id) and journal is not None
                        and journal.over_budget()):
                    break  # waits for room: reads no more from vLLM
                produced = self.produced.get((session_id, operation_id), 0) + 1
                self.produced[(session_id, operation_id)] = produced
                packet = session.send_partial(operation_id, b"r%d-%d" % (operation_id,
                                                                        produced))
                self._note_trims(session)
                if packet is not None:
                    self._write(session, [packet])
            if finish and operation_id in session.operations:
                self._write(session, session.send_result(operation_id, 200, b"done"))

    @rule(session_id=sessions_bundle, lose=st.booleans())
    def deliver_or_lose(self, session_id: int, lose: bool) -> None:
        client = self.clients[session_id]
        if client.connection is not None and not lose:
            self._read(client.connection)

    @rule(session_id=sessions_bundle, read_first=st.booleans())
    def cut(self, session_id: int, read_first: bool) -> None:
        """The connection drops; what it had in flight is lost unless read first."""
        client = self.clients[session_id]
        if client.connection is None:
            return
        index = client.connection
        if read_first:
            self._read(index)
        wire = self.wires[index]
        wire.in_flight.clear()
        wire.alive = False
        wire.protocol.connection_lost()
        for other in self.clients.values():
            if other.connection == index:
                other.connection = None
                for op in other.ops.values():
                    op.live = False
        self._expire()

    @rule(session_id=sessions_bundle, lose_answer=st.booleans(),
          declare=st.booleans(), pipeline=st.booleans())
    def resume(self, session_id: int, lose_answer: bool, declare: bool,
               pipeline: bool) -> None:
        client = self.clients[session_id]
        if client.connection is not None or client.gone:
            return
        index = self._wire()
        # ``pipeline``: a PING for the session goes right behind the resume, before its
        # answer can have arrived (it must not make a lost answer fatal: R4).
        events = self._feed(index, resume(client.token, session_id) + (
            pk(nnrp.Ping()) if pipeline else b""))
        acks = [nnrp.Decoder().feed(e.data)[0] for e in events
                if isinstance(e, nnrp.SendBytes)]
        ack = next(p for p in acks if isinstance(p.message, nnrp.SessionOpenAck))
        status = ack.message.status
        if status == nnrp.SessionOpenStatus.REJECTED:
            # Only ever a session that is no more (expired, ended): never one still held.
            assert self.book.record_of(session_id) is None
            client.gone = True
            self.wires[index].in_flight.clear()
            return
        if status == nnrp.SessionOpenStatus.RETRY_LATER:
            return  # attached elsewhere (cannot happen here: the client cut it first)
        if lose_answer:  # the ACK is lost with the connection: the client keeps its token
            self.wires[index].in_flight.clear()
            self.wires[index].alive = False
            self.wires[index].protocol.connection_lost()
            return
        self.wires[index].in_flight.clear()
        client.token = bytes(ack.body)
        client.connection = index
        for op in client.ops.values():
            if op.terminal is not None:
                continue
            position = max(op.received, default=0) if declare else None
            self._feed(index, pk(
                nnrp.FrameSubmit(operation_id=op.operation_id, payload_kind_bitmap=0x10,
                                 payload_frame_count=1),
                session_id=session_id, frame_id=op.frame_id,
                body=nnrp.pack_single_frame(request_with(position))))
            op.live = True
        self._feed(index, pk(nnrp.Ping()))  # confirms the new token

    @rule(session_id=sessions_bundle)
    def take_with_migrate(self, session_id: int) -> None:
        client = self.clients[session_id]
        if client.gone:
            return
        index = self._wire()
        events = self._feed(index, migrate(client.token, session_id=session_id,
                                           old=nnrp.TransportId.TCP))
        packets = [p for e in events if isinstance(e, nnrp.SendBytes)
                   for p in nnrp.Decoder().feed(e.data)]
        ack = next(p for p in packets if isinstance(p.message, nnrp.SessionMigrateAck))
        if ack.message.accept_code != 0:
            assert self.book.record_of(session_id) is None
            client.gone = True
            self.wires[index].in_flight.clear()
            return
        previous = client.connection
        if previous is not None:
            self._read(previous)  # what the old connection still carried
            self.wires[previous].alive = False
        self.wires[index].in_flight = [d for d in self.wires[index].in_flight
                                       if d not in [e.data for e in events if isinstance(
                                           e, nnrp.SendBytes)]]
        client.token = bytes(ack.body)
        client.connection = index
        for op in client.ops.values():
            op.live = True
        self._feed(index, pk(nnrp.Ping()))
        # A migration's replay may repeat a delivered terminal: that is the client's to
        # drop (ended frames); the machine's client checks it is the same bytes.

    @rule(session_id=sessions_bundle)
    def cancel_one(self, session_id: int) -> None:
        client = self.clients[session_id]
        if client.connection is None:
            return
        open_ops = [op for op in client.ops.values() if op.terminal is None]
        if not open_ops:
            return
        self._feed(client.connection, pk(nnrp.Cancel(operation_id=open_ops[0].operation_id,
                                                      control_sequence=1),
                                         session_id=session_id))

    @rule(seconds=st.sampled_from([0.5, 3.0, 6.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        self._expire()

    def _expire(self) -> None:
        """What the I/O layer's timer does when a deadline is due (it wakes for a new
        earlier one, too: a session detached during a drain whose end has passed)."""
        for expiry in self.book.expire():
            session = expiry.record.session
            if expiry.kind is nnrp.ExpiryKind.WINDOW:
                for operation_id in list(session.operations):  # the I/O layer cancels them
                    packets = session.send_drop(operation_id,
                                                nnrp.DropReason.TRANSPORT_CLOSED, b"")
                    assert packets == []  # detached: nobody to tell
                client = self.clients.get(session.session_id)
                if client is not None:
                    client.gone = True
            else:
                for operation_id in expiry.abandoned:
                    packets = session.send_drop(operation_id,
                                                nnrp.DropReason.TRANSPORT_CLOSED, b"")
                    assert packets == []  # muted

    @precondition(lambda self: not self.book.draining)
    @rule()
    def drain(self) -> None:
        self.book.start_draining(self.clock.now + WINDOW / 2)
        for wire in self.wires:
            wire.protocol.start_draining()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def no_operation_runs_for_nobody_past_its_window(self) -> None:
        """Time only moves in ``time_passes``, which expires at once, as the I/O layer's
        timer does: a detached session's window is always ahead, and a session that
        ended has no operation left that the I/O layer was not told to end."""
        for record in self.book.records.values():
            if record.phase is nnrp.Phase.DETACHED:
                assert record.deadline is not None and record.deadline > self.clock.now
        for wire in self.wires:
            for session in wire.protocol.sessions:
                assert session.session_id in self.book.records, "an ended session attached"

    @invariant()
    def held_bytes_within_their_bounds(self) -> None:
        slack = 64 + nnrp.PACKET_COST + nnrp.RECORD_COST  # one packet past the check
        for record in self.book.records.values():
            journal = record.session.journal
            assert journal is not None
            assert journal.held <= SESSION_BYTES + slack * 3
        assert self.book.total.held <= self.book.policy.total_bytes + slack * 3 * len(
            self.book.records) + 1

    @invariant()
    def a_session_is_held_by_one_connection_at_most(self) -> None:
        held = [id(session) for wire in self.wires if wire.alive
                for session in wire.protocol.sessions]
        assert len(held) == len(set(held))

    @invariant()
    def a_client_back_on_its_session_misses_nothing(self) -> None:
        """Everything produced for a live operation, once read, is there in order."""
        for client in self.clients.values():
            if client.connection is None or client.gone:
                continue
            if self.wires[client.connection].in_flight:
                continue  # not read yet
            for op in client.ops.values():
                if not op.live or op.terminal is not None or op.holed:
                    continue
                produced = self.produced.get((client.session_id, op.operation_id), 0)
                session = self._session(client.session_id)
                if session is None or not session.delivers(op.operation_id):
                    continue
                assert max(op.received, default=0) == produced, (
                    f"operation {op.operation_id}: {max(op.received, default=0)} of "
                    f"{produced}")


ResumeMachine.TestCase.settings = settings(
    max_examples=examples(300), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_resume_state_machine = ResumeMachine.TestCase
