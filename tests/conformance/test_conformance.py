"""Plan selection, the validator's rules, the target manifest, and a wire probe that fails."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.profile import EndCause
from gateway.profile._capabilities import capability_document
from gateway.server import GatewayServer, Operation
from gateway.tools.conformance import (
    build_plan,
    check_case,
    schema_errors,
    target_manifest,
    validate_results,
    write_atomically,
)
from gateway.tools.conformance._suite import capability_tokens, suite_recipes
from gateway.tools.conformance._wire import probe


def caps(tool_calls: bool = True, extensions: bool = True) -> dict[str, Any]:
    document = capability_document(adapter="t", models=("m",), tool_calls=tool_calls)
    if not extensions:
        document["extensions"] = []
    return document


def test_tokens_and_selection() -> None:
    tokens = capability_tokens(caps())
    assert {"api.level1", "api.chat.completions.create", "api.streaming", "api.non_streaming",
            "api.tool_calls", "api.cancellation", "api.extension.vllm.reasoning"} <= tokens
    plan, not_claimed = build_plan(caps(tool_calls=False), include_project=False)
    assert "openai-compatible.chat.tool-call-delta" in not_claimed
    assert len(plan["cases"]) == len(suite_recipes()) - 1
    assert plan["cases"][0]["request"]["body"]["model"] == "example-model"  # ${MODEL_ID}
    assert schema_errors(plan, "api-profile-execution-plan.schema.json") == []
    replay_plan, replay_not_claimed = build_plan(caps(), replay_backend=True)
    assert not replay_not_claimed
    plain_plan, plain_not_claimed = build_plan(caps())
    assert "gateway.chat.request-timeout" in plain_not_claimed  # needs the replay backend
    assert len(replay_plan["cases"]) > len(plain_plan["cases"])


def test_project_recipes_are_schema_valid() -> None:
    recipes = sorted((Path(__file__).parents[2] / "recipes" / "gateway").glob("*.json"))
    assert len(recipes) >= 12
    for path in recipes:
        assert schema_errors(json.loads(path.read_text()), "api-profile-recipe.schema.json") == []


EXPECT = {"events": [{"type": "a", "optional": True}, {"type": "b", "min_count": 2},
                     {"type": "c", "fields": {"x": {"y": 1}}}], "terminal": "success"}


@pytest.mark.parametrize(("events", "terminal", "problem"), [
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1, "z": 2}}], "success", None),
    ([{"type": "a"}, {"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1}}], "success", None),
    ([{"type": "b"}, {"type": "c", "x": {"y": 1}}], "success", "at least 2 b"),
    ([{"type": "c", "x": {"y": 1}}, {"type": "b"}, {"type": "b"}], "success", "c event"),
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 2}}], "success", "matching"),
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1}}], "error", "terminal is error"),
])
def test_check_case_rules(events: list[dict[str, Any]], terminal: str,
                          problem: str | None) -> None:
    result = check_case(EXPECT, terminal, events)
    assert result is None if problem is None else problem in (result or "")


def test_error_terminal_needs_error_event() -> None:
    expect = {"events": [], "terminal": "error"}
    assert check_case(expect, "error", []) is not None
    assert check_case(expect, "error", [{"type": "response.error"}]) is None


def _results(plan: dict[str, Any]) -> dict[str, Any]:
    return {"profile": "openai-compatible", "schema_version": "openai-compatible/1",
            "adapter": "t", "results": [
                {"id": c["id"], "outcome": "passed", "terminal": c["expect"]["terminal"],
                 "events": [{"type": e["type"], **e.get("fields", {})}
                            for e in c["expect"]["events"] for _ in range(e.get("min_count", 1))]
                 + ([{"type": {"error": "response.error", "cancelled": "response.cancelled"}[
                     c["expect"]["terminal"]]}] if c["expect"]["terminal"] != "success" else [])}
                for c in plan["cases"]]}


def test_validate_is_strict() -> None:
    plan, _ = build_plan(caps(), include_project=False)
    good = _results(plan)
    assert validate_results(plan, good).ok
    # A self-reported pass whose events do not satisfy the recipe is a failure.
    lying = copy.deepcopy(good)
    lying["results"][0]["events"] = []
    report = validate_results(plan, lying)
    assert not report.ok
    assert report.failed
    missing = copy.deepcopy(good)
    missing["results"].pop()
    assert any("no result for" in e for e in validate_results(plan, missing).errors)
    duplicated = copy.deepcopy(good)
    duplicated["results"].append(duplicated["results"][0])
    assert any("duplicate" in e for e in validate_results(plan, duplicated).errors)
    unknown = copy.deepcopy(good)
    unknown["results"][0]["id"] = "nope"
    assert any("unknown case" in e for e in validate_results(plan, unknown).errors)
    broken = copy.deepcopy(good)
    broken["results"][0]["outcome"] = "maybe"
    assert any("api-profile-case-results" in e for e in validate_results(plan, broken).errors)


def test_target_manifest_is_schema_valid(tmp_path: Path) -> None:
    manifest = target_manifest(["tcp://127.0.0.1:7700", "unix:///run/g.sock",
                                "ws://127.0.0.1:7701/nnrp"], target_name="g",
                               max_frame_bytes=1 << 24, max_in_flight=64)
    assert schema_errors(manifest, "wire-conformance-target.schema.json") == []
    path = tmp_path / "ready" / "target.json"
    write_atomically(path, manifest)
    assert json.loads(path.read_text()) == manifest
    assert [p.name for p in path.parent.iterdir()] == ["target.json"]  # no temp file left


async def test_wire_probe_fails_a_target_that_breaks_the_mapping(nursery: trio.Nursery) -> None:
    async def sse_framed(op: Operation) -> None:
        await op.emit(b'data: {"type":"response.output_text.delta","index":0,"delta":"x"}')
        await op.close(EndCause.COMPLETED, b'{"type":"response.completed","body":{}}')

    server = GatewayServer(sse_framed)
    (endpoint,) = await nursery.start(server.serve, ["tcp://127.0.0.1:0"])
    with trio.fail_after(10):
        result = await probe(endpoint.uri)
    assert result["outcome"] == "failed"
    assert "not one raw JSON event" in result["message"] or "JSON" in result["message"]
