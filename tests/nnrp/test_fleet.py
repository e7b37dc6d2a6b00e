"""A fleet of gateways, sans-IO (gateway/nnrp/_fleet.py F1-F6, gateway/nnrp/_resumption.py
R11, gateway/nnrp/_server_lifecycle.py rule 4d): tokens whose route names the pod, authenticated
with the fleet's key; forward headers taken once; where a resume is handed, and where it
is refused without a forward."""

from __future__ import annotations

import itertools

import attrs
import pytest
from hypothesis import given, strategies as st

from gateway import nnrp
from gateway.nnrp._fleet import ADDRESS_PAD, FORWARD_SKEW, ROUTE_OVERHEAD, padded
from tests.support.resume import Clock, connection, counting_tokens, resume
from tests.support.wire import of, pk, replies

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
FIELDS = b"f" * 113
POD_A, POD_B, POD_C = "10.0.0.1:7702", "10.0.0.2:7702", "10.0.0.3:7702"


@attrs.define
class WallClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def identity(advertise: str = POD_A, key: bytes = KEY, *, clock: Clock | None = None,
             wall: WallClock | None = None, keep_previous: float = 120.0
             ) -> nnrp.FleetIdentity:
    nonces = itertools.count(1)
    return nnrp.FleetIdentity(
        advertise, nnrp.FleetKeys([key], clock=clock or Clock(), keep_previous=keep_previous),
        wall_clock=wall or WallClock(),
        random_bytes=lambda size: next(nonces).to_bytes(size, "big"))


def fleet_book(pod: nnrp.FleetIdentity, *, clock: Clock | None = None, worker: int = 0,
               relays: tuple[str, ...] = ()) -> nnrp.SessionBook:
    return nnrp.SessionBook(nnrp.ResumePolicy(fleet=pod, worker=worker, relays=relays),
                            clock=clock or Clock(), random_bytes=counting_tokens(),
                            ids=nnrp.SessionIds(random_ids=True))


# --------------------------------------------------------------------------- tokens (F1, F2)


def test_a_token_names_its_pod_and_worker_and_ends_with_the_secret() -> None:
    pod = identity()
    secret = b"s" * 24
    token = pod.seal(3, secret)
    assert token.endswith(secret)
    assert len(token) == ROUTE_OVERHEAD + ADDRESS_PAD + len(secret)
    assert pod.route(token) == nnrp.Route(POD_A, 3)
    assert identity(POD_B).route(token) == nnrp.Route(POD_A, 3)  # any pod of the fleet reads it
    assert pod.is_here(nnrp.Route(POD_A, 0)) and not pod.is_here(nnrp.Route(POD_B, 0))


def test_an_outsider_learns_neither_the_pod_nor_its_length_nor_which_tokens_share_one(
        ) -> None:
    pod = identity()
    first, second = pod.seal(0, b"\0" * 24), pod.seal(0, b"\0" * 24)
    assert POD_A.encode() not in first
    ipv6 = identity("[fd00:1234:5678:9abc:def0:1234:5678:9abc]:7702")
    assert len(ipv6.seal(0, b"\0" * 24)) == len(first)  # padded alike
    assert padded(200) == 208 and padded(3) == ADDRESS_PAD
    long_name = identity("gateway-" + "x" * 100 + ":7702")
    assert long_name.route(long_name.seal(2, b"s")) == nnrp.Route(long_name.advertise, 2)
    route_bytes = ROUTE_OVERHEAD + ADDRESS_PAD
    # A fresh nonce per token, so its whole route differs from another's of the same pod.
    assert first[1:13] != second[1:13]
    assert first[13:route_bytes] != second[13:route_bytes]


def test_a_token_of_another_fleet_or_with_any_byte_changed_opens_no_route() -> None:
    token = identity(key=OTHER_KEY).seal(0, b"s" * 24)
    assert identity().route(token) is None
    genuine = identity().seal(0, b"s" * 24)
    for index in range(ROUTE_OVERHEAD + ADDRESS_PAD):
        forged = bytearray(genuine)
        forged[index] ^= 0x01
        assert identity().route(bytes(forged)) is None, index


def test_every_cut_of_a_token_opens_no_route_and_trailing_bytes_are_the_secret() -> None:
    pod = identity()
    token = pod.seal(1, b"")
    for size in range(len(token)):
        assert pod.route(token[:size]) is None, size
    for secret in (b"", b"x", b"y" * 100):
        assert pod.route(token + secret) == nnrp.Route(POD_A, 1)


@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise_and_never_route(data: bytes) -> None:
    assert identity().route(data) is None
    assert identity().open_forward(data, len(FIELDS)) is None
    assert identity().open_forward(data, 0) is None


def test_a_key_a_reload_drops_opens_routes_for_one_window() -> None:
    clock = Clock()
    pod = identity(clock=clock, keep_previous=120.0)
    old = pod.seal(0, b"s" * 24)
    assert pod.keys.rotate([OTHER_KEY])
    assert not pod.keys.rotate([OTHER_KEY])  # the same keys again: nothing changes
    new = pod.seal(0, b"t" * 24)
    assert identity(key=KEY).route(new) is None  # sealed with the new key
    assert pod.route(old) == pod.route(new) == nnrp.Route(POD_A, 0)
    clock.now += 119.9
    assert pod.route(old) is not None
    clock.now += 0.2
    assert pod.route(old) is None
    assert pod.route(new) is not None


def test_a_two_step_rotation_loses_nothing_whichever_pod_reloads_first() -> None:
    """F3: add the new key second and reload everywhere, then move it first: at every
    moment every pod opens every token any pod issues, whatever the order of reloads
    and however long it takes (no window involved)."""
    clock = Clock()
    pods = [identity(POD_A, clock=clock, keep_previous=1.0),
            identity(POD_B, clock=clock, keep_previous=1.0)]
    for keys in ([KEY, OTHER_KEY], [OTHER_KEY, KEY]):
        for reloaded in range(len(pods) + 1):  # pod 0 reloaded, then both
            for pod in pods[:reloaded]:
                pod.keys.rotate(keys)
            clock.now += 1000  # far past any window
            tokens = [pod.seal(0, b"s") for pod in pods]
            assert all(pod.route(token) is not None for pod in pods for token in tokens)
    assert pods[1].keys.rotate([OTHER_KEY])  # step 3: the old key goes


def test_a_token_whose_key_was_retired_still_opens_its_session_at_home() -> None:
    """A session that stayed attached through a rotation still holds a token sealed
    with the old key; once that key is gone its route opens nowhere, but the process
    that issued it knows the token by its digest (F2), so its client resumes there."""
    clock = Clock()
    pod = identity(POD_A, clock=clock, keep_previous=10.0)
    book = fleet_book(pod, clock=clock)
    conn = connection(book)
    (ack,) = replies(conn.receive_data(pk(attrs.evolve(
        nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3, max_in_flight=4),
        session_flags=nnrp.SessionFlag.ALLOW_RESUME))))
    token = ack.body
    pod.keys.rotate([OTHER_KEY])
    clock.now += 600
    assert pod.route(token) is None
    conn.connection_lost()
    (answer,) = replies(connection(book).receive_data(resume(token, ack.session_id)))
    assert answer.message.status == nnrp.SessionOpenStatus.RESUMED
    assert book.where(b"\xf1" + bytes(80)) is nnrp.Lookup.REJECTED  # not ours: refused


def test_a_key_too_short_or_no_key_is_refused_and_the_keys_in_use_stay() -> None:
    with pytest.raises(nnrp.FleetKeyError, match="at least 32 bytes"):
        identity(key=b"short")
    pod = identity()
    token = pod.seal(0, b"s" * 24)
    for bad in ([b"x" * 31], [], [KEY, b"short"]):
        with pytest.raises(nnrp.FleetKeyError):
            pod.keys.rotate(bad)
    assert pod.route(token) is not None
    assert nnrp.key_material(b"  " + KEY + b"\n") == [KEY]
    assert nnrp.key_material(b"# new key first\n" + OTHER_KEY + b"\n\n" + KEY + b"\n") == [
        OTHER_KEY, KEY]


# --------------------------------------------------------------------------- forwards (F4)

CLIENT = b"hello, then a resume with its token and credentials"


def opened(owner: nnrp.FleetIdentity, sealed: nnrp.SealedForward | bytes
           ) -> nnrp.OpenedForward | None:
    return owner.open_forward(sealed.opening if isinstance(sealed, nnrp.SealedForward)
                              else sealed, len(FIELDS))


def test_a_forward_seals_the_clients_bytes_and_is_taken_once_within_the_skew() -> None:
    wall = WallClock()
    sender, owner = identity(POD_B, wall=wall), identity(POD_A, wall=wall)
    sealed = sender.seal_forward(POD_A, FIELDS, CLIENT)
    assert CLIENT not in sealed.opening and b"token" not in sealed.opening
    head = sealed.opening[:nnrp.forward_head_size(len(FIELDS))]
    assert nnrp.forward_rest_size(head) == len(CLIENT) + 32
    taken = opened(owner, sealed)
    assert taken is not None
    assert (taken.fields, taken.client_bytes, taken.proof) == (FIELDS, CLIENT, sealed.proof)
    assert opened(owner, sealed) is None  # replayed
    late = sender.seal_forward(POD_A, FIELDS, CLIENT)
    wall.now += FORWARD_SKEW + 0.01
    assert opened(owner, late) is None  # stale
    early = sender.seal_forward(POD_A, FIELDS, CLIENT)
    wall.now -= 2 * FORWARD_SKEW + 0.02
    assert opened(owner, early) is None  # from a clock too far ahead
    empty = sender.seal_forward(POD_A, FIELDS, b"")
    assert (taken := opened(owner, empty)) is not None and taken.client_bytes == b""


def test_only_the_fleet_can_answer_a_forwards_proof() -> None:
    sender = identity(POD_B)
    sealed = sender.seal_forward(POD_A, FIELDS, CLIENT)
    other = sender.seal_forward(POD_A, FIELDS, CLIENT)
    assert sealed.proof != other.proof  # one per forward: a captured one answers nothing
    assert opened(identity(POD_A, OTHER_KEY), sealed) is None  # a stranger cannot open it


def test_a_forward_of_another_fleet_or_pod_or_changed_or_cut_is_refused() -> None:
    owner = identity(POD_A)
    assert opened(owner, identity(POD_B, OTHER_KEY).seal_forward(POD_A, FIELDS, CLIENT)) is None
    to_c = identity(POD_B).seal_forward(POD_C, FIELDS, CLIENT)
    assert opened(owner, to_c) is None  # genuine, but for pod C
    assert opened(identity(POD_C), to_c) is not None
    sealed = identity(POD_B).seal_forward(POD_A, FIELDS, CLIENT)
    for index in range(len(sealed.opening)):
        forged = bytearray(sealed.opening)
        forged[index] ^= 0x80
        assert opened(owner, bytes(forged)) is None, index
    for size in range(len(sealed.opening)):
        assert opened(owner, sealed.opening[:size]) is None, size
    assert opened(owner, sealed.opening + b"x") is None  # trailing bytes
    assert opened(owner, sealed) is not None  # none of that spent the genuine one


def test_a_forward_announcing_too_much_is_refused_before_it_is_read() -> None:
    sealed = identity(POD_B).seal_forward(POD_A, FIELDS, CLIENT)
    head = bytearray(sealed.opening[:nnrp.forward_head_size(len(FIELDS))])
    offset = len(head) - len(FIELDS) - 4
    head[offset:offset + 4] = (2 << 20).to_bytes(4, "big")
    assert nnrp.forward_rest_size(bytes(head)) is None
    assert nnrp.forward_rest_size(b"GET / HTTP/1.1\r\n" * 8) is None


def test_a_forward_sealed_with_a_dropped_key_is_taken_during_the_window() -> None:
    clock = Clock()
    owner = identity(POD_A, clock=clock)
    sealed = identity(POD_B).seal_forward(POD_A, FIELDS, CLIENT)  # a pod not yet reloaded
    owner.keys.rotate([OTHER_KEY])
    taken = opened(owner, sealed)
    assert taken is not None and taken.proof == sealed.proof
    clock.now += 121
    assert opened(owner, identity(POD_B).seal_forward(POD_A, FIELDS, CLIENT)) is None


# --------------------------------------------------------------------------- the book (R11)


def test_the_book_sends_another_pods_token_there_and_refuses_a_forged_one() -> None:
    pod_a, pod_b = identity(POD_A), identity(POD_B)
    book_a, book_b = fleet_book(pod_a), fleet_book(pod_b)
    conn_b = connection(book_b)
    (ack,) = replies(conn_b.receive_data(pk(attrs.evolve(
        nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3, max_in_flight=4),
        session_flags=nnrp.SessionFlag.ALLOW_RESUME))))
    token = ack.body
    assert pod_b.route(token) == nnrp.Route(POD_B, 0)
    assert book_a.find(ack.session_id, token, None) == nnrp.Elsewhere(0, POD_B)
    assert book_a.where(token) == nnrp.Elsewhere(0, POD_B)
    assert book_b.where(token) is None  # here
    made_up = b"\xf1" + b"\x00" * 60
    assert book_a.find(1, made_up, None) is nnrp.Lookup.REJECTED
    assert book_a.stats.refused_total == 1


def test_a_fleet_token_naming_a_worker_this_pod_lacks_is_refused() -> None:
    pod = identity(POD_A)
    book = fleet_book(pod, worker=0, relays=("w0", "w1"))
    assert book.where(pod.seal(1, b"s" * 24)) == nnrp.Elsewhere(1)
    assert book.where(pod.seal(2, b"s" * 24)) is nnrp.Lookup.REJECTED


# --------------------------------------------------------------------------- the server (4d, F5)


def test_a_resume_for_another_pod_is_handed_off_with_a_retry_later_refusal() -> None:
    book_a = fleet_book(identity(POD_A))
    token = identity(POD_B).seal(0, b"s" * 24)
    conn = connection(book_a)
    (handed,) = of(conn.receive_data(resume(token)), nnrp.HandedOff)
    assert handed.destination == nnrp.Elsewhere(0, POD_B)
    assert conn.state is nnrp.ConnState.HANDED_OFF
    refusal = nnrp.decode_packet(handed.refusal)
    assert refusal.message.status == nnrp.SessionOpenStatus.RETRY_LATER
    assert b"cannot be reached" in refusal.body
    busy = nnrp.decode_packet(handed.busy)
    assert busy.message.status == nnrp.SessionOpenStatus.RETRY_LATER


def test_a_forwarded_connection_is_never_forwarded_again() -> None:
    """F5: pod A forwarded this connection to pod B; a token there naming pod C (a loop
    attempt, or a lie) opens nothing, and nothing is handed anywhere."""
    book_b = fleet_book(identity(POD_B))
    to_c = identity(POD_C).seal(0, b"s" * 24)
    conn = connection(book_b, forwarded=True)
    events = conn.receive_data(resume(to_c))
    assert not of(events, nnrp.HandedOff)
    assert replies(events)[0].message.status == nnrp.SessionOpenStatus.REJECTED
    migrating = connection(book_b, forwarded=True)
    events = migrating.receive_data(pk(nnrp.SessionMigrate(
        old_transport_id=nnrp.TransportId.QUIC, new_transport_id=nnrp.TransportId.TCP,
        last_result_frame_id=0), session_id=1, body=to_c))
    assert not of(events, nnrp.HandedOff)


def test_a_forwarded_connection_may_still_go_to_the_worker_that_holds_the_session() -> None:
    pod_b = identity(POD_B)
    book_b0 = fleet_book(pod_b, worker=0, relays=("w0", "w1"))
    conn = connection(book_b0, forwarded=True)
    (handed,) = of(conn.receive_data(resume(pod_b.seal(1, b"s" * 24))), nnrp.HandedOff)
    assert handed.destination == nnrp.Elsewhere(1)
    refusal = nnrp.decode_packet(handed.refusal)
    assert refusal.message.status == nnrp.SessionOpenStatus.REJECTED  # that worker is gone
    busy = nnrp.decode_packet(handed.busy)  # reached, but it did not answer: it lives
    assert busy.message.status == nnrp.SessionOpenStatus.RETRY_LATER


def test_a_made_up_token_is_refused_where_it_lands_and_never_handed_off() -> None:
    book_a = fleet_book(identity(POD_A))
    for made_up in (b"\xf1" + b"\x01" * 70, b"\x00" * 24, identity(POD_B, OTHER_KEY).seal(
            0, b"s" * 24)):
        events = connection(book_a).receive_data(resume(made_up))
        assert not of(events, nnrp.HandedOff)
        assert replies(events)[0].message.status == nnrp.SessionOpenStatus.REJECTED


# --------------------------------------------------------------------------- ids (F6)


def test_a_fleets_session_ids_are_random_unique_and_honour_a_request() -> None:
    ids = nnrp.SessionIds(random_ids=True)
    taken = [ids.take() for _ in range(200)]
    assert len(set(taken)) == 200 and None not in taken
    assert taken != sorted(taken)
    free = next(n for n in range(1, 1000) if n not in taken)
    assert ids.take(requested=free) == free
    draws = iter([4, 4, 4, 4, 4, 4, 4, 4])  # every draw taken: the sequential rule
    crowded = nnrp.SessionIds(random_ids=True, randbelow=lambda _: next(draws))
    assert crowded.take(requested=5) == 5
    assert crowded.take() == 1
