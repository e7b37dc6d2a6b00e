"""``FlowControl.active`` reads the connection window field by field (issue 25): it must
say exactly what comparing with a fresh ``Window()`` says, for every field a window has."""

from __future__ import annotations

import attrs
from hypothesis import given, strategies as st

from gateway.nnrp import FlowControl
from gateway.nnrp._flow import Window


@given(credits=st.none() | st.integers(0, 5), paused=st.booleans(),
       not_before=st.sampled_from([0.0, -0.0, 1e-9, 3.5]), epoch=st.integers(0, 3),
       sessions=st.booleans(), operations=st.booleans())
def test_active_is_any_window_set(credits: int | None, paused: bool, not_before: float,
                                  epoch: int, sessions: bool, operations: bool) -> None:
    flow = FlowControl(clock=lambda: 0.0)
    flow.connection = Window(credits=credits, paused=paused, not_before=not_before,
                             epoch=epoch)
    if sessions:
        flow.sessions[1] = Window()
    if operations:
        flow.operations[(1, 1)] = Window()
    assert flow.active == (sessions or operations or flow.connection != Window())


def test_every_window_field_is_read() -> None:
    # A field added to Window must be added to ``active`` too: this names them all.
    assert [field.name for field in attrs.fields(Window)] == [
        "credits", "paused", "not_before", "epoch"]
