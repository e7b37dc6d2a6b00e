"""A throwaway PKI and TLS gateways for the security tests (cryptography comes with
nnrp-py's dependencies)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.app import Gateway, GatewayConfig
from gateway.tools.replay import ReplayServer

if TYPE_CHECKING:
    import trio


def _name(common: str) -> Any:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(subject: str, issuer_key: Any, issuer: str, *, ca: bool = False,
           server: bool = False) -> tuple[Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256()), key


def _write(folder: Path, name: str, cert: Any, key: Any) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def make_pki(folder: Path) -> dict[str, Path]:
    """A CA, two server certificates for 127.0.0.1 and a client certificate, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca, _ = _issue("test-ca", ca_key, "test-ca", ca=True)
    ca = x509.CertificateBuilder().subject_name(_name("test-ca")).issuer_name(_name("test-ca")) \
        .public_key(ca_key.public_key()).serial_number(1) \
        .not_valid_before(datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)) \
        .not_valid_after(datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)) \
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True) \
        .sign(ca_key, hashes.SHA256())
    paths = {}
    paths["ca"], _ = _write(folder, "ca", ca, ca_key)
    for name, server in (("server", True), ("server2", True), ("client", False)):
        cert, key = _issue(name, ca_key, "test-ca", server=server)
        paths[name], paths[f"{name}_key"] = _write(folder, name, cert, key)
    return paths


def client_context(pki: dict[str, Path], *, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if with_cert:
        context.load_cert_chain(str(pki["client"]), str(pki["client_key"]))
    return context


async def start(nursery: trio.Nursery, tmp_path: Path, **config: Any) -> Gateway:
    replay = ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    listen = (("tcps://127.0.0.1:0", "wss://127.0.0.1:0/nnrp") if "tls" in config else ()) + (
        "tcp://127.0.0.1:0",)
    gateway = Gateway(GatewayConfig(listen=listen, vllm_url=url, probe_interval=0.05,
                                    **config))
    await nursery.start(gateway.run)
    await gateway.probed.wait()
    return gateway


def uri(gateway: Gateway, scheme: str) -> str:
    return next(e.uri for e in gateway.endpoints if e.uri.startswith(f"{scheme}://"))
