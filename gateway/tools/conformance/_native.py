"""nnrp-py's Rust-backed native client, as an independent peer for conformance runs,
benchmarks and tests. Imported lazily: nnrp-py is a test/tooling dependency, and the
serving path never imports it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit


def native_available() -> bool:
    try:
        import nnrp.client.native  # noqa: F401
    except ImportError:
        return False
    return True


#: rustls (webpki) will not take a CA certificate as the server's end-entity certificate
#: (CaUsedAsEndEntity): a self-signed certificate with CA:TRUE, which ``openssl req -x509``
#: makes by default, fails the native client's handshake as an opaque NativeInternalError
#: (detail_code 106); Python's ssl and aioquic accept it.
CA_ANCHOR_REFUSED = ("nnrp-py's native client (rustls) refuses a CA certificate as the "
                     "server's own; use --client builtin or a leaf without CA:TRUE")


def self_signed_ca(der: bytes) -> bool:
    """Whether ``der`` is a self-signed certificate with BasicConstraints CA:TRUE: given as
    the trust anchor, the native client refuses it when the server presents it as its own
    (see ``CA_ANCHOR_REFUSED``). A root CA that issued the server's certificate is such a
    certificate too; the builtin client serves both, so callers choosing a client by
    default take the builtin one."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    certificate = x509.load_der_x509_certificate(der)
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    if not constraints.value.ca or certificate.issuer != certificate.subject:
        return False
    try:
        certificate.verify_directly_issued_by(certificate)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def native_client_options(endpoint: str, *, trusted_der: bytes | None = None) -> Any:
    """NativeClientOptions reaching one of our listeners, forced onto its transport.

    TLS (``tcps://``, ``wss://``, ``quic://``): the native client (rustls) trusts exactly
    ``trusted_der`` (the server's certificate or its CA, DER), never the system's store,
    and checks the endpoint's host as the server name (an IP address against the
    certificate's IP entries). Its TLS routes need the secure application endpoint
    ``nnrps://``: a route with security under ``nnrp://``, or none under ``nnrps://``,
    is refused (``security-unsatisfied``), and a ``tcps://`` provider endpoint is not
    one it resolves (``route-unresolved``): TLS over TCP is its tcp provider with
    security, at ``tcp://host:port``.
    """
    from nnrp.client.native import NativeClientOptions, NativeClientProviderRoute
    from nnrp.core.messages import TransportPolicy

    scheme, rest = endpoint.split("://", 1)
    transport, policy = {
        "tcp": ("tcp", TransportPolicy.FORCE_TCP), "tcps": ("tcp", TransportPolicy.FORCE_TCP),
        "quic": ("quic", TransportPolicy.FORCE_QUIC),
        "unix": ("ipc", TransportPolicy.FORCE_IPC),
        "ws": ("websocket", TransportPolicy.FORCE_WEBSOCKET),
        "wss": ("websocket", TransportPolicy.FORCE_WEBSOCKET)}[scheme]
    if scheme in ("tcps", "wss", "quic"):
        from nnrp.native import NativeTransportClientSecurity

        if trusted_der is None:
            raise ValueError(f"{endpoint}: the native client over TLS needs the server's "
                             "trust anchor (--ca-file)")
        security = NativeTransportClientSecurity(
            server_name=urlsplit(endpoint).hostname or "localhost",
            trusted_certificate_der=trusted_der)
        provider_endpoint = f"tcp://{rest}" if scheme == "tcps" else endpoint
        return NativeClientOptions("nnrps://gateway.local", provider_routes={
            transport: NativeClientProviderRoute(provider_endpoint=provider_endpoint,
                                                 security=security)},
            transport_policy=policy)
    if scheme == "tcp":
        return NativeClientOptions(f"nnrp://{rest}", transport_policy=policy)
    return NativeClientOptions("nnrp://gateway.local", provider_routes={
        transport: NativeClientProviderRoute(provider_endpoint=endpoint)},
        transport_policy=policy)


def native_openai_submit(operation_id: int, frame_id: int, payload: bytes, *,
                         trace_id: int = 0, media: Sequence[tuple[Any, bytes]] = ()) -> Any:
    """The openai-compatible/1 request: one STRUCTURED_EVENT frame, profile 0, SNAPSHOT;
    then ``media``, (nnrp-py's payload kind, bytes) each, as the gateway's media frames
    (docs/media.md)."""
    from nnrp.client.transport import (
        SubmitHeaderContext,
        SubmitIdentity,
        SubmitPolicy,
        SubmitRequest,
        TypedPayloadInputFrame,
        TypedPayloadSubmitInput,
    )
    from nnrp.core.enums import PayloadKind
    from nnrp.schema import StreamSemantics

    frames = [TypedPayloadInputFrame(0, PayloadKind.STRUCTURED_EVENT, payload,
                                     stream_semantics=StreamSemantics.SNAPSHOT)]
    frames += [TypedPayloadInputFrame(0, kind, data) for kind, data in media]
    return SubmitRequest.typed_payload(TypedPayloadSubmitInput(
        SubmitIdentity(operation_id, frame_id, SubmitHeaderContext(trace_id=trace_id)),
        SubmitPolicy(), tuple(frames)))
