"""Who gets an upstream slot when every one is busy (gateway/upstream/_slots.py rules 1-3):
operations whose client is away give way to live requests (issue 34, finding 5: eight
detached streams at their bound held all 8 slots and a live request got 503)."""

from __future__ import annotations

import attrs
import pytest
import trio

from gateway.upstream import Standing, UpstreamOverloaded
from gateway.upstream._slots import ConnectionSlots


class Client:
    async def aclose(self) -> None:
        pass


@attrs.define(eq=False)
class Holder:
    """A slot's holder: its standing, and the scope that ends it when asked."""

    standing_now: Standing = Standing.LIVE
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    asked: int = 0

    def standing(self) -> Standing:
        return self.standing_now

    def give_way(self) -> None:
        self.asked += 1
        self.scope.cancel()


async def hold(slots: ConnectionSlots[Client], holder: Holder,
               task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with holder.scope:
        async with slots.checkout(holder=holder):
            task_status.started()
            await trio.sleep_forever()


@pytest.mark.parametrize("standing", [Standing.LIVE, Standing.DETACHED, Standing.PAUSED])
async def test_a_waiting_request_takes_the_slot_of_a_paused_detached_holder_only(
        standing: Standing, autojump_clock: trio.testing.MockClock) -> None:
    slots: ConnectionSlots[Client] = ConnectionSlots(1, Client, detached_share=1.0)
    holder = Holder(standing)
    async with trio.open_nursery() as nursery:
        await nursery.start(hold, slots, holder)
        if standing is Standing.PAUSED:
            with trio.fail_after(1):
                async with slots.checkout(wait=5):
                    pass
            assert (holder.asked, slots.given_way) == (1, 1)
        else:
            with pytest.raises(UpstreamOverloaded):
                async with slots.checkout(wait=5):
                    pass
            assert holder.asked == 0
        nursery.cancel_scope.cancel()


async def test_detached_holders_beyond_their_share_give_way_oldest_first(
        autojump_clock: trio.testing.MockClock) -> None:
    slots: ConnectionSlots[Client] = ConnectionSlots(4, Client, detached_share=0.5)
    holders = [Holder(Standing.DETACHED) for _ in range(3)] + [Holder(Standing.LIVE)]
    async with trio.open_nursery() as nursery:
        for holder in holders:
            await nursery.start(hold, slots, holder)
        async with slots.checkout(wait=5):  # three detached of four: one over its share
            assert [h.asked for h in holders] == [1, 0, 0, 0]
        async with slots.checkout(wait=5):  # two detached now: within the share
            pass
        nursery.cancel_scope.cancel()
    assert slots.wait_timeouts == 0


async def test_within_the_share_detached_holders_keep_their_slots(
        autojump_clock: trio.testing.MockClock) -> None:
    slots: ConnectionSlots[Client] = ConnectionSlots(4, Client, detached_share=0.5)
    holders = [Holder(Standing.DETACHED), Holder(Standing.DETACHED), Holder(), Holder()]
    async with trio.open_nursery() as nursery:
        for holder in holders:
            await nursery.start(hold, slots, holder)
        with pytest.raises(UpstreamOverloaded):
            async with slots.checkout(wait=1):
                pass
        assert [h.asked for h in holders] == [0, 0, 0, 0]
        nursery.cancel_scope.cancel()


async def test_one_holder_gives_way_per_waiting_request(
        autojump_clock: trio.testing.MockClock) -> None:
    slots: ConnectionSlots[Client] = ConnectionSlots(3, Client, detached_share=1.0)
    holders = [Holder(Standing.PAUSED) for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for holder in holders:
            await nursery.start(hold, slots, holder)
        async with slots.checkout(wait=5):
            assert sum(h.asked for h in holders) == 1
        nursery.cancel_scope.cancel()


async def test_beyond_their_share_only_as_many_give_way_as_are_needed(
        autojump_clock: trio.testing.MockClock) -> None:
    """A review of issue 34: six detached of eight, a share of four, three waiting: two
    are over the share, so two give way (three did)."""
    slots: ConnectionSlots[Client] = ConnectionSlots(8, Client, detached_share=0.5)
    holders = [Holder(Standing.DETACHED) for _ in range(6)] + [Holder(), Holder()]
    async with trio.open_nursery() as nursery:
        for holder in holders:
            await nursery.start(hold, slots, holder)
        for _ in range(3):
            nursery.start_soon(_checkout_briefly, slots)
        await trio.sleep(0.1)
        assert sum(holder.asked for holder in holders) == 2
        nursery.cancel_scope.cancel()


async def _checkout_briefly(slots: ConnectionSlots[Client]) -> None:
    async with slots.checkout(wait=10):
        await trio.sleep(0.01)


@pytest.mark.parametrize("leaves_as", [Standing.PAUSED, Standing.DETACHED])
async def test_a_holder_that_leaves_while_a_request_waits_gives_way_then(
        leaves_as: Standing, autojump_clock: trio.testing.MockClock) -> None:
    """Rule 3: the wait began while every holder was live; one pauses, or its client
    leaves (over the share, 0 here: it gives way at once), later."""
    slots: ConnectionSlots[Client] = ConnectionSlots(1, Client, detached_share=0.0)
    holder = Holder(Standing.LIVE)
    got = trio.Event()

    async def wait_for_slot() -> None:
        async with slots.checkout(wait=10):
            got.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(hold, slots, holder)
        nursery.start_soon(wait_for_slot)
        await trio.sleep(1)
        assert not got.is_set()
        holder.standing_now = leaves_as
        slots.make_room()  # what a pause or a detach calls (Operation.may_give_way)
        with trio.fail_after(1):
            await got.wait()
        assert holder.asked == 1
