"""The contract between the sans-IO server and whatever keeps resumable sessions
between connections (``gateway.server``'s registry): rule 4 of ``_server``."""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from ._server_session import ServerSession


@attrs.frozen
class ResumeGrant:
    """What a resumable session's ACK carries: its (next) token and the window."""

    token: bytes
    window_ms: int


class ResumeRefused(enum.Enum):
    """Why a resume is not answered here (rule 4b); ``RETRY_LATER`` only for the holder of
    the current token of a session still attached elsewhere."""

    REJECTED = "rejected"
    RETRY_LATER = "retry_later"
    #: Another process of the gateway holds the session: the connection is handed to it
    #: (rule 4d), from its first byte.
    ELSEWHERE = "elsewhere"


class SessionStore(Protocol):
    """Where resumable sessions live between connections: the I/O layer's registry, one
    adapter per connection. Tokens come from it (a CSPRNG) and are compared there in
    constant time; ``identity`` is the authenticated identity (the SESSION_OPEN's auth
    bytes, or b"" when session auth is off)."""

    def grant(self, session: ServerSession, identity: bytes) -> ResumeGrant | None:
        """Resume for a session being opened with ``allow_resume``; None: not granted
        (resume is off, or the gateway holds as many resumable sessions as it may)."""
        ...

    def resume(self, session_id: int, token: bytes, identity: bytes
               ) -> tuple[ServerSession, ResumeGrant] | ResumeRefused:
        """The detached session ``token`` opens, attached here from now on, and its next
        grant; or why not."""
        ...

    def migrate(self, session_id: int, token: bytes, identities: Collection[bytes] | None
                ) -> ServerSession | ResumeRefused:
        """The session ``token`` names, taken from wherever it is (detached, or attached
        to another connection, which lets it go) and attached here; or why not
        (``REJECTED``, or ``ELSEWHERE``). ``identities``: the credentials this connection
        has authenticated with (None: session auth is off): a migration carries none of
        its own, so the session's must be among them."""
        ...


def identity_of(auth: bytes) -> bytes:
    """What a resume token is bound to: the credentials that opened the session, as the
    SESSION_OPEN carried them (the store compares them in constant time, keeps them in
    memory only and never logs them)."""
    return bytes(auth)
