"""A set of ids kept as sorted, disjoint runs of consecutive values.

A session must refuse a repeated frame_id or operation_id for its whole life
(docs/reference/nnrp-wire.md
"FRAME_SUBMIT"), so it remembers every id it has seen. As a plain set that memory grew by
one entry per operation, without bound on a long-lived session (found by the 1,000-stream
soak). Peers allocate ids by counting (our client does), so as runs a session holds one
run however many operations it carries; a peer that skips ids pays one run per gap.
"""

from __future__ import annotations

from bisect import bisect_right


class IdRuns:
    """Membership and insertion in O(log runs); memory O(runs), not O(ids)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        index = bisect_right(self._starts, value) - 1
        return index >= 0 and value <= self._ends[index]

    def add(self, value: int) -> None:
        """Insert ``value``; a value already present is left as it is."""
        if value in self:
            return
        starts, ends = self._starts, self._ends
        index = bisect_right(starts, value)  # the first run starting after value
        joins_left = index > 0 and ends[index - 1] == value - 1
        joins_right = index < len(starts) and starts[index] == value + 1
        if joins_left and joins_right:
            ends[index - 1] = ends[index]
            del starts[index], ends[index]
        elif joins_left:
            ends[index - 1] = value
        elif joins_right:
            starts[index] = value
        else:
            starts.insert(index, value)
            ends.insert(index, value)

    @property
    def runs(self) -> int:
        """How many disjoint runs are held (the memory cost)."""
        return len(self._starts)
