"""TLS for ``tcps://`` and ``wss://`` listeners: certificate and key files, optional client
certificate verification (mutual TLS), and reloading the files without a restart (SIGHUP):
the context is updated in place, so new handshakes use the new certificate and
established connections keep theirs."""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs

from gateway.errors import ConfigError


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


class TlsFileError(ConfigError):
    """A certificate, key or CA file that cannot serve: which file, and why (OpenSSL's
    own "[SSL] PEM lib" names neither). ``role``: "certificate", "private key" or
    "client CA", the file at fault."""

    def __init__(self, role: str, message: str) -> None:
        super().__init__(message)
        self.role = role


_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"


def _check_pem(path: Path, role: str, marker: bytes) -> None:
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise TlsFileError(role, f"{role} {path}: "
                                 f"{(exc.strerror or str(exc)).lower()}") from None
    if marker not in content:
        raise TlsFileError(role, f"{role} {path}: not PEM (no "
                                 f"{marker.decode().strip('-')} block)")


def _no_passphrase() -> bytes:
    # OpenSSL would otherwise prompt on the terminal of a daemon.
    raise TlsFileError("private key", "encrypted private keys are not supported")


def load_tls(context: ssl.SSLContext, config: TlsConfig) -> None:
    """(Re)load the certificate chain and, for mTLS, the client CA into ``context``;
    ``TlsFileError`` names the file at fault. Every file is read and checked before the
    context changes, so a bad file on a reload (SIGHUP) leaves the context as it was."""
    _check_pem(config.cert_file, "certificate", _CERTIFICATE)
    _check_pem(config.key_file, "private key", _PRIVATE_KEY)
    if config.client_ca_file is not None:
        _check_pem(config.client_ca_file, "client CA", _CERTIFICATE)
        try:  # on a scratch context first: a CA OpenSSL refuses changes nothing
            ssl.create_default_context(cafile=str(config.client_ca_file))
        except ssl.SSLError as exc:
            raise TlsFileError("client CA", f"client CA {config.client_ca_file}: cannot be "
                                            f"loaded ({exc.reason})") from None
    try:  # on a scratch context too: OpenSSL may take the chain and then refuse the key
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            str(config.cert_file), str(config.key_file), password=_no_passphrase)
    except ssl.SSLError as exc:
        why = ("the private key does not match the certificate"
               if exc.reason == "KEY_VALUES_MISMATCH" else f"cannot be loaded ({exc.reason})")
        raise TlsFileError("private key", f"{why}: certificate {config.cert_file}, private "
                                          f"key {config.key_file}") from None
    except TlsFileError as exc:
        raise TlsFileError(exc.role, f"private key {config.key_file}: {exc}") from None
    context.load_cert_chain(str(config.cert_file), str(config.key_file),
                            password=_no_passphrase)
    if config.client_ca_file is not None:
        context.load_verify_locations(str(config.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
