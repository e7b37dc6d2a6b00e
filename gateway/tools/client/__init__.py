"""A trio NNRP client: connect, open sessions, submit typed operations, stream events.

    async with connect("tcp://127.0.0.1:7700") as client:
        session = await client.open_session()
        operation = await session.submit(envelope_bytes)
        async for event in operation.events():
            ...                       # PartialReceived*, then ResultReceived or DropReceived
        await session.close()

``operation.cancel()`` sends a real CANCEL (or FRAME_CANCEL / ABORT); the terminal
then arrives as ``DropReceived`` (peer_cancelled).

Resume (docs/resume.md): ``connect(uri, resume=True)`` opens sessions that may outlive
their connection; when the connection drops, the client recovers by itself (the recovery
rules are ``_client``'s).

Layout: ``_trust`` (what the tools trust on a TLS endpoint), ``_session`` (a session and
its operations, as the caller holds them), ``_client`` (the connection: its reader, the
session answers, the recovery, ``connect``).
"""

# The carriers' ids a migration names (gateway.transport's), as this module has always
# exported them.
from gateway.transport import TRANSPORT_IDS as TRANSPORT_IDS

from ._client import (
    DEFAULT_REOPEN as DEFAULT_REOPEN,
    MAX_BACKOFF as MAX_BACKOFF,
    MIN_BACKOFF as MIN_BACKOFF,
    NnrpClient as NnrpClient,
    connect as connect,
)
from ._session import (
    MAX_ENDED_FRAMES as MAX_ENDED_FRAMES,
    ClientError as ClientError,
    ClientOperation as ClientOperation,
    ClientSession as ClientSession,
    ConnectionLost as ConnectionLost,
    ResumeTicket as ResumeTicket,
    resubmission as resubmission,
)
from ._trust import Trust as Trust
