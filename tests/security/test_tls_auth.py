"""Who gets in: TLS (tcps://, wss://), mutual TLS, certificate reload, session tokens."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest
import structlog
import trio
from cryptography import x509
from cryptography.x509.oid import NameOID

from gateway.nnrp import ServerConfig
from gateway.server import AuthSourceError, TokenAuthenticator
from gateway.tools.client import ClientError, Trust, connect
from gateway.transport import TlsConfig
from tests.support.stack import chat, envelope, run_operation, start_stack
from tests.support.tls import client_context, start, uri


@pytest.mark.parametrize("scheme", ["tcps", "wss"])
async def test_tls_listeners_stream(nursery: trio.Nursery, tmp_path: Path,
                                    pki: dict[str, Path], scheme: str) -> None:
    gateway = await start(nursery, tmp_path, tls=TlsConfig(pki["server"], pki["server_key"]))
    async with connect(uri(gateway, scheme),
                       ssl_context=client_context(pki, with_cert=False)) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(stream=True, max_tokens=3)))
    assert outcome.types == ["response.output_text.delta"] * 3
    assert outcome.final["type"] == "response.completed"


async def test_plaintext_client_on_tls_port_is_refused(nursery: trio.Nursery, tmp_path: Path,
                                                      pki: dict[str, Path]) -> None:
    gateway = await start(nursery, tmp_path, tls=TlsConfig(pki["server"], pki["server_key"]))
    plain = uri(gateway, "tcps").replace("tcps://", "tcp://")
    with trio.fail_after(5), pytest.raises((ClientError, trio.BrokenResourceError,
                                            trio.TooSlowError, OSError)):
        async with connect(plain, handshake_timeout=2):
            pass


async def test_mutual_tls_requires_a_client_certificate(nursery: trio.Nursery, tmp_path: Path,
                                                        pki: dict[str, Path]) -> None:
    gateway = await start(nursery, tmp_path, tls=TlsConfig(pki["server"], pki["server_key"],
                                                           pki["ca"]))
    async with connect(uri(gateway, "tcps"),
                       ssl_context=client_context(pki, with_cert=True)) as client:
        session = await client.open_session()
        assert (await run_operation(session, envelope(chat()))).final["type"] == (
            "response.completed")
    with trio.fail_after(5), pytest.raises((ClientError, trio.BrokenResourceError, OSError,
                                            ssl.SSLError)):
        async with connect(uri(gateway, "tcps"), handshake_timeout=2,
                           ssl_context=client_context(pki, with_cert=False)) as client:
            await client.open_session()


async def test_certificate_reload(nursery: trio.Nursery, tmp_path: Path,
                                  pki: dict[str, Path]) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki["server"].read_bytes())
    key.write_bytes(pki["server_key"].read_bytes())
    gateway = await start(nursery, tmp_path, tls=TlsConfig(cert, key))

    async def served_subject() -> str:
        async with connect(uri(gateway, "tcps"),
                           ssl_context=client_context(pki, with_cert=False)) as client:
            stream = client.transport.stream  # type: ignore[attr-defined]
            der = stream.getpeercert(binary_form=True)
        subject = x509.load_der_x509_certificate(der).subject
        return str(subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)

    assert await served_subject() == "server"
    cert.write_bytes(pki["server2"].read_bytes())
    key.write_bytes(pki["server2_key"].read_bytes())
    gateway.reload_tls()  # what SIGHUP does
    assert await served_subject() == "server2"
    key.write_text("not a key")
    gateway.reload_tls()  # a bad file keeps the old certificate
    assert await served_subject() == "server2"


async def test_session_tokens(nursery: trio.Nursery, tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# team tokens\nsecond-token-456\n")
    authenticate = TokenAuthenticator.from_sources(["first-token-123"], token_file)
    assert authenticate is not None
    assert "first-token" not in repr(authenticate)
    gateway = await start(nursery, tmp_path,
                          server=ServerConfig(authenticate=authenticate), metrics=True)
    endpoint = uri(gateway, "tcp")
    with structlog.testing.capture_logs() as logs:
        async with connect(endpoint) as client:
            with pytest.raises(ClientError, match="0x10001"):
                await client.open_session(auth=b"wrong-token")
            with pytest.raises(ClientError, match="0x10001"):
                await client.open_session()
            for token in (b"first-token-123", b"second-token-456"):
                session = await client.open_session(auth=token)
                outcome = await run_operation(session, envelope(chat()))
                assert outcome.final["type"] == "response.completed"
    assert gateway.server.stats.auth_failures == 2
    dump = json.dumps(logs, default=str)
    assert "wrong-token" not in dump
    assert "first-token" not in dump
    assert any(line["event"] == "session authentication failed" for line in logs)
    from prometheus_client import generate_latest

    assert b"nnrp_gateway_auth_failures_total 2.0" in generate_latest(gateway.metrics.registry)


def test_authenticator_rules() -> None:
    assert TokenAuthenticator.from_sources([], None) is None
    with pytest.raises(ValueError, match="non-empty"):
        TokenAuthenticator([b""])
    check = TokenAuthenticator([b"a" * 32, b"b" * 32])
    assert check(b"b" * 32)
    assert not check(b"b" * 31)
    assert not check(b"")


@pytest.mark.parametrize("scheme", ["tcps", "wss", "quic"])
async def test_a_ca_issued_certificate_as_the_ca_file(nursery: trio.Nursery, tmp_path: Path,
                                                      pki: dict[str, Path], scheme: str
                                                      ) -> None:
    """Issue 26 review: --ca-file's help says "the server's certificate or its CA", but the
    server's own certificate, issued by a CA, failed ("unable to get local issuer
    certificate"). On tcps and wss the tools' trust now takes it as the anchor it was
    given (a partial chain); aioquic builds its own store with no such flag, so quic still
    wants the CA, as the help now says."""
    stack = await start_stack(nursery, tmp_path, extra_listen=(
        "quic://127.0.0.1:0", "tcps://127.0.0.1:0", "wss://127.0.0.1:0/nnrp"),
        tls=TlsConfig(pki["server"], pki["server_key"]))
    (endpoint,) = [e.uri for e in stack.gateway.endpoints if e.uri.startswith(f"{scheme}:")]
    leaf = Trust(pki["server"])
    if scheme == "quic":
        with trio.fail_after(10), pytest.raises(
                OSError, match="unable to get local issuer certificate"):
            async with connect(endpoint, quic=leaf.quic(), handshake_timeout=5):
                pass
        return
    with trio.fail_after(10):
        async with connect(endpoint, ssl_context=leaf.ssl_context()) as client:
            session = await client.open_session()
            outcome = await run_operation(session, envelope(chat(max_tokens=2)))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"


@pytest.mark.parametrize(("tokens", "file_text", "option"), [
    ([""], None, "auth_token"),
    (["  "], None, "auth_token"),
    (["good-token-1234"], "", "auth_token_file"),  # an empty Kubernetes Secret key
    ([], "# tokens\n\n#   none yet\n", "auth_token_file"),
])
def test_a_source_given_that_holds_no_token_fails_closed(
        tmp_path: Path, tokens: list[str], file_text: str | None, option: str) -> None:
    """An auth option that was given never means authentication off (the gateway does
    not start; the CLI says which option, exit 2: tests/cli/test_bad_input.py)."""
    token_file = None
    if file_text is not None:
        token_file = tmp_path / "tokens"
        token_file.write_text(file_text)
    with pytest.raises(AuthSourceError) as refused:
        TokenAuthenticator.from_sources(tokens, token_file)
    assert refused.value.option == option
