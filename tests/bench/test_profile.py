"""``bench profile``: collapsed stacks read, shared out and drawn (pure, byte by byte), and
the command run for real against a gateway process where py-spy may attach."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.bench.flame import (
    NO_STACK,
    FrameShare,
    area,
    area_shares,
    frame_shares,
    parse_collapsed,
    render_svg,
    to_collapsed,
    top_frames_table,
)
from tests.support.build import pure_only

runner = CliRunner()

# A gateway-like profile: 10 samples, the same stack twice (adds up), a recursion, a
# sample with no Python stack.
RAW = """\
main (m.py);run (trio/_run.py);emit (g/_op.py);encode (g/_codec.py) 4
main (m.py);run (trio/_run.py);emit (g/_op.py) 1
main (m.py);run (trio/_run.py);wait (trio/_io.py) 2

main (m.py);run (trio/_run.py);emit (g/_op.py);encode (g/_codec.py) 1
main (m.py);walk (g/w.py);walk (g/w.py) 1
 1
"""


def test_collapsed_stacks_add_up_and_keep_a_sample_without_a_stack() -> None:
    stacks = parse_collapsed(RAW)
    assert stacks == {
        ("main (m.py)", "run (trio/_run.py)", "emit (g/_op.py)", "encode (g/_codec.py)"): 5,
        ("main (m.py)", "run (trio/_run.py)", "emit (g/_op.py)"): 1,
        ("main (m.py)", "run (trio/_run.py)", "wait (trio/_io.py)"): 2,
        ("main (m.py)", "walk (g/w.py)", "walk (g/w.py)"): 1,
        (NO_STACK,): 1}
    # Written back sorted, one line per stack: read again, the same stacks (a diff of two
    # profiles is a diff of these lines).
    text = to_collapsed(stacks)
    assert text.splitlines() == sorted(text.splitlines())
    assert parse_collapsed(text) == stacks


@pytest.mark.parametrize("line", ["main;run", "main;run x", "main;run 1.5", "main;run -1"])
def test_a_line_that_is_not_a_stack_and_a_count_is_named(line: str) -> None:
    with pytest.raises(ValueError, match=r"line 2 is not 'frame;frame;\.\.\. count'"):
        parse_collapsed(f"a;b 1\n{line}\n")


def test_self_share_is_the_innermost_frame_and_total_counts_a_recursion_once() -> None:
    shares = {share.frame: share for share in frame_shares(parse_collapsed(RAW))}
    assert shares["encode (g/_codec.py)"] == FrameShare("encode (g/_codec.py)", 5, 5, .5, .5)
    assert shares["emit (g/_op.py)"] == FrameShare("emit (g/_op.py)", 1, 6, .1, .6)
    assert shares["walk (g/w.py)"] == FrameShare("walk (g/w.py)", 1, 1, .1, .1)
    assert shares["main (m.py)"] == FrameShare("main (m.py)", 0, 9, 0.0, .9)
    assert shares[NO_STACK].self_samples == 1
    ordered = [share.frame for share in frame_shares(parse_collapsed(RAW))]
    assert ordered[:2] == ["encode (g/_codec.py)", "wait (trio/_io.py)"]  # most self first
    table = top_frames_table(frame_shares(parse_collapsed(RAW)), count=2)
    assert table.splitlines() == ["| frame | self | total |", "|---|---:|---:|",
                                  "| `encode (g/_codec.py)` | 50.0 % | 50.0 % |",
                                  "| `wait (trio/_io.py)` | 20.0 % | 20.0 % |"]
    assert frame_shares({}) == []


def test_self_time_by_area_names_the_gateways_unit_or_the_package() -> None:
    assert area("emit (gateway/server/_operation.py)") == "gateway/server"
    assert area("send_now (gateway/_sockio.py)") == "gateway/_sockio.py"
    assert area("JSONDecoder.decode (json/decoder.py)") == "json"
    assert area("<module> (nnrp-gateway)") == "nnrp-gateway"
    assert area("__init__ (<attrs generated methods x.Y>)") == "<attrs generated methods x.Y>"
    assert area(NO_STACK) == NO_STACK
    stacks = {("m (gateway/a/x.py)", "f (gateway/b/y.py)"): 3, ("m (gateway/a/x.py)",): 1,
              ("g (trio/_run.py)",): 4}
    assert area_shares(stacks) == [("trio", .5), ("gateway/b", .375), ("gateway/a", .125)]


def test_the_flame_graph_draws_each_frame_as_wide_as_its_samples() -> None:
    svg = render_svg(parse_collapsed(RAW), "a <title> & more")
    root = ET.fromstring(svg)  # well-formed, the title escaped
    ns = {"s": "http://www.w3.org/2000/svg"}
    boxes = {}
    for group in root.findall("s:g", ns):
        title = group.find("s:title", ns)
        rect = group.find("s:rect", ns)
        assert title is not None and title.text is not None and rect is not None
        boxes[title.text.rsplit(" (", 1)[0]] = rect  # the frame, less "(N samples, S %)"
    width = float(root.attrib["width"])
    assert float(boxes["all"].attrib["width"]) == width
    # emit: 6 of 10 samples; its child encode 5; both start where run starts (children
    # are laid out left to right in name order: emit, then wait).
    emit = boxes["emit (g/_op.py)"]
    assert float(emit.attrib["width"]) == pytest.approx(width * 0.6, abs=0.1)
    assert float(boxes["encode (g/_codec.py)"].attrib["width"]) == pytest.approx(width / 2,
                                                                                 abs=0.1)
    assert emit.attrib["x"] == boxes["run (trio/_run.py)"].attrib["x"]
    # One row up per frame: encode sits right above emit.
    assert float(emit.attrib["y"]) - float(boxes["encode (g/_codec.py)"].attrib["y"]) == 16
    # The same file, the same colour, in any graph (fills: background, "all", walk).
    assert boxes["walk (g/w.py)"].attrib["fill"] == render_svg(
        {("walk (g/w.py)",): 1}, "x").split('fill="')[3].split('"')[0]
    assert "a &lt;title&gt; &amp; more (10 samples)" in svg


def test_a_frame_too_narrow_to_see_is_left_out_but_counts_in_its_parent() -> None:
    stacks = {("main (m.py)", "big (b.py)"): 100_000, ("main (m.py)", "tiny (t.py)"): 1}
    svg = render_svg(stacks, "t")
    assert "big (b.py)" in svg and "tiny (t.py)" not in svg
    assert "main (m.py) (100001 samples" in svg


@pytest.mark.slow
@pure_only("py-spy reads Python frames, and the pipeline's per-event ones are compiled")
def test_bench_profile_quick_records_a_flame_graph_of_the_gateway(tmp_path: Path) -> None:
    from gateway.tools.bench.profile import can_attach

    why_not = can_attach()
    if why_not is not None:
        pytest.skip(f"py-spy cannot attach here: {why_not}")
    result = runner.invoke(app, ["bench", "profile", "--quick", "--rate", "100", "--json",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [p["load"]["name"] for p in document["profiles"]] == [
        "paced-256", "paced-1", "coalesced-256", "requests-16", "unary-1"]
    for profile in document["profiles"]:
        name, load = profile["load"]["name"], profile["load"]
        # Every request got every event (a non-streaming answer counts as its one event).
        assert profile["requests"] == load["streams"] * load["requests"], name
        assert profile["events"] == profile["requests"] * load["events"], name
        assert profile["samples"] > 0 and profile["cpu_per_event_us"] > 0
        stacks = parse_collapsed((tmp_path / f"{name}.collapsed").read_text())
        assert sum(stacks.values()) == profile["samples"]
        # The gateway's own code is in the graph: its pipeline streams the events.
        frames = {frame for stack in stacks for frame in stack}
        assert any("gateway/pipeline/" in frame for frame in frames), sorted(frames)[:20]
        ET.fromstring((tmp_path / f"{name}.svg").read_text())
    text = (tmp_path / "profile.md").read_text()
    assert "Frames with the most self time" in text
    assert " us a request" in text and " us an event" in text
    assert json.loads((tmp_path / "profile.json").read_text()) == document


async def test_py_spy_that_cannot_attach_says_why_in_its_own_words(tmp_path: Path) -> None:
    import subprocess
    import tempfile

    from gateway.tools.bench.profile import ProfilerUnavailable, _attached

    with tempfile.TemporaryFile() as said:
        refused = subprocess.Popen(  # noqa: ASYNC220 - in py-spy's place, as _record starts it
            ["sh", "-c", "echo 'Error: Operation not permitted (os error 1)'; exit 1"],
            stdout=said)
        with trio.fail_after(10), pytest.raises(ProfilerUnavailable,
                                                match=r"^Error: Operation not permitted"):
            await _attached(refused, said)
        refused.wait()
    with tempfile.TemporaryFile() as said:
        sampling = subprocess.Popen(  # noqa: ASYNC220 - in py-spy's place
            ["sh", "-c", "echo 'py-spy> Sampling process 250 times a second.'; sleep 30"],
            stdout=said)
        try:
            with trio.fail_after(10):
                await _attached(sampling, said)  # returns: it samples
            assert sampling.poll() is None
        finally:
            sampling.kill()
            sampling.wait()


def test_bench_profile_without_py_spy_is_a_clear_error(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = runner.invoke(app, ["bench", "profile", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith(
        "error: cannot profile the gateway: py-spy is not installed (pip install "
        "'nnrp-vllm-gateway[profile]')")
    assert list((tmp_path / "out").iterdir()) == []  # nothing started, nothing written


def test_a_load_that_did_not_complete_is_an_error_not_a_profile() -> None:
    """Rule 6: a profile of requests that timed out under the sampler read "0 events"
    as if it were the load's."""
    from gateway.tools.bench.profile import LOADS_BY_NAME, LoadIncomplete, check_complete

    paced = LOADS_BY_NAME["paced-256"]
    check_complete(paced, 256)
    with pytest.raises(LoadIncomplete, match=r"paced-256: 255 of 256 requests ended with "
                                               r"their answer.*--rate"):
        check_complete(paced, 255)
    short = LOADS_BY_NAME["requests-16"].quick()
    check_complete(short, 16 * short.requests)
    with pytest.raises(LoadIncomplete, match=r"requests-16: 0 of 320 requests"):
        check_complete(short, 0)
