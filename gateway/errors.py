"""The gateway's one error tree (docs/reference/conventions.md, style principle 7).

    GatewayError
    ├── ProtocolError            gateway.nnrp: the NNRP rules were broken
    │   ├── RemoteProtocolError    ...by the peer: fatal to the connection unless scoped
    │   │   ├── HttpAnswerError      ...in HTTP: the client dialled an HTTP server
    │   │   └── TypedBodyError       ...inside a typed body: fails one operation only
    │   └── LocalProtocolError     ...by us: a send the state machine forbids (never sent)
    ├── ProfileError             gateway.profile: the request is refused; carries its EndCause
    ├── UpstreamError            gateway.upstream: vLLM could not serve the request
    │   ├── UpstreamUnavailable    no usable answer: refused, reset, closed (or a probe
    │   │                          timed out) before a whole HTTP/1.1 head
    │   ├── UpstreamOverloaded     no request slot free within the queue wait, or vLLM not
    │   │                          accepting a connection within the connect timeout
    │   ├── UpstreamTimeout        first_chunk / idle / total (its ``kind``)
    │   ├── UpstreamStatus         a non-200 answer (vLLM's message and param parsed)
    │   ├── UpstreamMalformed      a stream or body that breaks vLLM's contract, an
    │   │                          in-stream error event, a connection lost mid-body
    │   └── UnsupportedVersion     the probed vLLM is outside the tested families
    ├── ConfigError              an option that cannot be used; a ValueError
    │   ├── ListenError            gateway.transport: a listen URI that cannot be used, or
    │   │                          a bind that failed (named)
    │   └── TlsFileError           gateway.transport: a certificate, key or CA file that
    │                              cannot serve (its ``role`` says which)
    ├── ListenerFailed           gateway.transport: a bound listener failed for good; the
    │                            whole listener set is closed
    └── DrainInterrupted         gateway.app: a second SIGTERM/SIGINT during the drain

This is the only drawing (``tests/test_errors.py`` holds it to the classes): a module
that defines a branch points here rather than drawing it again.

How each ends an operation (which terminal, outcome label, log level, metric) is one
table: ``gateway.profile.END_TABLE``, keyed by ``EndCause``. ``ProtocolError`` never ends
an operation by itself: a fatal one ends its connection (every operation then ends
``disconnected`` or with the drop the table gives), a scoped one is answered on the wire.

This module imports nothing, so every layer (the sans-IO ones included) may build on it.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Root of every error the gateway raises on purpose."""


class ConfigError(GatewayError, ValueError):
    """A configuration value that cannot be used; the message names it."""
