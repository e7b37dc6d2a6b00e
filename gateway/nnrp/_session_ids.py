"""Session ids, unique among every session one gateway process holds (attached to any
of its connections, or detached and waiting to be resumed).

Why per process and not per connection: a client that lost two connections resumes
their sessions on one new connection, and two sessions cannot share an id there.
nnrp-py's native server numbers sessions apart across connections too (the
differential test in tests/interop/test_resume_differential.py).

Rules:

I1. A SESSION_OPEN's ``requested_session_id`` is granted when no session of the process
    holds it (docs/reference/nnrp-wire.md section 3: 0 means the server picks).
I2. Otherwise the lowest free id from 1, as nnrp-py's native server picks (it refuses a
    requested id that is taken, limit_reached; this gateway gives another one: the
    client learns its id from the ACK either way); None when every id is taken.
I3. An id is in use from its ACK until its session is over: closed, ended with its
    connection, or (a resumable one) forgotten when its window passed.
I4. In a fleet (``random_ids``: ``_fleet`` F6) an id not requested is drawn at random
    from the free ones instead: pods number their sessions apart, and a client holding
    sessions of two pods does not see one id twice.
"""

from __future__ import annotations

import heapq
import secrets
from collections.abc import Callable

MAX_SESSION_ID = 0xFFFFFFFF
#: I4: draws before the sequential rule (I2) is used instead; with fewer than a
#: billion ids in use, the first draw is free but once in four.
_RANDOM_DRAWS = 8


class SessionIds:
    """The ids in use, and the lowest free one in O(log n): every id at or above
    ``_high`` is free but those requested explicitly; below it, the free ones are in a
    heap."""

    def __init__(self, *, random_ids: bool = False,
                 randbelow: Callable[[int], int] = secrets.randbelow) -> None:
        self.random_ids = random_ids
        self._randbelow = randbelow
        self._in_use: set[int] = set()
        self._high = 1
        self._free: list[int] = []
        #: What ``_free`` holds, so that an id released again is not pushed twice.
        self._freed: set[int] = set()

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._in_use

    def __len__(self) -> int:
        return len(self._in_use)

    def take(self, requested: int = 0) -> int | None:
        """An id for a new session (rules I1, I2), now in use; None if none is free."""
        if requested and requested not in self._in_use:
            self._in_use.add(requested)
            return requested
        if self.random_ids:  # I4
            for _ in range(_RANDOM_DRAWS):
                candidate = self._randbelow(MAX_SESSION_ID) + 1
                if candidate not in self._in_use:
                    self._in_use.add(candidate)
                    return candidate
        while self._free:
            candidate = heapq.heappop(self._free)
            self._freed.discard(candidate)
            if candidate not in self._in_use:
                self._in_use.add(candidate)
                return candidate
        while self._high in self._in_use:
            self._high += 1
        if self._high > MAX_SESSION_ID:
            return None
        candidate = self._high
        self._high += 1
        self._in_use.add(candidate)
        return candidate

    def release(self, session_id: int) -> None:
        """The session is over (rule I3)."""
        if session_id in self._in_use:
            self._in_use.discard(session_id)
            if session_id < self._high and session_id not in self._freed:
                heapq.heappush(self._free, session_id)
                self._freed.add(session_id)
