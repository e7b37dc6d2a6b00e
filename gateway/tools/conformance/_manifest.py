"""The wire target manifest (schema ``wire-conformance-target``) a suite runner polls for.

Rules from the schema, per listener scheme:

| scheme  | manifest transport | tls   | endpoint written    | security block          |
|---------|--------------------|-------|---------------------|-------------------------|
| tcp     | tcp                | false | ``host:port``       | none                    |
| unix    | ipc                | false | ``unix:///path``    | none                    |
| ws      | websocket          | false | ``ws://...``        | none                    |
| wss     | websocket          | true  | ``wss://...``       | DER files (below)       |
| quic    | quic               | true  | ``host:port``       | DER files (below)       |
| tcps    | (not listed)       |       |                     | the schema has no TLS tcp |

The security block names DER files: the runner trusts ``trusted_certificate_der_path`` and
checks ``server_name``. They are written next to the manifest from the serving PEM files:
the leaf certificate, the last certificate of the chain as the trust anchor (the leaf
itself when self-signed), and the key, which must be PKCS#8 (``BEGIN PRIVATE KEY``).

Capabilities: the openai-compatible level-1 wire profile, the runtime tokens the server
implements (``ServerConfig.runtime_tokens``: the list capability negotiation grants and
``gateway.capabilities`` publishes), and ``extension.<name>`` for each declared profile
extension of the capability document (all non-critical: clients may ignore them).
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

#: Listener scheme -> the suite's transport name (and whether it is TLS).
_TRANSPORTS = {"tcp": ("tcp", False), "unix": ("ipc", False), "ws": ("websocket", False),
               "wss": ("websocket", True), "quic": ("quic", True), "tcps": ("tcp", True)}
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----\s+(.+?)\s+-----END \1-----", re.S)


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
                    security_dir: Path | None = None) -> dict[str, Any]:
    """The manifest for bound listeners. TLS listeners need ``tls_files`` (the serving
    certificate chain and key, PEM) and ``security_dir`` (where the DER copies go);
    ``tcps`` listeners are left out (see the table above)."""
    transports = []
    security: dict[str, str] | None = None
    for endpoint in endpoints:
        scheme = endpoint.split("://", 1)[0]
        name = transport_of(endpoint)
        tls = _TRANSPORTS[scheme][1]
        if scheme == "tcps":
            continue
        locator = endpoint.split("://", 1)[1] if scheme in ("tcp", "quic") else endpoint
        entry: dict[str, Any] = {"name": name, "endpoint": locator, "tls": tls}
        if tls:
            if tls_files is None or security_dir is None:
                raise ManifestError(f"{endpoint} is TLS: the manifest needs its certificate")
            if security is None:
                security = write_security_files(*tls_files, security_dir)
            host = urlsplit(endpoint).hostname or "localhost"
            entry["security"] = {"server_name": host, **security}
        transports.append(entry)
    return {"$schema": "../schemas/wire-conformance-target.schema.json",
            "target_name": target_name, "protocol_version": "nnrp-1-preview4",
            "suite_version": SUITE_VERSION,
            "wire_conformance": {"modes": ["suite_as_client"], "transports": transports,
                                 "capabilities": [
                                     LEVEL1_WIRE, *sorted(set(runtime_tokens)),
                                     *(f"extension.{name}" for name in sorted(extensions))],
                                 "limits": {"max_frame_bytes": max_frame_bytes,
                                            "max_in_flight": max_in_flight}}}


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
