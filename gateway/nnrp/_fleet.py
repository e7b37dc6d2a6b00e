"""A fleet of gateways, decided sans-IO: which pod holds the session a resume token
opens, and whether a connection forwarded to this pod comes from a pod of the fleet.

A session cannot move between pods (its generation runs on that pod's vLLM), so the
bytes move instead: a resume that reaches another pod is forwarded to the owner
(gateway/server/_relay.py). What the owner is, and that a forward is genuine, is decided
here, from a key the fleet shares (``--fleet-key-file``). Nothing here imports trio.

Rules (cited as F1..F6 in code; docs/resume.md, "A fleet of gateways"):

F1. A fleet token is ``ROUTE ‖ SECRET``. The secret is the CSPRNG's (``_resumption``
    R3: it alone opens the session, looked up by the whole token's digest). The route
    names the pod (its ``--fleet-advertise`` address) and the worker of that pod::

        route      = VERSION(1) ‖ nonce(12) ‖ ciphertext(2 + padded n) ‖ tag(16)
        ciphertext = (worker(1) ‖ n(1) ‖ address(n) ‖ zeros) XOR keystream(enc_key, nonce)
        tag        = HMAC-SHA256(route_key, VERSION ‖ nonce ‖ ciphertext)[:16]

    The keystream is SHAKE-256(label ‖ enc_key ‖ nonce), as a forward's (F4), and the
    address is padded to ``ADDRESS_PAD`` bytes (an IPv6 pod IP and port fit), so an
    outsider learns neither the pod's address nor its length nor which tokens share a pod (a fresh
    nonce per token).
F2. A route is opened with every accepted key (F3), each tag compared in constant time;
    one that no key authenticates is no fleet's token: never forwarded. (The pod that
    issued it may still know it by its digest, ``SessionBook.where``: a key retired
    since never strands a session at home.)
F3. Keys: the key file holds one or more keys, one per line (``#`` comments and blank
    lines ignored); the first seals every token and forward, every one opens them. Each
    gives three sub-keys (encryption, route tag, forward tag) derived by HMAC with fixed
    labels. A rotation that loses no session on any pod, even with pods re-reading the
    file at different times: add the new key as a second line and reload every pod
    (SIGHUP), then move it first and reload again, then drop the old one once no session
    older than that is left. A key a reload drops is still accepted for
    ``keep_previous`` seconds (a resume window), a margin for a one-step rotation.
F4. A forward opens with the client's first bytes sealed::

        MAGIC ‖ sent_ms(8) ‖ nonce(16) ‖ destination(64) ‖ n(4) ‖ fields ‖
        ciphertext(n) ‖ tag(32)

    ``destination`` is the owner's advertised address, so it opens on that pod only;
    ``fields`` is what the forwarding pod's carrier said of the client (``_relay``
    rule 2), which the owner then trusts as its own carrier's word (the session's
    binding is checked against it); the ciphertext is the client's bytes so far (its
    hello and the resume: the token, the session credentials) XOR a SHAKE-256 keystream
    of the encryption key and the nonce; the tag an HMAC-SHA256 with the forward key over
    everything before it. It is taken once per process: tag valid under an accepted
    key, addressed here, ``sent_ms`` within ``FORWARD_SKEW`` of the owner's wall clock,
    its nonce not seen within that time (a header replayed to the same process is
    refused; with ``--workers``, another worker of the pod would take it within the
    skew: the pod network is trusted that far, docs/resume.md). The owner answers first with a
    proof, HMAC-SHA256(forward key, "owner" ‖ nonce): the forwarding pod relays nothing
    more either way until it has checked it, so whatever answers at an owner's address
    without the fleet's key (a pod IP reused by a stranger) reads nothing of the client
    and can tell it nothing. The proof comes in the owner's first answer: no round trip
    is added.
F5. At most one forward per connection: a connection that arrived forwarded is never
    forwarded again (``_server_lifecycle`` rule 4d); a token it carries that names another pod
    opens nothing there. A fleet cannot loop.
F6. A fleet's session ids are random (``SessionIds(random_ids=True)``): pods number
    their sessions independently, and two sessions a client holds on two pods are
    unlikely to share an id (a client that asks for an id gets it, as on one pod).
"""

from __future__ import annotations

import collections
import enum
import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable

import attrs

VERSION = 0xF1
NONCE_BYTES = 12
TAG_BYTES = 16
#: The route's bytes around its address: version, nonce, worker, length, tag.
ROUTE_OVERHEAD = 1 + NONCE_BYTES + 2 + TAG_BYTES
MAX_ADDRESS_BYTES = 255
#: Addresses are padded to this (F1): "[" an IPv6 address "]:" a port fits.
ADDRESS_PAD = 48
#: A key shorter than this is refused (``FleetKeys``): bytes of the file's line, whatever
#: they are (``openssl rand -hex 32`` writes 64, 256 bits, as HMAC-SHA256's own).
MIN_KEY_BYTES = 32

FORWARD_MAGIC = b"NNRPFWD3"
FORWARD_NONCE_BYTES = 16
FORWARD_DESTINATION_BYTES = 64
FORWARD_TAG_BYTES = 32
_SENT_MS = struct.Struct("!Q")
_SEALED_BYTES = struct.Struct("!I")
#: The most client bytes a forward seals (``_server``'s MAX_HAND_OFF_BYTES is below).
MAX_SEALED_BYTES = 1 << 20
PROOF_BYTES = 32
#: How far a forward's clock may be from the owner's (pods of one cluster keep NTP time).
FORWARD_SKEW = 30.0

_ENC_LABEL = b"nnrp-gateway fleet v1 token encryption"
_ROUTE_LABEL = b"nnrp-gateway fleet v1 token route"
_FORWARD_LABEL = b"nnrp-gateway fleet v1 forward"
_PROOF_LABEL = b"owner"
_SEAL_LABEL = b"nnrp-gateway fleet v1 forward seal"
_ROUTE_STREAM_LABEL = b"nnrp-gateway fleet v1 route seal"


def forward_head_size(fields: int) -> int:
    """The fixed part of a forward's opening with ``fields`` bytes of fields (F4): what
    comes before the sealed bytes."""
    return (len(FORWARD_MAGIC) + _SENT_MS.size + FORWARD_NONCE_BYTES
            + FORWARD_DESTINATION_BYTES + _SEALED_BYTES.size + fields)


def forward_rest_size(head: bytes) -> int | None:
    """How many bytes follow ``head`` (sealed bytes and tag); None when ``head`` is no
    forward's, or announces more than ``MAX_SEALED_BYTES``."""
    offset = len(FORWARD_MAGIC) + _SENT_MS.size + FORWARD_NONCE_BYTES + FORWARD_DESTINATION_BYTES
    if len(head) < offset + _SEALED_BYTES.size or not head.startswith(FORWARD_MAGIC):
        return None
    (sealed,) = _SEALED_BYTES.unpack_from(head, offset)
    return sealed + FORWARD_TAG_BYTES if sealed <= MAX_SEALED_BYTES else None


def padded(size: int) -> int:
    """An address of ``size`` bytes as the route carries it (F1)."""
    return max(ADDRESS_PAD, -(-size // 16) * 16)


class ForwardOutcome(enum.Enum):
    """What became of a forward (metrics: ``fleet_forwards``, ``fleet_forwards_taken``)."""

    #: Sent: the owner answered the client's hello (the forwarding pod's count).
    SENT = "sent"
    #: The owner could not be reached (the client: retry later).
    UNREACHABLE = "unreachable"
    #: The owner ended it, or stayed silent, before its hello ack (at its connection
    #: limit, shutting down, or it refused the header): the client is told to retry.
    REFUSED = "refused"
    #: The client left before the owner answered.
    ABANDONED = "abandoned"
    #: Taken: a genuine header (F4) came here (the owner's count; the connection is then
    #: admitted, or refused at the connection limit, as any other).
    ACCEPTED = "accepted"
    #: Refused here: a header that is not genuine, stale or replayed (F4).
    REJECTED = "rejected"


class FleetKeyError(ValueError):
    """A fleet key that cannot be used (too short)."""


@attrs.frozen
class _Key:
    """One fleet key's sub-keys (F3): never in a repr."""

    encryption: bytes = attrs.field(repr=False)
    route: bytes = attrs.field(repr=False)
    forward: bytes = attrs.field(repr=False)

    @classmethod
    def derive(cls, material: bytes) -> _Key:
        if len(material) < MIN_KEY_BYTES:
            raise FleetKeyError(f"a fleet key needs at least {MIN_KEY_BYTES} bytes, "
                                f"got {len(material)}")
        return cls(*(hmac.new(material, label, hashlib.sha256).digest()
                     for label in (_ENC_LABEL, _ROUTE_LABEL, _FORWARD_LABEL)))


def key_material(text: bytes) -> list[bytes]:
    """A key file's keys (F3): one per line, without surrounding whitespace (a trailing
    newline is not part of a key written by ``openssl rand -hex 32 > key``); blank
    lines and ``#`` comments ignored."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(b"#")]


class FleetKeys:
    """The keys in use (the first seals) and, for ``keep_previous`` seconds after a
    reload, those it dropped (F3). ``clock``: seconds, monotonic."""

    def __init__(self, materials: list[bytes], *, clock: Callable[[], float],
                 keep_previous: float) -> None:
        self._keys = self._derive(materials)
        self._dropped: tuple[_Key, ...] = ()
        self._dropped_until = 0.0
        self._clock = clock
        self.keep_previous = keep_previous

    @staticmethod
    def _derive(materials: list[bytes]) -> tuple[_Key, ...]:
        if not materials:
            raise FleetKeyError("no key (one per line; # starts a comment)")
        return tuple(_Key.derive(material) for material in materials)

    @property
    def current(self) -> _Key:
        return self._keys[0]

    def rotate(self, materials: list[bytes]) -> bool:
        """The key file re-read (SIGHUP): True if its keys changed. Raises
        ``FleetKeyError`` (the keys in use stay) for keys that cannot be used."""
        keys = self._derive(materials)
        if keys == self._keys:
            return False
        dropped = tuple(key for key in (*self._keys, *self._live_dropped()) if key not in keys)
        self._keys, self._dropped = keys, dropped
        self._dropped_until = self._clock() + self.keep_previous
        return True

    def _live_dropped(self) -> tuple[_Key, ...]:
        if self._dropped and self._clock() >= self._dropped_until:
            self._dropped = ()
        return self._dropped

    def accepted(self) -> tuple[_Key, ...]:
        """The keys a route or forward may be authenticated with now, sealing key first."""
        return self._keys + self._live_dropped()


@attrs.frozen
class Elsewhere:
    """Where a token's session lives when not in this process (``_resumption`` R11)."""

    #: The worker of the pod that holds it.
    worker: int
    #: Another pod of the fleet (its ``--fleet-advertise`` address); None: this pod.
    pod: str | None = None


@attrs.frozen
class Route:
    """Where a fleet token's session lives (F1)."""

    pod: str
    worker: int


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(
        len(data), "big")


class FleetIdentity:
    """This pod in its fleet: its address (``--fleet-advertise``), the fleet's keys, and
    the forwards it has taken (F4's replay guard). ``wall_clock``: seconds since the epoch
    (a forward's time is compared across pods); ``random_bytes``: the CSPRNG."""

    def __init__(self, advertise: str, keys: FleetKeys, *,
                 wall_clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        address = advertise.encode("utf-8")
        if not address or len(address) > MAX_ADDRESS_BYTES:
            raise ValueError(f"a fleet address is 1 to {MAX_ADDRESS_BYTES} bytes")
        self.advertise = advertise
        self._address = address
        self.keys = keys
        self._wall_clock = wall_clock
        self._random_bytes = random_bytes
        #: F4: nonces of forwards taken, with when each may be forgotten (oldest first).
        self._seen: collections.deque[tuple[float, bytes]] = collections.deque()
        self._nonces: set[bytes] = set()

    def __repr__(self) -> str:
        return f"FleetIdentity({self.advertise!r})"

    # ------------------------------------------------------------------ tokens (F1, F2)

    def seal(self, worker: int, secret: bytes) -> bytes:
        """A token for a session of ``worker`` of this pod: the route, then ``secret``."""
        key = self.keys.current
        nonce = self._random_bytes(NONCE_BYTES)
        address = self._address.ljust(padded(len(self._address)), b"\0")
        plain = bytes([worker, len(self._address)]) + address
        cipher = _xor(plain, _keystream(_ROUTE_STREAM_LABEL, key.encryption, nonce, len(plain)))
        head = bytes([VERSION]) + nonce + cipher
        return head + hmac.new(key.route, head, hashlib.sha256).digest()[:TAG_BYTES] + secret

    def route(self, token: bytes) -> Route | None:
        """Where ``token``'s session lives; None when no accepted key authenticates its
        route (F2). Changes nothing."""
        if len(token) < ROUTE_OVERHEAD or token[0] != VERSION:
            return None
        nonce = token[1:1 + NONCE_BYTES]
        start = 1 + NONCE_BYTES
        for key in self.keys.accepted():
            stream = _keystream(_ROUTE_STREAM_LABEL, key.encryption, nonce, 2)
            length = token[start + 1] ^ stream[1]
            end = start + 2 + padded(length)
            if end + TAG_BYTES > len(token):
                continue
            tag = hmac.new(key.route, token[:end], hashlib.sha256).digest()[:TAG_BYTES]
            if not hmac.compare_digest(tag, token[end:end + TAG_BYTES]):
                continue
            plain = _xor(token[start:end], _keystream(_ROUTE_STREAM_LABEL, key.encryption,
                                                      nonce, end - start))
            try:
                pod = plain[2:2 + length].decode("utf-8")
            except UnicodeDecodeError:  # authenticated, so only a key shared with a liar
                return None
            return Route(pod, plain[0])
        return None

    def is_here(self, route: Route) -> bool:
        return route.pod == self.advertise

    # ------------------------------------------------------------------ forwards (F4)

    def seal_forward(self, destination: str, fields: bytes, client_bytes: bytes
                     ) -> SealedForward:
        """What this pod sends first when it forwards a connection to the pod
        ``destination`` (its advertised address), ``client_bytes`` sealed in it, and the
        proof the owner must answer with (F4)."""
        key = self.keys.current
        nonce = self._random_bytes(FORWARD_NONCE_BYTES)
        head = (FORWARD_MAGIC + _SENT_MS.pack(int(self._wall_clock() * 1000)) + nonce
                + _destination(destination) + _SEALED_BYTES.pack(len(client_bytes)) + fields)
        sealed = head + _xor(client_bytes, _keystream(_SEAL_LABEL, key.encryption, nonce,
                                                      len(client_bytes)))
        return SealedForward(sealed + hmac.new(key.forward, sealed, hashlib.sha256).digest(),
                             _proof(key, nonce))

    def open_forward(self, opening: bytes, fields: int) -> OpenedForward | None:
        """A genuine forward's opening (``fields`` bytes of fields) addressed to this pod,
        taken once: its fields, the client's bytes, the proof to answer with; None for
        any other (F4)."""
        if forward_rest_size(opening[:forward_head_size(fields)]) != (
                len(opening) - forward_head_size(fields)):
            return None
        body, tag = opening[:-FORWARD_TAG_BYTES], opening[-FORWARD_TAG_BYTES:]
        key = next((key for key in self.keys.accepted() if hmac.compare_digest(
            hmac.new(key.forward, body, hashlib.sha256).digest(), tag)), None)
        if key is None:
            return None
        offset = len(FORWARD_MAGIC)
        (sent_ms,) = _SENT_MS.unpack_from(body, offset)
        offset += _SENT_MS.size
        nonce = body[offset:offset + FORWARD_NONCE_BYTES]
        offset += FORWARD_NONCE_BYTES
        if body[offset:offset + FORWARD_DESTINATION_BYTES] != _destination(self.advertise):
            return None  # a genuine opening for another pod
        offset += FORWARD_DESTINATION_BYTES + _SEALED_BYTES.size
        now = self._wall_clock()
        if abs(now - sent_ms / 1000) > FORWARD_SKEW:
            return None
        while self._seen and self._seen[0][0] <= now:  # oldest first: they expire in order
            self._nonces.discard(self._seen.popleft()[1])
        if nonce in self._nonces:
            return None  # F4: a replay
        self._seen.append((now + 2 * FORWARD_SKEW, nonce))
        self._nonces.add(nonce)
        sealed = body[offset + fields:]
        return OpenedForward(body[offset:offset + fields],
                             _xor(sealed, _keystream(_SEAL_LABEL, key.encryption, nonce,
                                                     len(sealed))),
                             _proof(key, nonce))


@attrs.frozen
class SealedForward:
    """A forward's opening, and the proof its owner must answer with first (F4)."""

    opening: bytes = attrs.field(repr=False)
    proof: bytes = attrs.field(repr=False)


@attrs.frozen
class OpenedForward:
    """What the owner took from a genuine opening (F4)."""

    fields: bytes
    client_bytes: bytes = attrs.field(repr=False)
    proof: bytes = attrs.field(repr=False)


def _proof(key: _Key, nonce: bytes) -> bytes:
    return hmac.new(key.forward, _PROOF_LABEL + nonce, hashlib.sha256).digest()


def _keystream(label: bytes, key: bytes, nonce: bytes, size: int) -> bytes:
    """A keystream of the fleet's encryption key and a nonce (F1 for routes, F4 for a
    forward's client bytes, each under its own label): SHAKE-256, an XOF."""
    return hashlib.shake_256(label + key + nonce).digest(size) if size else b""


def _destination(advertise: str) -> bytes:
    return advertise.encode("utf-8")[:FORWARD_DESTINATION_BYTES].ljust(
        FORWARD_DESTINATION_BYTES, b"\0")
