"""A non-streaming answer's ``response.completed``, passed through (issue 25 item 5):
the event is the one the general encoder makes of the decoded body, as JSON, with vLLM's
bytes inside it untouched, for every recorded non-streaming answer."""

from __future__ import annotations

import json

import pytest

from gateway.profile import events as ev
from gateway.tools.replay import bundled_transcripts
from gateway.upstream import parse_completion

TRANSCRIPTS = bundled_transcripts()
ANSWERS = sorted(name for name, t in TRANSCRIPTS.items()
                 if not t.streaming and t.status == 200
                 and name.startswith(("nonstream_", "capture_nonstream")))


def test_every_kind_of_recorded_answer_is_there() -> None:
    assert len(ANSWERS) >= 15
    assert {"nonstream_tool_call", "nonstream_reasoning", "nonstream_metrics",
            "nonstream_prompt_logprobs", "nonstream_pair_logprobs_n2"} <= set(ANSWERS)


@pytest.mark.parametrize("name", ANSWERS)
def test_the_passed_through_event_is_the_encoded_one(name: str) -> None:
    raw = TRANSCRIPTS[name].body
    body = parse_completion(raw)  # checked first, as the client does
    event = ev.completed_text(raw)
    assert event == b'{"body":' + raw + b',"type":"response.completed"}'
    assert json.loads(event) == json.loads(ev.encode_event(ev.completed(body)))


def test_whitespace_around_the_body_is_dropped_and_text_inside_kept() -> None:
    raw = b' \r\n{"id":"x","text":"a \\u2028 \xe2\x80\xa8 \\"}\\\\"}\t\n'
    event = ev.completed_text(raw)
    assert event == (b'{"body":{"id":"x","text":"a \\u2028 \xe2\x80\xa8 \\"}\\\\"},'
                     b'"type":"response.completed"}')
    assert json.loads(event)["body"] == json.loads(raw)
