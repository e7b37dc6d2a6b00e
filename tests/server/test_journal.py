"""The journal of a resumable session alone (gateway/server/_journal.py, its rules 1-3):
what a replay sends, when it is a gap, and what the bounds drop or hold back."""

from __future__ import annotations

import pytest

from gateway.server._journal import Budget, Journal, ReplayGap


def packet(tag: str, size: int = 10) -> bytes:
    return tag.encode().ljust(size, b".")


def filled(budget: int = 1000, total: int = 10_000, *, attached: bool = True) -> Journal:
    """Operation 1: a PROGRESS and partials 1-5, 10 bytes each."""
    journal = Journal(budget, Budget(total))
    journal.start(1, 1, b"{}")
    journal.add(1, [packet("progress")], attached=attached)
    for sequence in range(1, 6):
        journal.add(1, [packet(f"p{sequence}")], sequence=sequence, attached=attached)
    return journal


def test_a_replay_is_everything_or_what_follows_the_clients_position() -> None:
    journal = filled()
    assert journal.replay(1) == [packet("progress"), *(packet(f"p{n}") for n in range(1, 6))]
    assert journal.replay(1, 3) == [packet("p4"), packet("p5")]
    assert journal.replay(1, 5) == []
    assert journal.replay(1, 9) == []  # the client claims more than was sent: nothing
    journal.add(1, [packet("trace"), packet("drop")], terminal=True)
    assert journal.replay(1, 5) == [packet("trace"), packet("drop")]
    assert journal.records[1].ended


def test_attached_over_the_bound_ended_operations_go_first_then_the_oldest_packets() -> None:
    journal = filled(budget=100)
    journal.start(2, 2, b"{}")
    journal.add(2, [packet("x", 30)], terminal=True)  # ended: the first to go
    assert 2 in journal.records
    journal.add(1, [packet("p6", 60)], sequence=6)
    assert 2 not in journal.records and journal.released == [2]
    assert journal.held <= 100
    with pytest.raises(ReplayGap) as gap:
        journal.replay(1)  # from the start: part of it is gone
    assert gap.value.first_held == journal.records[1].dropped_through + 1
    kept = journal.replay(1, journal.records[1].dropped_through)
    assert kept[-1] == packet("p6", 60)


def test_a_replay_after_trimmed_partials_still_sends_what_followed_them() -> None:
    """Every partial trimmed, a PROGRESS and the terminal kept: a client holding the last
    partial, or claiming more, gets them; one holding less gets a gap, never a skip."""
    journal = filled(budget=60)
    journal.add(1, [packet("progress", 55)])
    record = journal.records[1]
    assert [entry.sequence for entry in record.entries] == [0]
    assert record.dropped_through == 5
    journal.add(1, [packet("drop")], terminal=True, attached=False)
    assert journal.replay(1, 5) == [packet("progress", 55), packet("drop")]
    assert journal.replay(1, 9) == [packet("progress", 55), packet("drop")]
    with pytest.raises(ReplayGap):
        journal.replay(1, 4)


def test_detached_or_held_back_nothing_is_dropped_the_bound_says_wait() -> None:
    journal = filled(budget=50, attached=False)
    assert journal.over_budget()
    journal.add(1, [packet("p6")], sequence=6, attached=False)
    assert journal.replay(1)[0] == packet("progress")  # all there
    journal.start(2, 2, b"{}")
    journal.add(2, [packet("q1")], sequence=1, attached=True, held_back={1})
    assert journal.replay(1)[0] == packet("progress")  # 1 is held back: untouched
    assert journal.records[2].trimmed  # the live one paid for it


def test_the_shared_budget_counts_every_journal_and_forgetting_gives_it_back() -> None:
    shared = Budget(10_000)
    first, second = Journal(1000, shared), Journal(1000, shared)
    for journal in (first, second):
        journal.start(1, 1, b"{}")
        journal.add(1, [packet("a", 100)], sequence=1)
    assert shared.held == 200
    shared.limit = 150
    assert first.over_budget() and second.over_budget()
    first.clear()
    assert shared.held == 100 and first.released == [1]


def test_the_shared_budget_wakes_the_sessions_waiting_for_room_and_only_them() -> None:
    class Waiter:
        def __init__(self) -> None:
            self.woken = 0

        def changed(self) -> None:
            self.woken += 1

    shared = Budget(150)
    first, second = Journal(1000, shared), Journal(1000, shared)
    for journal in (first, second):
        journal.start(1, 1, b"{}")
        journal.add(1, [packet("a", 100)], sequence=1, attached=False)
    waiter = Waiter()
    shared.waiting.add(waiter)
    second.start(2, 2, b"{}")
    second.add(2, [packet("b", 10)], sequence=1, attached=False)
    second.forget(2)  # still over: no room yet
    assert waiter.woken == 0
    first.clear()  # back under the bound: the waiter is woken, once, and let go
    assert (waiter.woken, shared.waiting) == (1, set())
    # At the bound, an attached session goes over and back under with every packet it
    # trims: with nobody waiting that wakes nobody (and costs nothing per packet).
    shared.limit = 100
    for sequence in range(2, 50):
        second.add(1, [packet("c", 20)], sequence=sequence, attached=True)
    assert waiter.woken == 1
