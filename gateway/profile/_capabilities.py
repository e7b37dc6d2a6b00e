"""The capability document: what this gateway claims, built from configuration and the probe.

Shape (docs/reference/reference-adapter.md section 6; schema api-profile-capabilities): profile,
schema_version, compatibility_levels [1], operations with streaming / non_streaming /
tool_calls / cancellation, models, extensions; beside them, as the project's own keys,
``backend`` (vLLM's version and binding), ``nnrp`` (the runtime-control tokens and
every bound listener, quic:// included) and ``build`` (``pure`` or ``compiled``: whether
the per-event modules run compiled here, gateway/compiled.py). ``tool_calls`` is true only when the
operator declares that vLLM runs with a tool parser (``--enable-auto-tool-choice
--tool-call-parser``): a sidecar cannot see vLLM's flags.

The document is frozen attrs classes, turned into JSON-ready data by cattrs at the edge.
It carries no ``$schema``: the suite's schema lives in the suite's repository, and its
``$id`` is an identifier, not an address that answers, so any value here would name a
file no consumer has. ``profile`` and ``schema_version`` say what the document is; the
vendored copy of the schema (recipes/suite/schemas/api-profile-capabilities.schema.json,
installed under gateway/tools/conformance/recipes/) is what it is checked against.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from gateway.compiled import build

from ._envelope import CAPABILITIES_OPERATION, CHAT_COMPLETIONS, SCHEMA_VERSION
from ._media import (
    DEFAULT_MAX_MEDIA_BYTES,
    MAX_MEDIA_FRAMES,
    REFERENCE_FIELDS,
    SIGNATURES,
)


@attrs.frozen
class OperationCapabilities:
    name: str
    streaming: bool
    non_streaming: bool
    tool_calls: bool
    cancellation: bool


@attrs.frozen
class Extension:
    name: str
    critical: bool
    description: str


@attrs.frozen
class Model:
    id: str
    owned_by: str = "vllm"


@attrs.frozen
class Backend:
    name: str
    version: str
    binding: str | None
    #: How the binding's anchor was verified: "gpu_smoke" (the band's anchors, the GPU
    #: smoke's targets) or "live_cpu" (0.32.0: the live tier on the CPU build only).
    evidence: str | None = None


@attrs.frozen
class Listener:
    """One bound NNRP listener: where a client reaches this gateway, over what."""

    transport: str
    uri: str
    #: quic:// only: the ALPN policy (none, nnrp/1, any); the certificate is in the
    #: target manifest's security block.
    alpn: str | None = None


@attrs.frozen
class Runtime:
    """The NNRP runtime-control layer served beside the profile, and its listeners."""

    protocol: str
    runtime_tokens: tuple[str, ...]
    priority_scheduling: bool
    listeners: tuple[Listener, ...] = ()


@attrs.frozen
class MediaCapabilities:
    """``gateway.media``: media frames beside the envelope (``_media``'s rules)."""

    #: Where a content part may name a frame, and the reference's form.
    parts: tuple[str, ...] = tuple(f"{part}.{field}"
                                   for part, (field, _, _) in REFERENCE_FIELDS.items())
    reference: str = ("nnrp:frame/N, nnrp:object/ID[@VERSION] or nnrp:cache/NS/KEY, then "
                      "[;type=TYPE/SUBTYPE]")
    frame_kinds: tuple[str, ...] = ("OPAQUE", "AUDIO", "VIDEO")
    #: The types recognised from the bytes; any other is given with ``;type=``.
    recognised_types: tuple[str, ...] = tuple(media_type for media_type, _ in SIGNATURES)
    max_frames: int = MAX_MEDIA_FRAMES
    max_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    #: How the bytes reach vLLM: "data_uri" or "file" (``--media-dir``).
    delivery: str = "data_uri"


@attrs.frozen(kw_only=True)
class CapabilityDocument:
    adapter: str
    profile: str = "openai-compatible"
    schema_version: str = SCHEMA_VERSION
    compatibility_levels: tuple[int, ...] = (1,)
    operations: tuple[OperationCapabilities, ...]
    models: tuple[Model, ...]
    extensions: tuple[Extension, ...]
    backend: Backend | None = None
    nnrp: Runtime | None = None
    media: MediaCapabilities | None = None
    build: str | None = None


#: The runtime capability tokens this gateway implements (answered in CAPABILITY_NEGOTIATION
#: and listed in the document). ``control.priority_update`` only when vLLM schedules by
#: priority; hints are not served. The object tokens are the session's object table
#: (gateway.nnrp._objects): declared, referenced, released, patched, each bounded, costs
#: accounted; a request reads one as media (docs/media.md). ``cache.reference``: the
#: session's cache (gateway.nnrp._cache): CACHE_PUT kept, CACHE_REFERENCE and a submit's
#: reference blocks resolved, CACHE_INVALIDATE honoured (docs/runtime-controls.md).
RUNTIME_TOKENS = frozenset({
    "control.cancel_abort", "control.supersede", "control.deadline_expire",
    "control.progress_partial", "control.credit_backpressure", "control.capability_costs",
    "control.trace_context", "control.result_drop_reason", "control.degrade_profile",
    "control.budget_update", "control.recoverable_error",
    "object.lifecycle", "object.delta", "object.cost", "object.ownership",
    "cache.reference",
})


def runtime_tokens(*, priority_scheduling: bool) -> frozenset[str]:
    return RUNTIME_TOKENS | ({"control.priority_update"} if priority_scheduling else set())


EXTENSIONS = (
    Extension("vllm.diagnostics", False,
              "response.diagnostics event when nnrp.diagnostics is true"),
    Extension("vllm.reasoning", False,
              "response.reasoning_text.delta from vLLM's reasoning parser"),
    Extension("vllm.logprobs", False,
              "logprobs and token_ids on delta events (as vLLM sent them per chunk); a "
              "token without text is a text delta with an empty delta"),
    Extension("vllm.openai_chunk", False,
              "response.openai_chunk for a vLLM chunk that maps to no other event, when "
              "nnrp.include_openai_chunk is true"),
    Extension(CAPABILITIES_OPERATION, False, "this document, answered over NNRP"),
    Extension("nnrp.resume_after_sequence", False,
              "on a resubmission after a session resume: the last result_sequence the "
              "client holds; only later results are sent again"),
    Extension("gateway.media", False,
              "media as typed frames beside the envelope (OPAQUE, AUDIO, VIDEO), named "
              "from content parts as nnrp:frame/N; the media block says where and how"),
)

_converter = cattrs.Converter()
_converter.register_unstructure_hook(Backend, make_dict_unstructure_fn(
    Backend, _converter, evidence=override(omit_if_default=True)))
_converter.register_unstructure_hook(Listener, make_dict_unstructure_fn(
    Listener, _converter, alpn=override(omit_if_default=True)))
_converter.register_unstructure_hook(CapabilityDocument, make_dict_unstructure_fn(
    CapabilityDocument, _converter, backend=override(omit_if_default=True),
    nnrp=override(omit_if_default=True), media=override(omit_if_default=True)))


def capability_document(*, adapter: str, models: tuple[str, ...], tool_calls: bool,
                        vllm_version: str | None = None, backend_family: str | None = None,
                        backend_evidence: str | None = None,
                        priority_scheduling: bool | None = None,
                        listeners: tuple[Listener, ...] = (),
                        media: MediaCapabilities | None = None) -> dict[str, Any]:
    document = CapabilityDocument(
        adapter=adapter,
        operations=(OperationCapabilities(CHAT_COMPLETIONS, streaming=True, non_streaming=True,
                                          tool_calls=tool_calls, cancellation=True),),
        models=tuple(Model(model) for model in models),
        extensions=EXTENSIONS,
        backend=(Backend("vllm", vllm_version, backend_family, backend_evidence)
                 if vllm_version is not None else None),
        nnrp=(Runtime("nnrp-1-preview4", tuple(sorted(runtime_tokens(
            priority_scheduling=priority_scheduling))), priority_scheduling, listeners)
            if priority_scheduling is not None else None),
        media=media, build=build())
    data: dict[str, Any] = _converter.unstructure(document)
    return data
