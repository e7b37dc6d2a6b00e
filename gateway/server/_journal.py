"""What a resumable session keeps of its results, so a client that lost its connection
gets them again: the packets of each operation, in the order they were sent.

Rules (issue 21; README "Resumable sessions"):

1. Every packet an operation of a resumable session sends is kept here, attached or
   not: its PARTIAL_RESULTs (with their result_sequence), PROGRESS, and its terminal
   (with the TRACE_CONTEXT and recoverable advice that go with it). Credit
   advertisements are not: they describe the session as it is, not a result.
2. A replay re-sends the packets byte for byte, so the client sees every sequence
   number with the same bytes as before and drops the repeats: either from the first
   packet of the operation, or after the PARTIAL_RESULT the client says it holds
   (``nnrp.resume_after_sequence``). Never a gap: a position before the first packet
   still held cannot be replayed (``ReplayGap``).
3. Memory is bounded per session (``budget``) and for the whole gateway (``Budget``,
   shared). While the session is attached, going over either bound drops what is
   oldest: whole ended operations first, then the oldest packets of running ones (their
   client most likely holds them already; a later replay from before them is a gap).
   What the client cannot have seen is never dropped: nothing while the session is
   detached, nor anything of an operation waiting for its resubmission after a resume
   (``held_back``); the operations wait for room instead (``over_budget``), which stops
   them reading vLLM, as a slow client does. Room made in the shared bound by another
   session wakes them (``Budget.waiting``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Protocol

import attrs


class Wakeable(Protocol):
    def changed(self) -> None: ...


@attrs.define
class Budget:
    """The bytes held by every journal of the gateway, and how many they may be.

    ``waiting``: the sessions whose operations wait for room (rule 3). Room another
    session makes is theirs too, and nothing else would tell them: they are woken when
    the bound stops being exceeded, and only they (at the bound, attached sessions go
    over and back under with every packet they trim)."""

    limit: int
    held: int = 0
    waiting: set[Wakeable] = attrs.field(factory=set)

    @property
    def over(self) -> bool:
        return self.held > self.limit

    def count(self, nbytes: int) -> None:
        was_over = self.over
        self.held += nbytes
        if was_over and self.waiting and not self.over:
            waiting, self.waiting = self.waiting, set()
            for session in waiting:
                session.changed()


class ReplayGap(Exception):
    """The client's position is before the first packet still held (rule 2)."""

    def __init__(self, operation_id: int, first_held: int) -> None:
        super().__init__(f"results of operation {operation_id} before sequence "
                         f"{first_held} are no longer held")
        self.operation_id = operation_id
        self.first_held = first_held


@attrs.define
class _Entry:
    #: The PARTIAL_RESULT's result_sequence; 0 for any other packet.
    sequence: int
    packet: bytes


@attrs.define
class OperationRecord:
    operation_id: int
    frame_id: int
    #: The submit's typed body, to tell a resubmission from a different request.
    payload: bytes
    entries: deque[_Entry] = attrs.field(factory=deque)
    #: The highest result_sequence dropped (rule 3): a replay must start after it.
    dropped_through: int = 0
    #: Anything dropped at all (a replay from the start is then a gap).
    trimmed: bool = False
    ended: bool = False
    held: int = 0


class Journal:
    """One session's kept results (rules 1-3). ``released`` is told of every operation
    whose record is dropped whole (the session's protocol state forgets it can replay
    it)."""

    def __init__(self, budget: int, shared: Budget) -> None:
        self.budget = budget
        self.shared = shared
        self.held = 0
        self.records: dict[int, OperationRecord] = {}
        self.released: list[int] = []

    def start(self, operation_id: int, frame_id: int, payload: bytes) -> None:
        self.records[operation_id] = OperationRecord(operation_id, frame_id, payload)

    def add(self, operation_id: int, packets: list[bytes], *, sequence: int = 0,
            terminal: bool = False, attached: bool = True,
            held_back: Collection[int] = ()) -> None:
        """Keep ``packets`` of an operation; ``attached``: the session is on a connection,
        and ``held_back`` the operations whose frames did not reach it (rule 3)."""
        record = self.records.get(operation_id)
        if record is None:
            return  # dropped whole already (rule 3): nothing of it is replayable
        for packet in packets:
            record.entries.append(_Entry(sequence, packet))
            record.held += len(packet)
            self._count(len(packet))
        record.ended = record.ended or terminal
        if attached:
            self._trim(held_back)

    def over_budget(self) -> bool:
        """Whether a detached session's operations must wait (rule 3)."""
        return self.held > self.budget or self.shared.over

    def replay(self, operation_id: int, after: int | None = None) -> list[bytes]:
        """The packets to send again (rule 2): all of them, or those after the
        PARTIAL_RESULT ``after``. Raises ``ReplayGap`` when that is not possible."""
        record = self.records[operation_id]
        position = after or 0
        if (position == 0 and record.trimmed) or position < record.dropped_through:
            raise ReplayGap(operation_id, record.dropped_through + 1)
        # After the last PARTIAL_RESULT the client holds: PROGRESS and terminal packets
        # carry no sequence and go with the partials before them. What was trimmed was
        # all at or before ``dropped_through``, so when none of the kept partials is at
        # or before the position, everything kept follows it.
        start = 0
        for index, entry in enumerate(record.entries):
            if entry.sequence > position:
                break
            if entry.sequence:
                start = index + 1
        return [entry.packet for entry in list(record.entries)[start:]]

    def kept(self, operation_id: int) -> list[bytes]:
        """Every packet still held (a migration: the client gave no position and dedups
        by sequence; what was dropped while attached went out long before)."""
        return [entry.packet for entry in self.records[operation_id].entries]

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
        self.shared.count(nbytes)

    def _trim(self, held_back: Collection[int]) -> None:
        """Rule 3, attached: whole ended operations first, oldest first, then the oldest
        packets of running operations; nothing of the ``held_back`` ones."""
        if not self.over_budget():
            return
        for record in [r for r in self.records.values()
                       if r.ended and r.operation_id not in held_back]:
            self.forget(record.operation_id)
            if not self.over_budget():
                return
        for record in [r for r in self.records.values() if r.operation_id not in held_back]:
            while record.entries and self.over_budget():
                entry = record.entries.popleft()
                record.held -= len(entry.packet)
                record.trimmed = True
                record.dropped_through = max(record.dropped_through, entry.sequence)
                self._count(-len(entry.packet))
            if not self.over_budget():
                return
