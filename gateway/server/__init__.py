"""trio I/O for NNRP: listeners (tcp, unix, ws), connections, operations, shutdown."""

from ._auth import TokenAuthenticator as TokenAuthenticator
from ._connection import (
    Connection as Connection,
)
from ._connection import (
    ConnectionLimits as ConnectionLimits,
)
from ._connection import (
    RefusalHandler as RefusalHandler,
)
from ._connection import (
    ServerStats as ServerStats,
)
from ._listeners import ListenError as ListenError
from ._listeners import ListenSpec as ListenSpec
from ._listeners import parse_listen_uri as parse_listen_uri
from ._operation import (
    CancelInfo as CancelInfo,
)
from ._operation import (
    EndReason as EndReason,
)
from ._operation import (
    OperationContext as OperationContext,
)
from ._operation import (
    OperationHandler as OperationHandler,
)
from ._server import BoundEndpoint as BoundEndpoint
from ._server import GatewayServer as GatewayServer
from ._tls import TlsConfig as TlsConfig
from ._tls import load_tls as load_tls
from ._tls import server_context as server_context
