"""vLLM version bindings: which wire differences each supported family has.

The gateway talks to vLLM's public HTTP API only; vLLM is not a Python dependency. Its
OpenAI frontend still differs between releases (vllm-http.md sections 1-2), so a probe of
``GET /version`` at start-up picks one binding that normalises them:

* 0.18.x (anchor 0.18.1): no prompt_text, no system_fingerprint; ``"tool_calls":[]``
  leaks into content deltas; non-streaming messages always carry ``"tool_calls":[]``.
* 0.22.x (anchor 0.22.1): prompt_text and fingerprint; the same ``tool_calls: []``
  noise; ``routed_experts`` in bodies.
* 0.26.x (anchor 0.26.0): empty tool lists already stripped; ``metrics`` and
  ``ec_transfer_params`` in bodies.

Any other minor stops start-up (naming the detected version, the families and anchors)
unless the operator allows untested versions; then the nearest binding is used.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ._errors import UpstreamError

#: vLLM-internal fields of a non-streaming body that are not OpenAI's; dropped so every
#: family yields the same completed body.
_INTERNAL_BODY_FIELDS = ("prompt_logprobs", "prompt_token_ids", "prompt_text",
                         "kv_transfer_params", "ec_transfer_params", "metrics",
                         "routed_experts")
_INTERNAL_CHOICE_FIELDS = ("token_ids", "routed_experts")


class UnsupportedVersion(UpstreamError):
    """The probed vLLM version is outside the tested families."""


@attrs.frozen
class Binding:
    family: str
    anchor: str
    minor: tuple[int, int]
    empty_tool_calls_noise: bool

    def clean_delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        """Drop the ``tool_calls: []`` noise of 0.18/0.22 parsers from a delta."""
        if self.empty_tool_calls_noise and delta.get("tool_calls") == []:
            delta = {k: v for k, v in delta.items() if k != "tool_calls"}
        return delta

    def normalize_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming chat.completion in the family-independent form."""
        out = {k: v for k, v in body.items() if k not in _INTERNAL_BODY_FIELDS}
        if out.get("system_fingerprint") is None:
            out.pop("system_fingerprint", None)
        choices = []
        for choice in out.get("choices") or []:
            if not isinstance(choice, dict):
                choices.append(choice)
                continue
            choice = {k: v for k, v in choice.items() if k not in _INTERNAL_CHOICE_FIELDS}
            message = choice.get("message")
            if isinstance(message, dict) and message.get("tool_calls") == []:
                choice["message"] = {k: v for k, v in message.items() if k != "tool_calls"}
            choices.append(choice)
        if "choices" in out:
            out["choices"] = choices
        return out


BINDINGS: tuple[Binding, ...] = (
    Binding("0.18.x", "0.18.1", (0, 18), empty_tool_calls_noise=True),
    Binding("0.22.x", "0.22.1", (0, 22), empty_tool_calls_noise=True),
    Binding("0.26.x", "0.26.0", (0, 26), empty_tool_calls_noise=False),
)
SUPPORTED_BAND = "vllm>=0.18.0,<0.27"


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise UnsupportedVersion(f"cannot read a vLLM version from {text!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def select_binding(version: str, *, allow_untested: bool = False) -> tuple[Binding, bool]:
    """The binding for ``version``; the flag says whether it is an untested fallback."""
    major, minor, _ = parse_version(version)
    for binding in BINDINGS:
        if binding.minor == (major, minor):
            return binding, False
    families = ", ".join(f"{b.family} (anchor {b.anchor})" for b in BINDINGS)
    if not allow_untested:
        raise UnsupportedVersion(
            f"vLLM {version} is not a tested version. Supported families: {families} "
            f"({SUPPORTED_BAND}). Start with --allow-untested-vllm to use the nearest "
            "binding anyway.")
    nearest = min(BINDINGS, key=lambda b: abs((b.minor[0] * 1000 + b.minor[1])
                                              - (major * 1000 + minor)))
    return nearest, True
