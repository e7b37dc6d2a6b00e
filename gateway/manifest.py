"""The wire target manifest (schema ``wire-conformance-target``) a suite runner polls for:
what ``serve --target-manifest`` writes once its listeners are bound (stdlib only; the
conformance tools, ``gateway.tools.conformance``, read it and re-export it).

Rules from the schema, per listener scheme:

| scheme  | manifest transport | tls   | endpoint written    | security block          |
|---------|--------------------|-------|---------------------|-------------------------|
| tcp     | tcp                | false | ``host:port``       | none                    |
| unix    | ipc                | false | ``unix:///path``    | none                    |
| ws      | websocket          | false | ``ws://...``        | none                    |
| wss     | websocket          | true  | ``wss://...``       | DER files (below)       |
| quic    | quic               | true  | ``host:port``       | DER files (below)       |
| tcps    | (host-route provider tcp, security mode ``tls_server_auth``)                 |

The schema's ``transports`` hold tcp with ``tls: false`` only; TLS over TCP has one form
there, the tcp provider of ``host_route_providers`` with the ``tls_server_auth`` mode,
which is where a tcps listener is listed (and which the host-route scenarios run:
gateway/tools/conformance/_host_route.py).

The security block names DER files: the runner trusts ``trusted_certificate_der_path`` and
checks ``server_name``. They are written next to the manifest from the serving PEM files:
the leaf certificate, the last certificate of the chain as the trust anchor (the leaf
itself when self-signed), and the key, which must be PKCS#8 (``BEGIN PRIVATE KEY``).

``server_name`` is a name the certificate holds, never the bind address (a wildcard
such as ``0.0.0.0`` is no name any certificate check accepts): ``--tls-server-name``
when given, else the listener's host when the certificate holds it, else the
certificate's first DNS name, else its first IP address, else its common name. A TLS
listener bound on a wildcard address is written with that name as its host too (quic's
``host:port``, wss's URI): the address a runner dials is the one it checks.

Capabilities: the openai-compatible level-1 wire profile, the runtime tokens the server
implements (``ServerConfig.runtime_tokens``: the list capability negotiation grants and
``gateway.capabilities`` publishes), ``host.routes`` with the four providers the gateway
binds (``host_route_providers``: the server-role scenarios the conformance tools run),
and ``extension.<name>`` for each declared profile extension of the capability document
(all non-critical: clients may ignore them).
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SUITE_VERSION = "0.1.0"
LEVEL1_WIRE = "profile.openai-compatible.level1.wire"
HOST_ROUTES = "host.routes"
#: The suite's provider ids for the four transports, as nnrp-rs and nnrp-py name them.
PROVIDERS = {"tcp": "nnrp.transport.tcp.native", "quic": "nnrp.transport.quic.native",
             "ipc": "nnrp.transport.ipc.native",
             "websocket": "nnrp.transport.websocket.native"}
#: Security modes each provider serves (the target manifest's ``host_route_providers``):
#: tcps is tcp with ``tls_server_auth``, the only form the schema has for it.
SECURITY_MODES = {"tcp": ["plain", "tls_server_auth"], "quic": ["tls_server_auth"],
                  "ipc": ["plain"], "websocket": ["plain", "wss"]}
#: Bind addresses that name no host: never a server name.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})

#: Listener scheme -> the suite's transport name (and whether it is TLS).
_TRANSPORTS = {"tcp": ("tcp", False), "unix": ("ipc", False), "ws": ("websocket", False),
               "wss": ("websocket", True), "quic": ("quic", True), "tcps": ("tcp", True)}
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----\s+(.+?)\s+-----END \1-----", re.S)


def host_route_providers() -> list[dict[str, Any]]:
    """The target manifest's ``host_route_providers``: every transport the gateway binds,
    with every security mode it serves, whatever the gateway was started with: tcp's
    ``tls_server_auth`` and quic are claimed even when ``serve`` has no certificate,
    since the host-route scenarios run the host-route target (a gateway of its own),
    which serves the runner's certificate (``server.der``), not the serving one."""
    return [{"transport": transport, "provider_id": provider, "installed": True,
             "platforms": ["native"], "security_modes": SECURITY_MODES[transport]}
            for transport, provider in PROVIDERS.items()]


class ManifestError(ValueError):
    """A listener the manifest cannot describe as the schema requires."""


def transport_of(endpoint: str) -> str:
    """The suite's transport name for one of our listener URIs."""
    scheme = endpoint.split("://", 1)[0]
    if scheme not in _TRANSPORTS:
        raise ManifestError(f"unknown listener scheme {scheme!r} in {endpoint}")
    return _TRANSPORTS[scheme][0]


def target_manifest(endpoints: Iterable[str], *, target_name: str, max_frame_bytes: int,
                    max_in_flight: int, runtime_tokens: Iterable[str] = (),
                    extensions: Iterable[str] = (),
                    tls_files: tuple[Path, Path] | None = None,
                    security_dir: Path | None = None,
                    server_name: str | None = None) -> dict[str, Any]:
    """The manifest for bound listeners. TLS listeners need ``tls_files`` (the serving
    certificate chain and key, PEM) and ``security_dir`` (where the DER copies go);
    ``server_name`` overrides the name read from the certificate (module rules)."""
    transports = []
    security: dict[str, str] | None = None
    for endpoint in endpoints:
        scheme = endpoint.split("://", 1)[0]
        name = transport_of(endpoint)
        tls = _TRANSPORTS[scheme][1]
        if scheme == "tcps":
            continue  # the tcp provider's tls_server_auth (module table)
        locator = endpoint.split("://", 1)[1] if scheme in ("tcp", "quic") else endpoint
        entry: dict[str, Any] = {"name": name, "endpoint": locator, "tls": tls}
        if tls:
            if tls_files is None or security_dir is None:
                raise ManifestError(f"{endpoint} is TLS: the manifest needs its certificate")
            if security is None:
                security = write_security_files(*tls_files, security_dir)
            host = urlsplit(endpoint).hostname or ""
            name_checked = server_name_for(host, tls_files[0], server_name)
            if host in WILDCARD_HOSTS:
                entry["endpoint"] = _with_host(locator, host, name_checked)
            entry["security"] = {"server_name": name_checked, **security}
        transports.append(entry)
    return {"$schema": "../schemas/wire-conformance-target.schema.json",
            "target_name": target_name, "protocol_version": "nnrp-1-preview4",
            "suite_version": SUITE_VERSION,
            "wire_conformance": {"modes": ["suite_as_client"], "transports": transports,
                                 "host_route_providers": host_route_providers(),
                                 "capabilities": [
                                     LEVEL1_WIRE, *sorted(set(runtime_tokens)), HOST_ROUTES,
                                     *(f"extension.{name}" for name in sorted(extensions))],
                                 "limits": {"max_frame_bytes": max_frame_bytes,
                                            "max_in_flight": max_in_flight}}}


def _with_host(locator: str, wildcard: str, name: str) -> str:
    """``locator`` (``host:port`` or a URI) dialling ``name`` instead of the wildcard
    address it was bound on (module rules: nothing dials or checks ``0.0.0.0``)."""
    bound = f"[{wildcard}]" if ":" in wildcard else wildcard
    dialled = f"[{name}]" if ":" in name else name
    prefix, _, rest = locator.rpartition("://")
    return (f"{prefix}://" if prefix else "") + rest.replace(f"{bound}:", f"{dialled}:", 1)


def certificate_names(cert_file: Path) -> tuple[list[str], list[str], str | None]:
    """The leaf certificate's DNS names, IP addresses and common name."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    blocks = _pem_blocks(cert_file.read_bytes(), "CERTIFICATE", whole=True)
    if not blocks:
        raise ManifestError(f"{cert_file} holds no PEM certificate")
    leaf = x509.load_pem_x509_certificate(blocks[0])
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns, ips = names.get_values_for_type(x509.DNSName), [
            str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        dns, ips = [], []
    common = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return dns, ips, str(common[0].value) if common else None


def server_name_for(host: str, cert_file: Path, given: str | None = None) -> str:
    """The name a runner checks the certificate against (module rules)."""
    if given is not None:
        if given in WILDCARD_HOSTS:
            raise ManifestError(f"--tls-server-name {given!r} is a wildcard address, not a "
                                "name a certificate holds")
        return given
    dns, ips, common = certificate_names(cert_file)
    if host not in WILDCARD_HOSTS and (host in dns or host in ips):
        return host
    for name in (*dns, *ips, common):
        if name and name not in WILDCARD_HOSTS and "*" not in name:
            return name
    raise ManifestError(f"{cert_file} names no host a client could check (no DNS name, IP "
                        "address or common name); give --tls-server-name")


def write_security_files(cert_file: Path, key_file: Path, directory: Path) -> dict[str, str]:
    """DER copies of the serving certificate, its trust anchor and its PKCS#8 key."""
    certificates = [ssl.PEM_cert_to_DER_cert(block.decode()) for block in
                    _pem_blocks(cert_file.read_bytes(), "CERTIFICATE", whole=True)]
    if not certificates:
        raise ManifestError(f"{cert_file} holds no PEM certificate")
    keys = _pem_blocks(key_file.read_bytes(), "PRIVATE KEY", whole=False)
    if not keys:
        raise ManifestError(f"{key_file} is not a PKCS#8 key (BEGIN PRIVATE KEY); convert "
                            "it with: openssl pkcs8 -topk8 -nocrypt")
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"trusted_certificate_der_path": ("trusted.der", certificates[-1]),
             "certificate_der_path": ("certificate.der", certificates[0]),
             "private_key_pkcs8_der_path": ("key.pk8.der", keys[0])}
    for name, data in paths.values():
        # Owner-only from the first byte (the key is a copy of the serving key).
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    return {field: str((directory / name).resolve()) for field, (name, _) in paths.items()}


def _pem_blocks(data: bytes, label: str, *, whole: bool) -> list[bytes]:
    """The PEM blocks labelled ``label``: whole (for ssl) or base64-decoded (DER)."""
    out = []
    for match in _PEM_BLOCK.finditer(data):
        if match.group(1).decode() == label:
            out.append(match.group(0) if whole else base64.b64decode(match.group(2)))
    return out


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """Readers polling for ``path`` (the suite's readiness signal) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False,
                                     suffix=".tmp") as handle:
        handle.write(json.dumps(document, indent=2) + "\n")
        temporary = handle.name
    os.replace(temporary, path)
