"""Each runtime-object case of the vendored protocol suite (runtime-object-core, and the
object-reference and legacy typed-payload cases of nnrp1-baseline-core) is driven by a
named project test: this pins the list, so a case cannot lose its test silently, and
docs/runtime-controls.md ("The suite's runtime-control cases") says what each proves."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

VECTORS = Path(__file__).parents[1] / "nnrp" / "vectors"

#: case id -> the tests that drive it ("module::function").
CASE_TESTS = {
    "l1.object.lifecycle": (
        "tests.interop.test_runtime_objects::test_native_client_object_lifecycle_and_delta",
        "tests.interop.test_runtime_objects::test_the_referee_takes_the_same_object_frames_silently",
        "tests.nnrp.test_objects::test_declare_reference_release_is_silent_and_counted",
        "tests.nnrp.test_objects::test_an_invalidating_release_drops_the_operations_that_depend_on_it",
    ),
    "l1.object.delta": (
        "tests.interop.test_runtime_objects::test_native_client_object_lifecycle_and_delta",
        "tests.nnrp.test_objects::test_patches_and_deltas_version_the_object_without_resending_it",
    ),
    "l0.object_reference.block.golden": (
        "tests.nnrp.test_objects::test_object_reference_block_golden",
    ),
    "l1.result_push.object_reference.resolve": (
        "tests.interop.test_runtime_objects::test_a_submit_referencing_cached_objects_over_the_wire",
        "tests.nnrp.test_objects::test_a_submit_referencing_cached_objects_gets_cache_misses_then_its_refusal",
        "tests.interop.test_cache_objects::test_a_cached_image_reaches_vllm_from_two_requests_then_is_invalidated",
        "tests.nnrp.test_cache::test_a_submit_naming_held_entries_runs_and_a_missing_one_is_refused",
        "tests.nnrp.test_cache::test_an_expired_reference_misses_expired",
    ),
    "l1.cache.lifecycle.roundtrip": (
        "tests.nnrp.test_cache::test_cache_put_and_ack_are_nnrp_pys_bytes",
        "tests.nnrp.test_cache::test_a_put_is_acked_and_referenced_silently_and_a_missing_key_misses",
        "tests.nnrp.test_cache::test_invalidate_drops_what_its_scope_names_silently",
        "tests.interop.test_cache_objects::test_a_cached_image_reaches_vllm_from_two_requests_then_is_invalidated",
        "tests.interop.test_cache_objects::test_the_referee_answers_no_cache_frame_and_fails_a_session_on_cache_put",
    ),
    "l1.frame_submit.message.parse_emit": (
        "tests.nnrp.test_objects::test_frame_submit_parse_emit_keeps_object_references",
    ),
    "l0.typed_payload.descriptor.golden": (
        "tests.nnrp.test_objects::test_legacy_typed_payload_descriptor_golden",
    ),
    "l0.typed_payload.frame_regions.golden": (
        "tests.nnrp.test_objects::test_legacy_typed_payload_frame_regions_golden",
    ),
}


def _case_ids(name: str) -> set[str]:
    return {case["id"] for case in json.loads((VECTORS / name).read_text())["cases"]}


def test_every_object_case_of_the_suite_has_its_tests() -> None:
    object_cases = _case_ids("runtime-object-core.json") | {
        case for case in _case_ids("nnrp1-baseline-core.json")
        if "object" in case or case.startswith("l0.typed_payload.")}
    assert object_cases <= set(CASE_TESTS)
    assert set(CASE_TESTS) <= object_cases | _case_ids("nnrp1-baseline-core.json")
    for case, tests in CASE_TESTS.items():
        for test in tests:
            module, function = test.split("::")
            assert callable(getattr(importlib.import_module(module), function)), (case, test)


OBJECT_TOKENS = ["object.cost", "object.delta", "object.lifecycle", "object.ownership"]


def test_the_object_tokens_are_claimed_where_clients_and_runners_look() -> None:
    """Negotiation grants them (``runtime_tokens``), the capability document lists them,
    and the target manifest claims them, schema-valid."""
    from gateway.profile import runtime_tokens
    from gateway.profile._capabilities import capability_document
    from gateway.tools.conformance import schema_errors, target_manifest

    tokens = runtime_tokens(priority_scheduling=False)
    assert set(OBJECT_TOKENS) <= tokens
    document = capability_document(adapter="t", models=("m",), tool_calls=False,
                                   priority_scheduling=False)
    assert set(OBJECT_TOKENS) <= set(document["nnrp"]["runtime_tokens"])
    manifest = target_manifest(["tcp://127.0.0.1:7700"], target_name="g",
                               max_frame_bytes=1 << 24, max_in_flight=64,
                               runtime_tokens=tokens)
    assert schema_errors(manifest, "wire-conformance-target.schema.json") == []
    assert set(OBJECT_TOKENS) <= set(manifest["wire_conformance"]["capabilities"])


def test_the_cache_token_is_claimed_and_selects_no_scenario_the_gateway_fails() -> None:
    """``cache.reference`` (the session's cache, gateway/nnrp/_cache.py) is granted,
    listed and claimed. The one wire scenario that requires it,
    capability-route-cache, also requires ``control.route_execution_hint``, which is not
    claimed: a runner reading the manifest still does not select it. ``cache.lifecycle``
    (the protocol cases' feature) is no token nnrp-py's library knows: never granted."""
    from gateway.nnrp import KNOWN_TOKENS
    from gateway.profile import runtime_tokens

    tokens = runtime_tokens(priority_scheduling=False)
    assert "cache.reference" in tokens and "cache.reference" in KNOWN_TOKENS
    assert "cache.lifecycle" not in KNOWN_TOKENS | tokens
    assert "control.route_execution_hint" not in tokens
