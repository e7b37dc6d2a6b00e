"""nnrp-py's Rust-backed native client, as an independent peer for conformance runs,
benchmarks and tests. Imported lazily: nnrp-py is a test/tooling dependency, and the
serving path never imports it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def native_available() -> bool:
    try:
        import nnrp.client.native  # noqa: F401
    except ImportError:
        return False
    return True


def native_client_options(endpoint: str, *, trusted_der: bytes | None = None) -> Any:
    """NativeClientOptions reaching one of our ``tcp://``, ``unix://``, ``ws://`` or
    ``quic://`` listeners, forced onto that transport.

    QUIC is always TLS: the native client (rustls) trusts exactly ``trusted_der`` (the
    server's certificate or its CA, DER) and checks the endpoint's host as the server name
    (an IP address is checked against the certificate's IP entries).
    """
    from nnrp.client.native import NativeClientOptions, NativeClientProviderRoute
    from nnrp.core.messages import TransportPolicy

    if endpoint.startswith("quic://"):
        from nnrp.native import NativeTransportClientSecurity

        if trusted_der is None:
            raise ValueError(f"{endpoint}: the native QUIC client needs the server's trust "
                             "anchor (--ca-file)")
        address = endpoint.removeprefix("quic://")
        host = urlsplit(endpoint).hostname or "localhost"
        return NativeClientOptions(f"nnrp://{address}", provider_routes={
            "quic": NativeClientProviderRoute(
                provider_endpoint=endpoint,
                security=NativeTransportClientSecurity(server_name=host,
                                                       trusted_certificate_der=trusted_der))},
            transport_policy=TransportPolicy.FORCE_QUIC)
    if endpoint.startswith("tcp://"):
        return NativeClientOptions("nnrp://" + endpoint.removeprefix("tcp://"),
                                   transport_policy=TransportPolicy.FORCE_TCP)
    name = "ipc" if endpoint.startswith("unix://") else "websocket"
    policy = TransportPolicy.FORCE_IPC if name == "ipc" else TransportPolicy.FORCE_WEBSOCKET
    return NativeClientOptions("nnrp://gateway.local", provider_routes={
        name: NativeClientProviderRoute(provider_endpoint=endpoint)}, transport_policy=policy)


def native_openai_submit(operation_id: int, frame_id: int, payload: bytes, *,
                         trace_id: int = 0) -> Any:
    """The openai-compatible/1 request: one STRUCTURED_EVENT frame, profile 0, SNAPSHOT."""
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

    frame = TypedPayloadInputFrame(0, PayloadKind.STRUCTURED_EVENT, payload,
                                   stream_semantics=StreamSemantics.SNAPSHOT)
    return SubmitRequest.typed_payload(TypedPayloadSubmitInput(
        SubmitIdentity(operation_id, frame_id, SubmitHeaderContext(trace_id=trace_id)),
        SubmitPolicy(), (frame,)))
