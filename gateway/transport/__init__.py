"""Everything that moves bytes between the gateway and its NNRP clients.

Layout (the server's NNRP engine, ``gateway.server``, sits on top of it):

* ``_endpoints``: endpoint URIs (``parse_endpoint``, ``bound_uri``) and client options;
* ``_carriers``: ``PacketTransport`` and the stream carrier;
* ``_websocket``: the WebSocket carrier, server and client, on wsproto;
* ``_client``: ``connect``, the client side of every transport;
* ``_listeners``: binding listeners, once for every worker (``bind_shared``);
* ``_tls``: server TLS contexts, reloadable;
* ``_quic_settings``: QUIC listener settings and the ALPN policy (no aioquic);
* ``quic``: the QUIC pieces themselves (imports aioquic: only where QUIC is used),
  from ``_quic_endpoint`` (sans-IO), ``_quic_listener`` (trio) and ``_quic_client``.
"""

from ._carriers import (
    READ_SIZE as READ_SIZE,
    TRANSPORT_IDS as TRANSPORT_IDS,
    PacketTransport as PacketTransport,
    StreamTransport as StreamTransport,
    TextMessageError as TextMessageError,
    describe_peer as describe_peer,
    peer_address as peer_address,
    read_until_closed as read_until_closed,
    stream_credentials as stream_credentials,
    tune_tcp as tune_tcp,
)
from ._client import connect as connect
from ._endpoints import (
    Endpoint as Endpoint,
    ListenerFailed as ListenerFailed,
    ListenError as ListenError,
    QuicClientOptions as QuicClientOptions,
    bound_uri as bound_uri,
    fleet_uri as fleet_uri,
    format_host as format_host,
    parse_endpoint as parse_endpoint,
)
from ._listeners import (
    ACCEPT_BACKOFF as ACCEPT_BACKOFF,
    Inherited as Inherited,
    SharedListener as SharedListener,
    accept_failure_is_terminal as accept_failure_is_terminal,
    bind_shared as bind_shared,
    open_unix_listener as open_unix_listener,
)
from ._quic_settings import (
    NNRP_ALPN as NNRP_ALPN,
    AlpnPolicy as AlpnPolicy,
    QuicSettings as QuicSettings,
)
from ._tls import (
    TlsConfig as TlsConfig,
    TlsFileError as TlsFileError,
    load_tls as load_tls,
    server_context as server_context,
)
from ._websocket import (
    WebSocketRefused as WebSocketRefused,
    WebSocketTransport as WebSocketTransport,
)
