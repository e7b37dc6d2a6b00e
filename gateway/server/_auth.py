"""Session authentication: a shared bearer token (or a file of them) checked against the
SESSION_OPEN auth bytes (nnrp-wire.md section 3), refused with session error auth_failed.

The comparison is constant-time and always walks every configured token, so neither the
match position nor a near-miss is visible in timing. Tokens never reach logs, metrics or
error text.
"""

from __future__ import annotations

import hmac
from pathlib import Path


class TokenAuthenticator:
    def __init__(self, tokens: list[bytes]) -> None:
        if not tokens or any(not token for token in tokens):
            raise ValueError("auth tokens must be non-empty")
        self._tokens = list(tokens)

    @classmethod
    def from_sources(cls, tokens: list[str], token_file: Path | None) -> TokenAuthenticator | None:
        """None when no token is configured (authentication off)."""
        collected = [token.encode() for token in tokens if token]
        if token_file is not None:
            collected += [line.strip().encode() for line in token_file.read_text().splitlines()
                          if line.strip() and not line.startswith("#")]
        return cls(collected) if collected else None

    def __call__(self, supplied: bytes) -> bool:
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(supplied, token)
        return matched

    def __repr__(self) -> str:
        return f"TokenAuthenticator({len(self._tokens)} token(s))"
