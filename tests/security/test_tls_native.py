"""nnrp-py's native (Rust, rustls) client over TLS against our tcps:// listener.

Its transport takes a server name and a trusted certificate (DER) and offers no client
certificate, so server-authenticated TLS is the interop path; mutual TLS is covered with
the project's client in test_tls_auth.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from nnrp.client.native import (
    NativeClientOptions,
    NativeClientProviderRoute,
    NativeClientSessionOptions,
    connect_native_client_connection,
)
from nnrp.core.messages import TransportPolicy
from nnrp.native import NativeTransportClientSecurity

from gateway.transport import TlsConfig
from tests.support.native import openai_submit, poll_until
from tests.support.tls import start, uri

pytestmark = pytest.mark.interop


def _der(pem: Path) -> bytes:
    return x509.load_pem_x509_certificate(pem.read_bytes()).public_bytes(
        serialization.Encoding.DER)


async def test_native_client_over_tls(nursery: trio.Nursery, tmp_path: Path,
                                      pki: dict[str, Path]) -> None:
    gateway = await start(nursery, tmp_path, tls=TlsConfig(pki["server"], pki["server_key"]))
    address = uri(gateway, "tcps").removeprefix("tcps://")
    security = NativeTransportClientSecurity(server_name="127.0.0.1",
                                             trusted_certificate_der=_der(pki["ca"]))
    options = NativeClientOptions(
        f"nnrps://{address}", provider_routes={"tcp": NativeClientProviderRoute(
            provider_endpoint=f"tcp://{address}", security=security)},
        transport_policy=TransportPolicy.FORCE_TCP)

    def scenario() -> list[dict[str, Any]]:
        with connect_native_client_connection(options) as connection:
            session = asyncio.run(connection.open_session(NativeClientSessionOptions()))
            session.submit_operation(openai_submit(1, 1, (
                b'{"schema_version":"openai-compatible/1","operation":"chat.completions.create",'
                b'"body":{"model":"example-model","messages":[{"role":"user","content":"x"}],'
                b'"stream":true,"max_tokens":3}}')))
            events = poll_until(session, lambda evs: any(
                e["kind"] == "RESULT_PUSH" for e in evs), timeout=15)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    kinds = [e["kind"] for e in events if e["kind"] != "lifecycle"]
    assert kinds == ["PARTIAL_RESULT"] * 3 + ["RESULT_PUSH"]
    assert events[-1]["payload"]["type"] == "response.completed"
