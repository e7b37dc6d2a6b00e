"""What the tools trust on a TLS endpoint (``--ca-file``), in the form each client takes."""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs

from gateway.transport import QuicClientOptions


@attrs.frozen
class Trust:
    """What the tools trust on a TLS endpoint (tcps://, wss://, quic://): the PEM file of
    ``--ca-file``, or the system's store (None). On tcps and wss the file may hold the
    server's own certificate, a CA-issued one too, or its CA (partial chains are
    accepted); on quic, aioquic builds its own store with no such flag: its CA, or the
    server's certificate when that is self-signed.
    One file serves every client: an ``ssl.SSLContext`` for tcps/wss, aioquic's own store
    for quic, DER for nnrp-py's native client. ``auth``: the token the tools' sessions
    present in SESSION_OPEN (``--auth-token``; nnrp-py's native client has no way to)."""

    ca_file: Path | None = None
    auth: bytes = attrs.field(default=b"", repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file))
        # The file given as the trust anchor is trusted as one, even when it is a leaf
        # its CA issued (OpenSSL otherwise wants a self-signed root at the chain's end:
        # "unable to get local issuer certificate").
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        return context

    def quic(self) -> QuicClientOptions:
        return QuicClientOptions(ca_file=self.ca_file)

    def certificate_der(self) -> bytes | None:
        """The file's first certificate, DER (nnrp-py's native QUIC client trusts one)."""
        if self.ca_file is None:
            return None
        text = self.ca_file.read_text()
        begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
        if begin not in text:
            raise ValueError(f"{self.ca_file} holds no PEM certificate")
        start = text.index(begin)
        return ssl.PEM_cert_to_DER_cert(text[start:text.index(end, start) + len(end)])
