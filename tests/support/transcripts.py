"""Feeding recorded transcripts through the pure translation stages."""

from __future__ import annotations

from typing import Any

from gateway.pipeline import Translator
from gateway.pipeline._translate import forces_tool_choice
from gateway.tools.replay import family_transcripts
from gateway.upstream import parse_chunk, select_binding


def translate(name: str, family: str = "0.26", usage_requested: bool = True
              ) -> tuple[list[dict[str, Any]], Translator]:
    """``name`` as the replay server plays it for ``family`` (0.32 on: its recording)."""
    transcript = family_transcripts(family)[name]
    binding, _ = select_binding(transcript.vllm_version)
    translator = Translator(binding, usage_requested=usage_requested,
                            forced_tool_choice=forces_tool_choice(transcript.request_body))
    out: list[dict[str, Any]] = []
    for block in transcript.body.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            out += translator.feed(parse_chunk(block[6:].decode()))
    out += translator.finish()
    return out, translator
