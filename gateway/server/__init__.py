"""The NNRP engine: the server over its listeners, connections, sessions, operations and
graceful shutdown. What moves the bytes (listeners, TLS, QUIC, carriers) is
``gateway.transport``. It knows neither the upstream nor its observers: the operation
handler, the observer and the class of each operation's notes are handed to
``GatewayServer`` (``gateway.app`` wires the vLLM pipeline and the observation record)."""

from ._auth import AuthSourceError as AuthSourceError, TokenAuthenticator as TokenAuthenticator
from ._connection import (
    Connection as Connection,
    ConnectionLimits as ConnectionLimits,
    RefusalHandler as RefusalHandler,
)
from ._notes import OperationNotes as OperationNotes
from ._operation import (
    CancelInfo as CancelInfo,
    Operation as Operation,
    OperationHandler as OperationHandler,
    OperationPort as OperationPort,
)
from ._resume import SessionRegistry as SessionRegistry
from ._server import BoundEndpoint as BoundEndpoint, GatewayServer as GatewayServer
from ._session import (
    Observer as Observer,
    PartialObserver as PartialObserver,
    Session as Session,
    observe_partials as observe_partials,
)
from ._stats import ServerStats as ServerStats
