"""The bench's cost figures, without vLLM: the /proc parsing, the owner of a listening
socket (this test process's own), the cost-against-goals rows under their names, events
against chunks."""

from __future__ import annotations

import os
import socket
from collections import Counter

import pytest

from gateway.tools.bench import rows
from gateway.tools.bench._procs import (
    listening_inodes,
    listening_socket_owners,
    socket_inode,
    stat_cpu_ticks,
)
from gateway.tools.bench.live_cost import (
    LiveCostUnavailable,
    Tally,
    cost_figures,
    events_versus_chunks,
    local_port,
    owners,
)
from gateway.tools.bench.stats import Figure

# proc(5)'s layout, with a command name holding a space and a ")": utime 1234, stime 56.
STAT = ("4242 (vllm: api) x) S 1 4242 4242 0 -1 4194560 31337 0 12 0 1234 56 0 0 20 0 9 0 "
        "771 2458378240 52311 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 1 "
        "0 0 0 0 0")

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 91001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F41 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 91002 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 91003 1 0000000000000000 100 0 0 10 0
"""


def test_cpu_ticks_are_utime_plus_stime_counted_from_the_last_parenthesis() -> None:
    assert stat_cpu_ticks(STAT) == 1234 + 56
    with open(f"/proc/{os.getpid()}/stat") as mine:
        assert stat_cpu_ticks(mine.read()) >= 0


def test_a_listening_socket_is_found_by_port_and_state_not_by_a_connection() -> None:
    # 0x1F41 = 8001: the listener (0A) and not the established connection (01) on it.
    assert listening_inodes(TCP, 8001) == {91001}
    assert listening_inodes(TCP, 80) == {91003}
    assert listening_inodes(TCP, 8002) == set()
    assert listening_inodes("header only\n", 8001) == set()
    assert socket_inode("socket:[91001]") == 91001
    assert socket_inode("pipe:[91001]") is None
    assert socket_inode("/dev/null") is None


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_the_owner_of_a_listening_socket_is_this_process(family: socket.AddressFamily
                                                         ) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family) as listener:
        listener.bind((host, 0))
        port = listener.getsockname()[1]
        # Bound, not yet listening: nobody listens there.
        assert listening_socket_owners(port) == []
        listener.listen()
        assert listening_socket_owners(port) == [os.getpid()]
        assert owners(port, "this test") == [os.getpid()]
        # A connection to it is not a listener: still only this process, once.
        with socket.create_connection((host, port)):
            assert listening_socket_owners(port) == [os.getpid()]
    with pytest.raises(LiveCostUnavailable, match=f"no process on this machine listens on "
                                                  f"port {port} \\(this test\\)"):
        owners(port, "this test")


def test_only_a_loopback_vllm_can_be_measured() -> None:
    assert local_port("http://127.0.0.1:8001", "vLLM") == 8001
    assert local_port("http://localhost:8001/v1", "vLLM") == 8001
    assert local_port("http://[::1]:9", "vLLM") == 9
    assert local_port("tcp://127.0.0.1:7000", "the gateway") == 7000
    assert local_port("http://localhost", "vLLM") == 80
    with pytest.raises(LiveCostUnavailable, match="vLLM must be on this machine's loopback"):
        local_port("http://10.0.0.7:8001", "vLLM")


def test_the_rows_are_named_by_what_they_measure() -> None:
    assert rows.SECTION == "gateway cost against goals"
    assert [row.name for row in rows.ROWS] == [
        "gateway's own work per event at 1 stream: added p50 minus the null relay's added "
        "p50, same run",
        "gateway CPU per paced event, 256 streams",
        "gateway CPU per coalesced event, 256 streams",
        "events/s, instant backend, 256 streams, one worker",
        "non-streaming added p50",
        "added p99 at 256 streams x 100 ev/s, as a multiple of the null relay's added p99 in "
        "the same run",
        "gateway CPU per streamed event / vLLM API-server CPU per SSE chunk, same run, real "
        "vLLM, 8-64 streams"]
    assert [(row.goal, row.unit) for row in rows.ROWS] == [
        (40, "us"), (20, "us"), (10, "us"), (50_000, "events/s"), (150, "us"), (1.25, "x"),
        (0.5, "x")]


def _run() -> dict[str, list[Figure]]:
    """A full ``bench run``'s figures that the rows are made from."""
    return {
        "latency": [Figure("added event latency p50, 1 stream(s)", 326, "us"),
                    Figure("added by the hop (null relay) p50, 1 stream(s)", 211, "us"),
                    Figure("added event latency p99, 256 stream(s)", 181_000, "us"),
                    Figure("added by the hop (null relay) p99, 256 stream(s)", 96_000, "us")],
        "cost": [Figure("gateway CPU per event, 256 stream(s), paced", 41.5, "us"),
                 Figure("gateway CPU per event, 256 stream(s), coalesced", 21.5, "us"),
                 Figure("gateway CPU per event, 1 stream(s), paced", 300, "us")],
        "throughput": [Figure("events/s through the gateway, 256 stream(s)", 27_600,
                              "events/s", higher_is_better=True)],
        "unary": [Figure("non-streaming added latency p50", 329, "us")],
        "cancellation": [Figure("frames after the cancel's terminal", 0, "frames")]}


def test_bench_run_reports_each_row_it_measures_from_the_same_runs_figures() -> None:
    made = {figure.name: figure for figure in rows.run_rows(_run())}
    assert list(made) == [row.name for row in rows.ROWS[:6]]
    own = made[rows.OWN_WORK.name]
    assert (own.value, own.goal, own.goal_met) == (115, 40, False)
    assert own.spread.startswith("326 - 211 = 115 us")
    multiple = made[rows.P99_MULTIPLE.name]
    assert multiple.value == pytest.approx(181 / 96)
    assert multiple.spread.startswith("181.0 / 96.0 ms = 1.89x")
    assert made[rows.CPU_PACED.name].value == 41.5
    assert made[rows.CPU_COALESCED.name].value == 21.5
    events = made[rows.EVENTS_PER_S.name]
    assert (events.value, events.goal_met) == (27_600, False)
    assert made[rows.UNARY_ADDED.name].value == 329
    assert rows.run_rows({"events": []}) == []


def test_a_row_whose_figures_the_run_lacks_is_not_reported() -> None:
    run = _run()
    run["latency"] = run["latency"][:3]  # no null relay p99 at 256 streams (--quick)
    del run["cost"]
    names = [figure.name for figure in rows.run_rows(run)]
    assert names == [rows.OWN_WORK.name, rows.EVENTS_PER_S.name, rows.UNARY_ADDED.name]


def test_live_cost_figures_carry_the_ratio_row_and_say_why_events_and_chunks_differ() -> None:
    # 8 streams: the chunk count found 1 chunk a request without an event (the role
    # chunk); then 8 x 2 requests of 16 tokens, 16 text deltas each: 17 chunks a request.
    counted = Tally(requests=8, events=Counter({"response.output_text.delta": 128,
                                                "response.openai_chunk": 8}),
                    chunks_with_output=128, chunks_without_output=8)
    gateway = Tally(requests=16, events=Counter({"response.output_text.delta": 256}),
                    gateway_cpu=0.01024, api_cpu=0.0272)
    direct = Tally(requests=16, chunks_with_output=192, chunks_without_output=16,
                   api_cpu=0.0270)
    figures = {f.name: f for f in cost_figures(8, 16, counted, gateway, direct, [77], 1.0)}
    per_event = figures["gateway CPU per streamed event, 8 streams, real vLLM"]
    per_chunk = figures["vLLM API-server CPU per SSE chunk, 8 streams, real vLLM"]
    assert per_event.value == pytest.approx(40.0)
    assert per_chunk.value == pytest.approx(27_200 / (256 + 16))  # 100 us
    assert "pid(s) 77" in per_chunk.spread and "256 with text + 1.00 a request" in \
        per_chunk.spread
    ratio = figures[rows.LIVE_RATIO.name]
    assert (ratio.value, ratio.goal, ratio.goal_met) == (pytest.approx(0.4), 0.5, True)
    versus = figures["events per SSE chunk, 8 streams, real vLLM"]
    assert versus.value == pytest.approx(16 / 17)
    assert versus.spread.startswith("16.0 events and 17.0 SSE chunks a request (16 tokens); "
                                    "1.0 chunks a request carry no text")
    assert "direct, the same requests came in 13.0 chunks a request" in versus.spread
    # Direct is a cross-check beside it, against the gateway path's figure.
    direct_figure = figures["vLLM API-server CPU per SSE chunk, direct, 8 streams, real vLLM"]
    assert direct_figure.value == pytest.approx(27_000 / 208)
    assert direct_figure.baseline == pytest.approx(per_chunk.value)


def test_events_versus_chunks_names_each_reason_it_sees() -> None:
    same = events_versus_chunks(18.0, 16.0, 18.0, 16.0, 16)
    assert same.endswith("the same count")
    merged = events_versus_chunks(10.0, 10.0, 11.0, 10.0, 16)
    assert "1.0 chunks a request carry no text" in merged
    assert "vLLM sent 1.60 tokens a chunk with text" in merged
    assert "not text deltas" not in merged and "text deltas 10.0 against" not in merged
    extra = events_versus_chunks(17.0, 16.0, 16.0, 15.0, 16)
    assert "1.0 events a request are not text deltas" in extra
    assert "text deltas 16.0 against chunks with text 15.0 a request" in extra
