"""TLS for ``tcps://`` and ``wss://`` listeners: certificate and key files, optional client
certificate verification (mutual TLS), and reloading the files without a restart (SIGHUP):
the context is updated in place, so new handshakes use the new certificate and
established connections keep theirs."""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs


@attrs.frozen
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None  # set: clients must present a certificate it signed


def server_context(config: TlsConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_tls(context, config)
    return context


def load_tls(context: ssl.SSLContext, config: TlsConfig) -> None:
    """(Re)load the certificate chain and, for mTLS, the client CA into ``context``."""
    context.load_cert_chain(str(config.cert_file), str(config.key_file))
    if config.client_ca_file is not None:
        context.load_verify_locations(str(config.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
