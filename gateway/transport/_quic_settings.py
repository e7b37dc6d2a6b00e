"""What a ``quic://`` listener accepts: the ALPN policy and the listener's limits.

Plain data without aioquic, so configuration and the command line never import it; the
endpoint is ``_quic_endpoint.py``, the listener ``_quic_listener.py``.
"""

from __future__ import annotations

from enum import Enum

import attrs

from ._tls import TlsConfig

#: The ALPN older SDKs offer (nnrp-core constant; docs/reference/nnrp-wire.md section 1).
NNRP_ALPN = "nnrp/1"
#: The client's first bidirectional stream carries the NNRP byte stream (both sides).
NNRP_STREAM_ID = 0
#: Largest UDP payload: anything longer is not a datagram either side could be sent.
MAX_DATAGRAM = 65535


class AlpnPolicy(Enum):
    """Which ALPN offers a ClientHello may carry.

    * ``ANY`` (default): either of the two below; ``nnrp/1`` is selected when offered.
    * ``NONE``: the client offers no ALPN at all (nnrp-py's native client).
    * ``NNRP``: the client must offer ``nnrp/1`` (the spec's ALPN, docs/reference/nnrp-wire.md
    section
      1; older SDKs); it is selected.

    Why ``ANY`` is the default: the spec names ``nnrp/1``, and nnrp-py's native client
    (quinn + rustls, the suite's reference peer) offers no ALPN at all. A server that
    picks one of them refuses the other's every handshake; accepting both refuses no
    NNRP client and still refuses a client that offers only something else (``h3``).

    Any other offer (``h3`` alone, say) ends the handshake with no_application_protocol.
    """

    NONE = "none"
    NNRP = "nnrp/1"
    ANY = "any"

    def server_protocols(self, offered: list[str] | None) -> list[str] | None:
        """What aioquic's negotiation should see as the server's list for this offer.

        aioquic 1.7.2 (``tls.Context._server_handle_hello``) negotiates only when the server
        list is not None, and raises no_application_protocol when nothing in it was
        offered (including no offer at all). So: None skips ALPN (no offer, accepted),
        ``["nnrp/1"]`` selects it (or refuses a client that offered nothing), and ``[]``
        refuses whatever was offered.
        """
        if offered is None:
            return None if self is not AlpnPolicy.NNRP else [NNRP_ALPN]
        if self is not AlpnPolicy.NONE and NNRP_ALPN in offered:
            return [NNRP_ALPN]
        return []



@attrs.frozen
class QuicSettings:
    """How a ``quic://`` listener behaves; the certificate files are the tcps:// ones.

    Args:
        tls: certificate chain and key (PEM). Mutual TLS is refused at bind time.
        alpn: which ALPN offers are accepted (``AlpnPolicy``).
        idle_timeout: QUIC idle timeout; a peer silent this long is gone (its operations
            end). While the NNRP connection is open the server pings every third of it,
            so a live client with a longer timeout of its own is never cut.
        handshake_timeout: a QUIC connection whose TLS handshake has not completed by then
            is closed and its slot freed (the NNRP handshake has its own timeout after).
        max_connections: QUIC connections (handshaking or established) per listener;
            Initials beyond it are dropped without making state.
        retry_threshold: handshakes in progress (or new token-less Initials within one
            second) from which new clients must prove their address with a Retry round
            trip; 0: always, None: never.
        max_streams_bidi: bidirectional streams a client may have open (we use one).
        receive_window: stream credit beyond what the NNRP connection has read.
        send_buffer: bytes written to the NNRP stream and not yet acknowledged, beyond
            which ``send()`` waits.
        close_linger: how long closing waits for the peer to acknowledge what was sent.
    """

    tls: TlsConfig
    alpn: AlpnPolicy = AlpnPolicy.ANY
    idle_timeout: float = 30.0
    handshake_timeout: float = 10.0
    max_connections: int = 1024
    retry_threshold: int | None = 64
    max_streams_bidi: int = 4
    receive_window: int = 256 * 1024
    send_buffer: int = 512 * 1024
    close_linger: float = 1.0
