"""SIGHUP re-reads the token file of a real ``serve`` process (issue 37: "SIGHUP does not
re-read the token file" was reported; it does, with one process and with workers)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gateway.tools.client import ClientError, connect
from tests.support.processes import ReplayThread
from tests.support.waits import wait_for
from tests.support.workers import Served, served_workers


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayThread]:
    with ReplayThread(speed=50.0) as thread:
        yield thread


def opens(uri: str, token: str, tries: int) -> list[bool]:
    """Whether a session presenting ``token`` opens, on ``tries`` connections (with
    workers, the kernel spreads them)."""

    async def one() -> str:
        async with connect(uri) as client:
            try:
                session = await client.open_session(auth=token.encode())
            except ClientError as exc:
                return str(exc)
            await session.close()
            return "opened"

    answers = [trio.run(one) for _ in range(tries)]
    assert all(a == "opened" or a.startswith("session refused") for a in answers), answers
    return [answer == "opened" for answer in answers]


def hang_up(served: Served, event: str, workers: int) -> None:
    """SIGHUP, and wait until every process that serves has logged ``event`` once more."""
    before = sum(r.get("event") == event for r in served.records())
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: sum(r.get("event") == event for r in served.records())
             == before + workers, what=event)


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_rereads_the_token_file(tmp_path: Path, replay: ReplayThread,
                                       workers: int) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# the gateway's clients\nold-token\n")
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0", workers=workers,
                        extra=("--auth-token-file", str(tokens))) as served:
        uri = served.uris["tcp"]
        tries = 2 * workers
        assert opens(uri, "old-token", tries) == [True] * tries
        assert opens(uri, "new-token", tries) == [False] * tries

        tokens.write_text("new-token\n")  # old-token revoked
        hang_up(served, "auth tokens reloaded", workers)
        assert opens(uri, "new-token", tries) == [True] * tries
        assert opens(uri, "old-token", tries) == [False] * tries

        tokens.write_text("# emptied by mistake\n")  # would turn authentication off
        hang_up(served, "auth token reload failed; keeping the previous tokens", workers)
        assert opens(uri, "new-token", tries) == [True] * tries
        assert opens(uri, "", tries) == [False] * tries
