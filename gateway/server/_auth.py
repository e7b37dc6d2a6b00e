"""Session authentication: a shared bearer token (or a file of them) checked against the
SESSION_OPEN auth bytes (docs/reference/nnrp-wire.md section 3), refused with session error
auth_failed.

Authentication fails closed: a source that was given never means authentication off. An
empty token, or a token file that holds none (empty, or comments only: an empty
Kubernetes Secret key), is refused at start-up (``AuthSourceError``, naming the source),
and on SIGHUP keeps the tokens there were.

The comparison is constant-time and always walks every configured token, so neither the
match position nor a near-miss is visible in timing. Tokens never reach logs, metrics or
error text. SIGHUP re-reads the token file (``reload``): a revoked token opens no new
session and resumes none (a resume is authenticated like an open); a file that cannot be
read, or would leave no token at all, keeps the tokens there were.
"""

from __future__ import annotations

import hmac
from pathlib import Path


class AuthSourceError(ValueError):
    """A token source that would leave authentication off, or holds nothing usable;
    ``option`` names it (``auth_token`` or ``auth_token_file``)."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


class TokenAuthenticator:
    def __init__(self, tokens: list[bytes], *, fixed: list[bytes] | None = None,
                 token_file: Path | None = None) -> None:
        if not tokens or any(not token for token in tokens):
            raise ValueError("auth tokens must be non-empty")
        self._tokens = list(tokens)
        #: The tokens given inline, and the file the others come from (``reload``).
        self._fixed = list(fixed) if fixed is not None else list(tokens)
        self._file = token_file

    @classmethod
    def from_sources(cls, tokens: list[str], token_file: Path | None) -> TokenAuthenticator | None:
        """None when no source is given (authentication off); ``AuthSourceError`` for a
        source given that holds no token (it fails closed, never open)."""
        if any(not token.strip() for token in tokens):
            raise AuthSourceError("an empty auth token would turn authentication off",
                                  "auth_token")
        fixed = [token.encode() for token in tokens]
        from_file = _read(token_file) if token_file is not None else []
        if token_file is not None and not from_file:
            raise AuthSourceError(f"{token_file} holds no token (empty, or comments only): "
                                  "authentication would be off", "auth_token_file")
        collected = fixed + from_file
        return cls(collected, fixed=fixed, token_file=token_file) if collected else None

    def reload(self) -> str | None:
        """SIGHUP: the token file again. None when done; why not otherwise (the tokens
        there were stay)."""
        if self._file is None:
            return None
        try:
            tokens = self._fixed + _read(self._file)
        except (OSError, UnicodeDecodeError) as exc:
            return f"{self._file}: {exc}"
        if not tokens:
            return f"{self._file} holds no token (authentication would be off)"
        self._tokens = tokens
        return None

    def __call__(self, supplied: bytes) -> bool:
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(supplied, token)
        return matched

    def __repr__(self) -> str:
        return f"TokenAuthenticator({len(self._tokens)} token(s))"


def _read(token_file: Path) -> list[bytes]:
    return [line.strip().encode() for line in token_file.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
