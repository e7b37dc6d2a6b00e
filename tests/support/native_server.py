"""nnrp-py's native server as a bare session referee, for differential tests that speak
raw NNRP to it (tests/interop/test_resume_refusals_differential.py).

``SessionReferee`` runs the native server in a thread with its own asyncio loop (the
native API is asyncio-only: tests/support/native.py) and an application that accepts
every session, a resumed one included (to the application a resumed session is a new
one), and polls each. The runtime drops a session as soon as its connection dies, and
the application's next poll of it fails: ``lost`` is that, the server having seen the
connection die. A session whose connection died is left alone, never closed: closing it
would delete the session's record in the runtime, and a resume would then be refused.

``serve_referee`` starts it from trio and stops it on the way out; every wait in it is
bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio
from nnrp.native import NativeRuntimeError
from nnrp.server.native import listen_native_server

from tests.support.native import (
    REFEREE_START_LIMIT,
    close_serving,
    native_server_options,
    waiting_accept,
)

#: Between two rounds of polls of the sessions the application holds.
POLL_PAUSE = 0.005


@attrs.define
class SessionReferee:
    """nnrp-py's native server with an application that only holds sessions."""

    #: NativeServerBootstrapOptions (None: loopback TCP, ``native_server_options``).
    options: Any = None
    #: The server's ``host:port`` once it listens, or the error that kept it from it.
    ready: queue.Queue[str | BaseException] = attrs.Factory(queue.Queue)
    stop: threading.Event = attrs.Factory(threading.Event)
    #: Sessions accepted, in order (a resume is accepted as a new session).
    accepted: int = 0
    #: Indexes (in ``accepted`` order) of the sessions whose connection the runtime saw
    #: die (their poll failed), in the order it was seen.
    lost: list[int] = attrs.Factory(list)
    #: Failures the application met other than a lost session (accept errors).
    errors: list[str] = attrs.Factory(list)

    @property
    def live(self) -> int:
        """Sessions the application holds whose connection is not known dead."""
        return self.accepted - len(self.lost)

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:
            self.ready.put(error)  # a start that failed: the starter raises it
            raise

    async def _serve(self) -> None:
        # An explicit tcp route: "nnrp://host:0" alone binds nnrp's default port (4433).
        with listen_native_server(self.options or native_server_options()) as server:
            self.ready.put(server.bound_provider_endpoints["tcp"].uri.split("://", 1)[-1])
            sessions: dict[int, Any] = {}
            accepting = waiting_accept(server)
            try:
                while not self.stop.is_set():
                    if accepting.done():
                        try:
                            sessions[self.accepted] = accepting.result()
                            self.accepted += 1
                        except NativeRuntimeError as error:
                            self.errors.append(f"accept: {error!r}")
                        accepting = waiting_accept(server)
                    for index, session in list(sessions.items()):
                        try:
                            session.poll_events(max_events=16, timeout_ms=1)
                        except NativeRuntimeError:  # its connection died
                            del sessions[index]
                            self.lost.append(index)
                    await asyncio.sleep(POLL_PAUSE)
            finally:
                await close_serving(server, accepting)


@contextlib.asynccontextmanager
async def serve_referee(options: Any = None) -> AsyncIterator[tuple[SessionReferee, str]]:
    """A ``SessionReferee`` running in a thread, and its ``host:port``; stopped (and its
    thread joined) on the way out."""
    referee = SessionReferee(options)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, referee.run)
        try:
            with trio.fail_after(REFEREE_START_LIMIT):
                started = await trio.to_thread.run_sync(referee.ready.get,
                                                        abandon_on_cancel=True)
            if isinstance(started, BaseException):
                raise RuntimeError("nnrp-py's native server did not start") from started
            yield referee, started
        finally:
            # The thread sees ``stop`` within one round of polls and ends; the nursery
            # waits for it (its own asyncio loop closes the server).
            referee.stop.set()
