"""The journal of a resumable session alone (gateway/nnrp/_journal.py, rules J1-J4): what
a replay sends, when a position is a gap or none, what the bounds trim or hold, what it
costs, and that no request body outlives its operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gateway.nnrp import PACKET_COST, RECORD_COST, Budget, Journal, ReplayGap
from tests.support.tiers import examples


def packet(tag: str, size: int = 10) -> bytes:
    return tag.encode().ljust(size, b".")


def filled(limit: int = 1000, total: int = 10_000) -> Journal:
    """Operation 1: a PROGRESS and partials 1-5, 10 bytes each."""
    journal = Journal(limit, (Budget(total),))
    journal.start(1, 1, b"{}")
    journal.add(1, packet("progress"))
    for sequence in range(1, 6):
        journal.add(1, packet(f"p{sequence}"), sequence)
    return journal


def test_a_replay_is_every_packet_held_or_what_follows_the_clients_position() -> None:
    journal = filled()
    assert journal.replay(1).packets == (packet("progress"),
                                         *(packet(f"p{n}") for n in range(1, 6)))
    assert journal.replay(1).partials == 5
    assert journal.replay(1, 3).packets == (packet("p4"), packet("p5"))
    assert journal.replay(1, 5).packets == ()
    journal.end(1, [packet("trace"), packet("drop")])
    assert journal.replay(1, 5).packets == (packet("trace"), packet("drop"))
    assert journal.terminal(1).packets == (packet("trace"), packet("drop"))
    assert journal.records[1].ended


def test_a_position_past_the_last_result_is_no_position() -> None:
    journal = filled()
    assert journal.position_problem(1, 5) is None
    problem = journal.position_problem(1, 9)
    assert problem is not None and "past the last result" in problem and "(5)" in problem


def test_attached_over_the_bound_ended_operations_go_first_then_the_oldest_packets() -> None:
    journal = filled(limit=RECORD_COST * 2 + 100)
    journal.start(2, 2, b"{}")
    journal.end(2, [packet("x", 30)])  # ended: the first to go
    journal.add(1, packet("p6", 350), 6)
    journal.trim()
    assert 2 not in journal.records and journal.released == [2]
    assert journal.held <= journal.limit * 7 / 8
    record = journal.records[1]
    assert record.trimmed and record.dropped_through >= 1
    # No position (nnrp-py's identical resubmission): from the earliest packet held.
    earliest = journal.replay(1)
    assert earliest.packets[-1] == packet("p6", 350)
    # A position before what is held is a gap; at or after it, what follows.
    with pytest.raises(ReplayGap) as gap:
        journal.replay(1, record.dropped_through - 1)
    assert gap.value.first_held == record.dropped_through + 1
    with pytest.raises(ReplayGap):
        journal.replay(1, 0)  # "from the start", and the start is gone
    assert journal.replay(1, record.dropped_through).packets[-1] == packet("p6", 350)


def test_a_replay_after_trimmed_partials_still_sends_what_followed_them() -> None:
    """Every partial trimmed, a PROGRESS and the terminal kept: a client holding the last
    partial gets them; one holding less gets a gap, never a skip."""
    journal = filled(limit=RECORD_COST + 80)
    journal.add(1, packet("progress", 5))
    journal.trim()
    record = journal.records[1]
    assert record.dropped_through == 5
    journal.end(1, [packet("drop")])
    assert journal.replay(1, 5).packets[-1] == packet("drop")
    with pytest.raises(ReplayGap):
        journal.replay(1, 4)


def test_pinned_records_are_never_trimmed_and_the_bound_says_wait() -> None:
    journal = filled(limit=RECORD_COST + 50)
    assert journal.over_budget()
    journal.records[1].pinned = True
    journal.trim()
    assert journal.replay(1).packets[0] == packet("progress")  # all there
    journal.start(2, 2, b"{}")
    journal.add(2, packet("q1"), 1)
    journal.add(2, packet("q2"), 2)
    journal.trim()
    assert journal.replay(1).packets[0] == packet("progress")  # pinned: untouched
    assert journal.records[2].trimmed  # the other one paid for it


def test_what_is_held_is_counted_with_its_indexes_in_every_bound() -> None:
    client, total = Budget(1 << 20), Budget(1 << 20)
    journal = Journal(1 << 20, (client, total))
    journal.start(7, 3, b"x" * 1000)
    journal.add(7, packet("a", 100), 1)
    expected = RECORD_COST + 100 + PACKET_COST
    assert journal.held == client.held == total.held == expected
    journal.forget(7)
    assert journal.held == client.held == total.held == 0


def test_a_record_holds_its_requests_key_and_never_the_request() -> None:
    """J3: the key comes with the start (computed when the submit was read)."""
    journal = Journal(1 << 20)
    journal.start(1, 1, b"K" * 32)
    record = journal.records[1]
    assert record.key == b"K" * 32
    assert not hasattr(record, "request")
    journal.end(1, [packet("push")])
    assert record.key == b"K" * 32 and record.held == RECORD_COST + 10 + PACKET_COST


def test_the_shared_budget_wakes_the_sessions_waiting_for_room_and_only_them() -> None:
    class Waiter:
        def __init__(self) -> None:
            self.woken = 0

        def changed(self) -> None:
            self.woken += 1

    shared = Budget(RECORD_COST * 2 + 150)
    first, second = Journal(1 << 20, (shared,)), Journal(1 << 20, (shared,))
    for journal in (first, second):
        journal.start(1, 1, b"{}")
        journal.add(1, packet("a", 100), 1)
    assert shared.over
    waiter = Waiter()
    shared.waiting.add(waiter)
    second.start(2, 2, b"{}")
    second.forget(2)  # still over: no room yet
    assert waiter.woken == 0
    first.clear()  # back under the bound: the waiter is woken, once, and let go
    assert (waiter.woken, shared.waiting) == (1, set())


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300)), max_size=120),
       st.integers(RECORD_COST + 100, RECORD_COST * 4 + 4000))
def test_trimming_keeps_every_replay_a_suffix_of_what_was_sent(
        steps: list[tuple[int, int]], limit: int) -> None:
    """Whatever is added and trimmed: what a replay returns is exactly the packets sent
    from some point on (never a hole), and the counts match what is held."""
    journal = Journal(limit, (Budget(limit * 2),))
    sent: dict[int, list[bytes]] = {}
    sequences: dict[int, int] = {}
    for operation_id, size in steps:
        if operation_id not in journal.records and operation_id not in sent:
            journal.start(operation_id, operation_id + 1, b"{}")
            sent[operation_id] = []
        if operation_id not in journal.records:
            continue
        sequences[operation_id] = sequences.get(operation_id, 0) + 1
        data = bytes([operation_id]) * size + sequences[operation_id].to_bytes(4, "big")
        journal.add(operation_id, data, sequences[operation_id])
        sent[operation_id].append(data)
        journal.trim()
    for operation_id, record in journal.records.items():
        replay = journal.replay(operation_id).packets
        assert tuple(sent[operation_id][len(sent[operation_id]) - len(replay):]) == replay
        held = RECORD_COST + sum(len(p) + PACKET_COST for p in replay)
        assert record.held == held
    assert journal.held == sum(r.held for r in journal.records.values())
