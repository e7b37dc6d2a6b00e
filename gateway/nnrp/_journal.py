"""What a resumable session keeps of its results, so a client that lost its connection
gets them again: the packets of each operation, in the order they were sent.

Rules (docs/resume.md; ``_resumption`` decides when a session is attached):

J1. Every packet an operation of a resumable session sends is kept here, attached or
    not: its PARTIAL_RESULTs (with their result_sequence), PROGRESS, and its terminal
    (with the TRACE_CONTEXT and recoverable advice that go with it). Credit
    advertisements are not: they describe the session as it is, not a result.
J2. A replay re-sends the packets byte for byte, so the client sees every sequence
    number with the same bytes as before: after the PARTIAL_RESULT the client says it
    holds (``nnrp.resume_after_sequence``), or, when it says nothing (nnrp-py's client
    resubmits the request unchanged and takes a continued sequence), from the earliest
    packet still held. A position the client declares before the earliest packet held
    is a gap and cannot be replayed (``ReplayGap``); one past the last result produced
    is not a position (``position_problem``).
J3. No request body is kept. A record holds its request's key from the start (the
    ``ResubmissionRule``'s: a digest of the request, without the resume position),
    computed when the submit is read, by the I/O layer off the event loop for a big one
    (``_server_session`` rule 5c), and all a resubmission is compared with. Nothing grows with
    the requests a session has made but that key and the results the bounds allow.
J4. Memory is bounded per session (``limit``) and by every ``Budget`` the journal
    counts against (the client's, and the ``pooled`` one of the process); the pooled bound
    applies to a session only above its ``floor`` (its share of the process's bound), so
    one client's sessions filling it cannot take every other client's results away (the
    process then holds at most twice its bound). What is counted is what is held:
    each packet's bytes, plus ``PACKET_COST`` for its place in the indexes and
    ``RECORD_COST`` for each operation's record (measured: docs/benchmarks.md,
    "Resume's memory"). While the session is attached, going over a bound trims what is
    oldest down to ``TRIM_TO`` of it: whole ended operations first, then the oldest
    packets of running ones (their client most likely holds them already: the writer
    handed them to the kernel long before). What the client cannot have seen is never
    trimmed: nothing while the session is detached, nothing of an operation ``pinned``
    (awaiting its resubmission after a resume, or muted); their operations wait for room
    instead (``over_budget``), which stops them reading vLLM, as a slow client does.
    Room made in a shared bound wakes the sessions waiting on it (``Budget.waiting``).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Protocol

import attrs

#: Bytes a held packet costs beyond its own: its end offset (8) and its sequence (4) in
#: the record's indexes.
PACKET_COST = 12
#: Bytes an operation's record costs beyond its packets: the record, its buffer and two
#: indexes, and its key (measured with tracemalloc on CPython 3.11; docs/benchmarks.md).
RECORD_COST = 512
#: Attached, over a bound: trim down to this share of it, so that a session streaming at
#: its bound trims once per eighth of it, not once per packet.
TRIM_TO = 7 / 8


class Wakeable(Protocol):
    def changed(self) -> None: ...


@attrs.define(eq=False)
class Budget:
    """Bytes held by every journal counted against one bound (a client's, or the
    process's), and how many they may be.

    ``waiting``: the sessions whose operations wait for room (rule J4). Room another
    session makes is theirs too, and nothing else would tell them: they are woken when
    the bound stops being exceeded, and only they."""

    limit: int
    held: int = 0
    waiting: set[Wakeable] = attrs.field(factory=set)

    @property
    def over(self) -> bool:
        return self.held > self.limit

    def count(self, nbytes: int) -> None:
        was_over = self.held > self.limit
        self.held += nbytes
        if was_over and self.waiting and self.held <= self.limit:
            waiting, self.waiting = self.waiting, set()
            for session in waiting:
                session.changed()


class ReplayGap(Exception):
    """The client's position is before the earliest packet still held (rule J2)."""

    def __init__(self, operation_id: int, first_held: int) -> None:
        super().__init__(f"results of operation {operation_id} before sequence "
                         f"{first_held} are no longer held")
        self.operation_id = operation_id
        self.first_held = first_held


class OperationRecord:
    """One operation's kept packets: one buffer and two indexes (rule J4's costs). The
    first ``head`` index entries are trimmed (the indexes are compacted in batches)."""

    __slots__ = ("data", "dropped_through", "ended", "ends", "frame_id", "head", "held",
                 "key", "last_sequence", "operation_id", "pinned", "sequences", "start")

    def __init__(self, operation_id: int, frame_id: int, key: bytes) -> None:
        self.operation_id = operation_id
        self.frame_id = frame_id
        #: Its request's key: all a resubmission is compared with (rule J3).
        self.key = key
        self.data = bytearray()
        #: Offset of ``data[0]`` in the operation's stream of packets (what was trimmed).
        self.start = 0
        #: Each packet's end in that stream, and its result_sequence (0: not a partial).
        self.ends = array("Q")
        self.sequences = array("I")
        self.head = 0
        #: The highest result_sequence trimmed: a declared position must not be before it.
        self.dropped_through = 0
        #: The highest result_sequence produced.
        self.last_sequence = 0
        self.ended = False
        #: Never trimmed: awaiting its resubmission, or muted (rule J4).
        self.pinned = False
        self.held = RECORD_COST

    @property
    def trimmed(self) -> bool:
        return self.start > 0

    def add(self, packet: bytes, sequence: int) -> int:
        """Keep one packet; what it costs (rule J4)."""
        self.data += packet
        self.ends.append(self.start + len(self.data))
        self.sequences.append(sequence)
        if sequence:
            self.last_sequence = sequence
        cost = len(packet) + PACKET_COST
        self.held += cost
        return cost

    def first_after(self, position: int) -> int:
        """The index of the first packet after the PARTIAL_RESULT ``position``: PROGRESS
        and terminal packets carry no sequence and go with the partials before them."""
        first = self.head
        sequences = self.sequences
        for index in range(self.head, len(sequences)):
            sequence = sequences[index]
            if sequence > position:
                break
            if sequence:
                first = index + 1
        return first

    def replay_from(self, first: int) -> Replay:
        """The packets from index ``first`` on, and how many of them are partials."""
        packets = []
        partials = 0
        data, start, ends, sequences = self.data, self.start, self.ends, self.sequences
        previous = (ends[first - 1] if first > self.head else start) - start
        for index in range(first, len(ends)):
            end = ends[index] - start
            packets.append(bytes(data[previous:end]))
            previous = end
            if sequences[index]:
                partials += 1
        return Replay(tuple(packets), partials)

    def drop_oldest(self) -> int:
        """Drop the oldest packet held; the bytes that freed (0: none was left)."""
        head, ends = self.head, self.ends
        if head >= len(ends):
            return 0
        end = ends[head]
        size = end - self.start
        del self.data[:size]  # a bytearray drops its front in place
        self.start = end
        sequence = self.sequences[head]
        if sequence:
            self.dropped_through = sequence
        self.head = head + 1
        if self.head > 64 and self.head * 2 > len(ends):
            del ends[:self.head]
            del self.sequences[:self.head]
            self.head = 0
        cost = size + PACKET_COST
        self.held -= cost
        return cost


@attrs.frozen
class Replay:
    """Packets to send again, in order, and how many of them are PARTIAL_RESULTs."""

    packets: tuple[bytes, ...]
    partials: int


class Journal:
    """One session's kept results (rules J1-J4). ``released``: the operations whose
    records were dropped whole since the session last collected them."""

    def __init__(self, limit: int, budgets: Iterable[Budget] = (), *,
                 pooled: Iterable[Budget] = (), floor: int = 0) -> None:
        self.limit = limit
        #: The bounds it always counts against, and those only above its ``floor`` (J4).
        self.budgets = tuple(budgets)
        self.pooled = tuple(pooled)
        self.floor = floor
        self.held = 0
        self.records: dict[int, OperationRecord] = {}
        self.released: list[int] = []

    # ------------------------------------------------------------------ keeping (J1, J3)

    def start(self, operation_id: int, frame_id: int, key: bytes) -> None:
        """An operation begins; ``key``: its request's (rule J3)."""
        record = OperationRecord(operation_id, frame_id, key)
        self.records[operation_id] = record
        self._count(record.held)

    def add(self, operation_id: int, packet: bytes, sequence: int = 0) -> None:
        """Keep one packet of an operation, if its record is still held."""
        record = self.records.get(operation_id)
        if record is not None:
            self._count(record.add(packet, sequence))

    def end(self, operation_id: int, packets: list[bytes]) -> None:
        """The operation's terminal packets: kept."""
        record = self.records.get(operation_id)
        if record is None:
            return  # dropped whole already (J4): nothing of it is replayable
        for packet in packets:
            self._count(record.add(packet, 0))
        record.ended = True

    def pin(self, operation_id: int, pinned: bool) -> None:
        """Whether the operation's record may be trimmed (rule J4), if it is still held."""
        record = self.records.get(operation_id)
        if record is not None:
            record.pinned = pinned

    # ------------------------------------------------------------------ replay (J2)

    def position_problem(self, operation_id: int, after: int) -> str | None:
        """Why ``after`` is no position in the operation's results, if it is none."""
        record = self.records[operation_id]
        if after > record.last_sequence:
            return (f"nnrp.resume_after_sequence {after} is past the last result of "
                    f"operation {operation_id} ({record.last_sequence})")
        return None

    def replay(self, operation_id: int, after: int | None = None) -> Replay:
        """What to send again (rule J2): the packets after the PARTIAL_RESULT ``after``,
        or, with no position, every packet still held. Raises ``ReplayGap`` for a
        position before the earliest packet held."""
        record = self.records[operation_id]
        if after is None:
            return record.replay_from(record.head)
        if after < record.dropped_through or (after == 0 and record.trimmed):
            raise ReplayGap(operation_id, record.dropped_through + 1)
        return record.replay_from(record.first_after(after))

    def terminal(self, operation_id: int) -> Replay:
        """An ended operation's terminal packets (those after its last partial)."""
        record = self.records[operation_id]
        if not record.ended:
            return Replay((), 0)
        return record.replay_from(record.first_after(record.last_sequence))

    # ------------------------------------------------------------------ bounds (J4)

    @property
    def bounds(self) -> tuple[Budget, ...]:
        """Every shared bound it counts against."""
        return self.budgets + self.pooled

    def over_budget(self) -> bool:
        """Whether operations that may not trim must wait (rule J4)."""
        if self.held > self.limit:
            return True
        if any(budget.held > budget.limit for budget in self.budgets):
            return True
        return self.held > self.floor and any(budget.held > budget.limit
                                              for budget in self.pooled)

    def trim(self) -> None:
        """Rule J4, attached: whole ended operations first, oldest first, then the oldest
        packets of running ones; nothing of a pinned one; down to ``TRIM_TO``."""
        if not self.over_budget() or self._trimmed_enough():
            return
        for record in [r for r in self.records.values() if r.ended and not r.pinned]:
            self.forget(record.operation_id)
            if self._trimmed_enough():
                return
        for record in self.records.values():
            if record.pinned:
                continue
            while not self._trimmed_enough():
                freed = record.drop_oldest()
                if not freed:
                    break
                self._count(-freed)
            if self._trimmed_enough():
                return

    def _trimmed_enough(self) -> bool:
        if self.held > self.limit * TRIM_TO or any(
                budget.held > budget.limit * TRIM_TO for budget in self.budgets):
            return False
        return self.held <= self.floor or all(budget.held <= budget.limit * TRIM_TO
                                              for budget in self.pooled)

    def forget(self, operation_id: int) -> None:
        record = self.records.pop(operation_id, None)
        if record is not None:
            self._count(-record.held)
            self.released.append(operation_id)

    def clear(self) -> None:
        for operation_id in list(self.records):
            self.forget(operation_id)

    def _count(self, nbytes: int) -> None:
        self.held += nbytes
        for budget in self.budgets:
            budget.count(nbytes)
        for budget in self.pooled:
            budget.count(nbytes)

