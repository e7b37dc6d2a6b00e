"""The QUIC driver's sans-IO parts, no sockets: the ALPN policy, the routing table, and
``QuicEndpoint`` against aioquic's client ``QuicConnection`` over a simulated wire."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    StreamDataReceived,
    StreamReset,
)

from gateway.transport import AlpnPolicy, QuicSettings, TlsConfig
from gateway.transport._quic_endpoint import (
    RETRY_MEMORY_ENTRIES,
    QuicEndpoint,
    QuicPeer,
    RoutingTable,
    feed_datagram,
    server_configuration,
)
from gateway.transport._quic_settings import NNRP_STREAM_ID
from tests.support.quic import Pki, make_pki
from tests.support.tiers import examples

CLIENT = ("192.0.2.7", 50000)
SERVER = ("192.0.2.1", 4433)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("quic-pki"))


# ------------------------------------------------------------------ ALPN policy


@pytest.mark.parametrize(("policy", "offered", "server_list"), [
    (AlpnPolicy.NONE, None, None),          # no offer: skip ALPN, accepted
    (AlpnPolicy.NONE, ["nnrp/1"], []),      # any offer: refused
    (AlpnPolicy.NNRP, None, ["nnrp/1"]),    # no offer: aioquic refuses
    (AlpnPolicy.NNRP, ["h3", "nnrp/1"], ["nnrp/1"]),
    (AlpnPolicy.NNRP, ["h3"], []),
    (AlpnPolicy.ANY, None, None),
    (AlpnPolicy.ANY, ["nnrp/1"], ["nnrp/1"]),
    (AlpnPolicy.ANY, ["h3"], []),
    (AlpnPolicy.ANY, [], []),               # an empty extension is an offer of nothing
])
def test_alpn_policy_table(policy: AlpnPolicy, offered: list[str] | None,
                           server_list: list[str] | None) -> None:
    assert policy.server_protocols(offered) == server_list


def test_alpn_policy_values_are_the_cli_values() -> None:
    assert [p.value for p in AlpnPolicy] == ["none", "nnrp/1", "any"]


# ------------------------------------------------------------------ routing table


def test_routing_table_follows_issued_and_retired_ids() -> None:
    table = RoutingTable()
    a, b = object(), object()
    assert table.add(b"odcid", a) and table.add(b"cid0", a) and table.add(b"cid1", a)
    assert table.add(b"other", b)
    assert not table.add(b"cid1", b)  # never steal another connection's ID
    assert table.get(b"cid1") is a and len(table) == 2
    table.retire(b"cid0", a)
    table.retire(b"other", a)  # not a's: no effect
    assert table.get(b"cid0") is None and table.get(b"other") is b
    assert table.cids(a) == {b"odcid", b"cid1"}
    table.remove(a)
    assert table.get(b"odcid") is None and table.get(b"cid1") is None and len(table) == 1
    table.remove(a)  # idempotent
    assert table.owners() == [b]


# ------------------------------------------------------------------ endpoint on a fake wire


class Wire:
    """One client and one endpoint exchanging datagrams on a simulated clock."""

    def __init__(self, endpoint: QuicEndpoint, client: QuicConnection,
                 addr: tuple[str, int] = CLIENT) -> None:
        self.endpoint = endpoint
        self.client = client
        self.addr = addr
        self.now = 1000.0
        self.peer: QuicPeer | None = None
        self.replies: list[bytes] = []
        client.connect(SERVER, now=self.now)

    def step(self) -> int:
        """Deliver everything pending both ways once; returns datagrams moved."""
        moved = 0
        for data, _ in self.client.datagrams_to_send(self.now):
            moved += 1
            received = self.endpoint.receive_datagram(data, self.addr, self.now)
            self.replies.extend(received.replies)
            for reply in received.replies:
                self.client.receive_datagram(reply, SERVER, self.now)
            if received.peer is not None:
                self.peer = received.peer
        if self.peer is not None and not self.peer.terminated:
            for data, _ in self.endpoint.datagrams_to_send(self.peer, self.now):
                moved += 1
                self.client.receive_datagram(data, SERVER, self.now)
        return moved

    def run(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            self.now += 0.001
            if not self.step():
                self.tick()
                if not self.step():
                    return

    def tick(self, horizon: float = 0.5) -> None:
        """Fire the timers due within ``horizon`` seconds (ACK delay, loss detection,
        closing period), advancing the clock; never the idle timeout."""
        timers = [t for t in (self.client.get_timer(),
                              self.peer.quic.get_timer() if self.peer else None)
                  if t is not None]
        if not timers or min(timers) > self.now + horizon:
            return
        self.now = max(self.now, min(timers))
        if (t := self.client.get_timer()) is not None and t <= self.now:
            self.client.handle_timer(self.now)
        if self.peer is not None and (t := self.peer.quic.get_timer()) is not None \
                and t <= self.now:
            self.peer.quic.handle_timer(self.now)
            self.endpoint.process(self.peer)

    def client_events(self) -> list[object]:
        events = []
        while (event := self.client.next_event()) is not None:
            events.append(event)
        return events


def settings(pki: Pki, **kw: object) -> QuicSettings:
    return QuicSettings(TlsConfig(pki.cert, pki.key), **kw)  # type: ignore[arg-type]


def endpoint(pki: Pki, **kw: object) -> QuicEndpoint:
    quic = settings(pki, **kw)
    return QuicEndpoint(quic, server_configuration(quic))


def client(pki: Pki, alpn: list[str] | None = None) -> QuicConnection:
    configuration = QuicConfiguration(is_client=True, alpn_protocols=alpn,
                                      server_name="localhost")
    configuration.load_verify_locations(cafile=str(pki.cert))
    return QuicConnection(configuration=configuration)


def handshake(wire: Wire) -> list[object]:
    wire.run()
    return wire.client_events()


@pytest.mark.parametrize(("policy", "offer", "ok", "selected"), [
    (AlpnPolicy.NONE, None, True, None),
    (AlpnPolicy.NONE, ["nnrp/1"], False, None),
    (AlpnPolicy.NNRP, None, False, None),
    (AlpnPolicy.NNRP, ["nnrp/1"], True, "nnrp/1"),
    (AlpnPolicy.ANY, None, True, None),
    (AlpnPolicy.ANY, ["h3", "nnrp/1"], True, "nnrp/1"),
])
def test_alpn_hook_in_a_real_handshake(pki: Pki, policy: AlpnPolicy,
                                       offer: list[str] | None, ok: bool,
                                       selected: str | None) -> None:
    wire = Wire(endpoint(pki, alpn=policy), client(pki, offer))
    events = handshake(wire)
    done = [e for e in events if isinstance(e, HandshakeCompleted)]
    if ok:
        assert done and done[0].alpn_protocol == selected
        assert wire.peer is not None and wire.peer.alpn == selected
    else:
        assert not done
        for _ in range(10):  # the client's draining period (3 PTO)
            wire.tick(horizon=5.0)
            wire.step()
        closed = [e for e in events + wire.client_events()
                  if isinstance(e, ConnectionTerminated)]
        assert closed and closed[0].error_code == 0x100 + 120  # no_application_protocol


def test_routes_follow_new_and_retired_connection_ids(pki: Pki) -> None:
    ep = endpoint(pki)
    wire = Wire(ep, client(pki))
    handshake(wire)
    peer = wire.peer
    assert peer is not None and peer.handshake_complete
    issued = ep.routes.cids(peer)
    assert len(issued) >= 3  # original destination ID, first host ID, issued ones
    assert all(ep.routes.get(cid) is peer for cid in issued)
    # The client moves to another of our IDs and retires the one it used.
    old = wire.client._peer_cid.cid
    wire.client.change_connection_id()
    wire.run()
    assert ep.routes.get(old) is None
    new = wire.client._peer_cid.cid
    assert ep.routes.get(new) is peer
    # Data on the new ID still reaches the connection.
    wire.client.send_stream_data(0, b"hello")
    wire.run()
    assert peer.take_inbound() == b"hello"
    # The end frees every route and the slot.
    wire.client.close()
    wire.run()
    for _ in range(10):
        wire.tick()
        wire.step()
    assert peer.terminated and len(ep.routes) == 0 and ep.handshakes_in_progress == 0


def test_retry_when_over_the_threshold(pki: Pki) -> None:
    ep = endpoint(pki, retry_threshold=0)
    wire = Wire(ep, client(pki))
    events = handshake(wire)
    assert ep.stats.retries == 1
    assert any(isinstance(e, HandshakeCompleted) for e in events)
    # A replayed token from another address is not accepted.
    second = Wire(ep, client(pki), addr=("198.51.100.9", 1234))
    second.run()
    assert ep.stats.retries == 2


def test_a_retried_initial_is_retried_again_after_the_load(pki: Pki) -> None:
    """A client's first Initial gets a Retry under load; its retransmission (same
    destination CID, no token) may arrive once the load is gone. Accepted, it would make a
    connection the client has already left for the Retry's: 128 concurrent connects made
    57 such orphans, each holding a slot until the handshake timeout. It gets the Retry
    again; other clients are not affected, and the memory ends with the handshake
    timeout."""
    ep = endpoint(pki, retry_threshold=2, handshake_timeout=10.0)
    c = client(pki)
    c.connect(SERVER, now=1000.0)
    (initial, _), = c.datagrams_to_send(1000.0)
    ep.handshakes_in_progress = 2  # under load
    assert len(feed_datagram(ep, initial, 1000.0, CLIENT)) == 1
    ep.handshakes_in_progress = 0  # the load has passed, a new one-second window
    assert len(feed_datagram(ep, initial, 1002.0, CLIENT)) == 1
    assert ep.stats.retries == 2 and len(ep.routes) == 0
    other = Wire(ep, client(pki), addr=("198.51.100.3", 4000))
    assert any(isinstance(e, HandshakeCompleted) for e in handshake(other))
    assert ep.stats.retries == 2
    feed_datagram(ep, initial, 1013.0, CLIENT)  # past the handshake timeout: forgotten
    assert ep.stats.retries == 2 and ep.stats.connections_total == 2


def test_the_retry_memory_is_bounded(pki: Pki) -> None:
    ep = endpoint(pki, retry_threshold=0)
    junk = [b"\xc3\x00\x00\x00\x01\x08" + os.urandom(8) + b"\x08" + os.urandom(8)
            + b"\x00\x44\xb0" + os.urandom(1200) for _ in range(RETRY_MEMORY_ENTRIES + 10)]
    for data in junk:
        assert len(feed_datagram(ep, data, 1000.0)) == 1
    assert len(ep._retried) == RETRY_MEMORY_ENTRIES


def test_forged_token_is_dropped(pki: Pki) -> None:
    ep = endpoint(pki, retry_threshold=0)
    wire = Wire(ep, client(pki))
    wire.client._peer_token = os.urandom(40)  # as if from a Retry we never sent
    wire.run()
    assert ep.stats.invalid_tokens >= 1 and len(ep.routes) == 0


def test_connection_cap_drops_initials_without_state(pki: Pki) -> None:
    ep = endpoint(pki, max_connections=2, retry_threshold=None)
    wires = [Wire(ep, client(pki), addr=(f"192.0.2.{i}", 1000 + i)) for i in range(5)]
    for wire in wires:
        wire.step()
    assert len(ep.routes) == 2
    assert ep.stats.refused_initials == 3
    assert ep.handshakes_in_progress == 2


def test_garbage_is_counted_and_never_answered(pki: Pki) -> None:
    ep = endpoint(pki)
    samples = [b"", b"\x00", os.urandom(30), b"\x40" + os.urandom(50),
               b"\xc3\x00\x00\x00\x01\x08" + os.urandom(8) + b"\x08" + os.urandom(8)
               + b"\x00\x44\xb0" + os.urandom(1200),           # Initial that never decrypts
               b"\xc3\x00\x00\x00\x01\x08" + os.urandom(8) + b"\x00\x00\x05" + b"x" * 5,
               b"\x80\x00\x00\x00\x00" + os.urandom(20)]         # version negotiation
    for data in samples:
        assert feed_datagram(ep, data, 1000.0) == []
    assert ep.stats.garbage == len(samples)
    assert len(ep.routes) == 0 and ep.handshakes_in_progress == 0


def test_unknown_version_gets_version_negotiation_only_when_padded(pki: Pki) -> None:
    ep = endpoint(pki)
    header = b"\xc0\x1a\x2a\x3a\x4a\x08" + os.urandom(8) + b"\x08" + os.urandom(8)
    assert feed_datagram(ep, header + b"\x00" * 20, 1000.0) == []
    (reply,) = feed_datagram(ep, header + b"\x00" * 1200, 1000.0)
    assert reply[1:5] == b"\x00\x00\x00\x00"
    assert ep.stats.version_negotiations == 1


def test_only_stream_zero_is_nnrp(pki: Pki) -> None:
    ep = endpoint(pki, max_streams_bidi=3)
    wire = Wire(ep, client(pki))
    handshake(wire)
    peer = wire.peer
    assert peer is not None
    wire.client.send_stream_data(0, b"nnrp bytes")
    for _ in range(6):  # two fit in the limit (3 incl. stream 0); the rest wait for credit
        wire.client.send_stream_data(wire.client.get_next_available_stream_id(), b"x" * 10,
                                     end_stream=True)
    for _ in range(20):
        wire.run()
        wire.tick()
    resets = {e.stream_id for e in wire.client_events() if isinstance(e, StreamReset)}
    assert resets == {4, 8, 12, 16, 20, 24}
    assert ep.stats.refused_streams == 6
    assert peer.take_inbound() == b"nnrp bytes"
    assert peer.quic._local_max_streams_uni.value == 0


def test_receive_credit_follows_what_the_connection_read(pki: Pki) -> None:
    window = 64 * 1024
    ep = endpoint(pki, receive_window=window)
    wire = Wire(ep, client(pki))
    handshake(wire)
    peer = wire.peer
    assert peer is not None
    wire.client.send_stream_data(NNRP_STREAM_ID, b"z" * (1 << 20))
    for _ in range(30):
        wire.run()
        wire.tick()
    buffered = sum(map(len, peer.inbound))
    assert buffered <= window  # the client is blocked by flow control, not buffered by us
    total = len(peer.take_inbound())
    for _ in range(200):
        wire.run()
        wire.tick()
        total += len(peer.take_inbound())
        if total == 1 << 20:
            break
    assert total == 1 << 20  # reading releases credit until everything arrived


def test_send_side_level_is_visible(pki: Pki) -> None:
    ep = endpoint(pki)
    wire = Wire(ep, client(pki))
    handshake(wire)
    peer = wire.peer
    assert peer is not None
    wire.client.send_stream_data(0, b"hi")
    wire.run()
    peer.quic.send_stream_data(0, b"y" * 100_000)
    assert peer.quic.unacked_bytes(0) == 100_000
    for _ in range(50):
        wire.run()
        wire.tick()
    assert peer.quic.unacked_bytes(0) == 0
    received = [e for e in wire.client_events() if isinstance(e, StreamDataReceived)]
    assert sum(len(e.data) for e in received) == 100_000


def test_mutual_tls_is_refused(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ValueError, match="mutual TLS"):
        server_configuration(QuicSettings(TlsConfig(pki.cert, pki.key, pki.cert)))


def test_feed_datagram_accepts_a_real_initial(pki: Pki) -> None:
    ep = endpoint(pki)
    c = client(pki)
    c.connect(SERVER, now=1000.0)
    (initial, _), *_ = c.datagrams_to_send(1000.0)
    replies = feed_datagram(ep, initial, 1000.0)
    assert replies and ep.stats.connections_total == 1
    # The same bytes again are routed to that connection (duplicate Initial), not a new one.
    feed_datagram(ep, initial, 1000.0)
    assert ep.stats.connections_total == 1


def test_arbitrary_datagrams_never_raise(pki: Pki) -> None:
    """The fuzz target's contract (tests/fuzz: quic_datagram), checked by hypothesis."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    c = client(pki)
    c.connect(SERVER, now=0.0)
    (initial, _), *_ = c.datagrams_to_send(0.0)
    quic_settings = QuicSettings(TlsConfig(pki.cert, pki.key), max_connections=2)
    configuration = server_configuration(quic_settings)

    @settings(max_examples=examples(150), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.booleans(), st.lists(st.binary(max_size=1500), max_size=4))
    def check(with_initial: bool, datagrams: list[bytes]) -> None:
        ep = QuicEndpoint(quic_settings, configuration)
        inputs = ([initial] if with_initial else []) + [
            d[:6] + initial[6:14] + d[14:] if len(d) > 14 and d[0] & 0x80 else d
            for d in datagrams]
        sent = sum(len(reply) for data in inputs
                   for reply in feed_datagram(ep, data, 1000.0, CLIENT))
        assert sent <= 3 * sum(map(len, inputs))
        assert len(ep.routes) <= 2 and ep.handshakes_in_progress >= 0

    check()


def test_a_burst_of_initials_switches_to_retry(pki: Pki) -> None:
    """Spoofed Initials that never decrypt make no handshake, so the burst itself counts."""
    ep = endpoint(pki, retry_threshold=3)
    junk = [b"\xc3\x00\x00\x00\x01\x08" + os.urandom(8) + b"\x08" + os.urandom(8)
            + b"\x00\x44\xb0" + os.urandom(1200) for _ in range(6)]
    replies = [feed_datagram(ep, data, 1000.0) for data in junk]
    assert replies[:3] == [[], [], []]  # under the threshold: tried (and dropped)
    assert all(len(r) == 1 for r in replies[3:])  # then a stateless Retry each
    assert ep.stats.retries == 3 and len(ep.routes) == 0
    # A second later the window starts over.
    assert feed_datagram(ep, junk[0], 1001.5) == []
