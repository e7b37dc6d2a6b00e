"""trio I/O for NNRP: listeners (tcp, unix, ws and their TLS forms, quic), connections,
sessions, operations, graceful shutdown. Transports themselves: ``gateway.transport``."""

from ._auth import TokenAuthenticator as TokenAuthenticator
from ._connection import (
    Connection as Connection,
    ConnectionLimits as ConnectionLimits,
    RefusalHandler as RefusalHandler,
)
from ._listeners import (
    Inherited as Inherited,
    SharedListener as SharedListener,
    bind_shared as bind_shared,
)
from ._operation import (
    CancelInfo as CancelInfo,
    Operation as Operation,
    OperationHandler as OperationHandler,
    OperationPort as OperationPort,
)
from ._quic_settings import AlpnPolicy as AlpnPolicy, QuicSettings as QuicSettings
from ._server import BoundEndpoint as BoundEndpoint, GatewayServer as GatewayServer
from ._session import Observer as Observer, Session as Session
from ._stats import ServerStats as ServerStats
from ._tls import TlsConfig as TlsConfig, load_tls as load_tls, server_context as server_context
