"""Every bundled transcript says where its bytes came from: recorded from a named vLLM
version, or synthesized, with the reason (issue 23: no invented wire shape passes as a
recording)."""

from __future__ import annotations

import re

import pytest

from gateway.tools.replay import bundled_transcripts
from gateway.tools.replay._synthesize import NOTES, synthesized

TRANSCRIPTS = bundled_transcripts()


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
def test_a_transcript_is_recorded_from_its_version_or_synthesized_with_a_reason(
        name: str) -> None:
    transcript = TRANSCRIPTS[name]
    note = transcript.note
    assert transcript.vllm_version
    recorded = note.startswith(f"recorded from vLLM {transcript.vllm_version}")
    synthesized_with_reason = re.match(r"synthesized\b[^:]*: \S.{10,}", note) is not None
    assert recorded != synthesized_with_reason, note


def test_every_hand_written_transcript_has_its_reason_and_is_bundled_with_it() -> None:
    written = {t.scenario for t in synthesized()}
    assert written == set(NOTES)
    for scenario in written:
        assert TRANSCRIPTS[scenario].note == NOTES[scenario]
        assert TRANSCRIPTS[scenario].vllm_version == "0.26.0"


def test_a_032_recording_stands_for_a_hand_written_scenario() -> None:
    recorded = {name.removesuffix("_032") for name in TRANSCRIPTS if name.endswith("_032")}
    assert recorded <= set(NOTES)
    for scenario in recorded:
        assert f"plays {scenario}_032" in NOTES[scenario]
        assert TRANSCRIPTS[f"{scenario}_032"].note.startswith("recorded from vLLM 0.32.0")
