"""The capability document as a consumer receives it (GET /capabilities, the
``capabilities`` command, the NNRP capabilities operation)."""

from __future__ import annotations

from gateway.profile import capability_document
from gateway.tools.conformance import schema_errors
from gateway.tools.conformance._suite import suite_capabilities


def test_the_document_names_no_schema_a_consumer_cannot_reach() -> None:
    """Issue 37: its ``$schema`` was "../../schemas/api-profile-capabilities.schema.json",
    a path relative to a folder of the conformance suite's repository that exists on no
    consumer's side (and the schema's own ``$id`` is no URL that answers). The document
    says what it is by ``profile`` and ``schema_version``; it still validates against
    the suite's schema."""
    document = capability_document(adapter="nnrp-vllm-gateway", models=("m",),
                                   tool_calls=False, vllm_version="0.26.0",
                                   backend_family="0.26.x", priority_scheduling=False)
    assert "$schema" not in document
    assert (document["profile"], document["schema_version"]) == (
        "openai-compatible", "openai-compatible/1")
    assert schema_errors(suite_capabilities(document),
                         "api-profile-capabilities.schema.json") == []
