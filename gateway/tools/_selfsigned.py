"""A throwaway self-signed ECDSA certificate, for tools that bring their own TLS peer
(``bench wire``'s QUIC listener, the host-route runner's ``localhost`` routes).
``cryptography`` comes with aioquic."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec


def self_signed(common_name: str, alt_names: list[x509.GeneralName],
                lifetime: datetime.timedelta
                ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A P-256 key and its certificate for ``alt_names``, valid from a minute ago for
    ``lifetime`` (the minute allows for a clock a little behind)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + lifetime)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(key, hashes.SHA256()))
    return certificate, key
