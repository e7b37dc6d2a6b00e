"""The capability document: what this gateway claims, built from configuration and the probe.

Shape (reference-adapter.md section 6; schema api-profile-capabilities): profile,
schema_version, compatibility_levels [1], operations with streaming / non_streaming /
tool_calls / cancellation, models, extensions. ``tool_calls`` is true only when the
operator declares that vLLM runs with a tool parser (``--enable-auto-tool-choice
--tool-call-parser``): a sidecar cannot see vLLM's flags.
"""

from __future__ import annotations

from typing import Any

from ._envelope import CAPABILITIES_OPERATION, CHAT_COMPLETIONS, SCHEMA_VERSION

EXTENSIONS = (
    {"name": "vllm.diagnostics", "critical": False,
     "description": "response.diagnostics event when nnrp.diagnostics is true"},
    {"name": "vllm.reasoning", "critical": False,
     "description": "response.reasoning_text.delta from vLLM's reasoning parser"},
    {"name": CAPABILITIES_OPERATION, "critical": False,
     "description": "this document, answered over NNRP"},
)


def capability_document(*, adapter: str, models: tuple[str, ...], tool_calls: bool,
                        vllm_version: str | None = None,
                        backend_family: str | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {
        "$schema": "../../schemas/api-profile-capabilities.schema.json",
        "adapter": adapter,
        "profile": "openai-compatible",
        "schema_version": SCHEMA_VERSION,
        "compatibility_levels": [1],
        "operations": [{"name": CHAT_COMPLETIONS, "streaming": True, "non_streaming": True,
                        "tool_calls": tool_calls, "cancellation": True}],
        "models": [{"id": model, "owned_by": "vllm"} for model in models],
        "extensions": [dict(extension) for extension in EXTENSIONS],
    }
    if vllm_version is not None:
        document["backend"] = {"name": "vllm", "version": vllm_version,
                               "binding": backend_family}
    return document
