"""QUIC (``quic://``): the listener, its sans-IO endpoint and the client. Importing this
module imports aioquic; ``gateway.transport`` does not, so a gateway or client that never
speaks QUIC never loads it."""

from ._quic_client import (
    QuicClientTransport as QuicClientTransport,
    QuicConnectError as QuicConnectError,
    client_configuration as client_configuration,
    open_quic_transport as open_quic_transport,
)
from ._quic_endpoint import (
    QuicEndpoint as QuicEndpoint,
    QuicPeer as QuicPeer,
    QuicStats as QuicStats,
    RoutingTable as RoutingTable,
    feed_datagram as feed_datagram,
    server_configuration as server_configuration,
)
from ._quic_listener import QuicListener as QuicListener, QuicTransport as QuicTransport
