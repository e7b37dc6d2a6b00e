"""The suite's validation rules, applied strictly.

For each case (conformance.md section 1, "What the validator checks"): the terminal kind
matches; the expected events appear in order, each at least ``min_count`` times (default
1, or 0 when optional); ``fields`` are a JSON subset of the matched event (``openai_chunk``
ignored); error and cancelled terminals carry ``response.error`` / ``response.cancelled``.
Unknown, duplicate or missing case ids are errors. Stricter than the suite's validator:
the events are checked whatever outcome a result claims, and the run passes only when
passed == selected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from ._suite import load_json, schemas_dir


def is_subset(expected: Any, actual: Any) -> bool:
    """JSON subset: dict keys recursively, lists element by element, scalars equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and is_subset(value, actual[key]) for key, value in expected.items())
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(expected) <= len(actual)
                and all(is_subset(e, a) for e, a in zip(expected, actual, strict=False)))
    return bool(expected == actual)


_TERMINAL_EVENT = {"error": "response.error", "cancelled": "response.cancelled"}


def check_case(expect: dict[str, Any], terminal: str, events: list[dict[str, Any]]
               ) -> str | None:
    """None when the observation satisfies the recipe, else what is wrong."""
    if terminal != expect["terminal"]:
        return f"terminal is {terminal}, expected {expect['terminal']}"
    required_terminal_event = _TERMINAL_EVENT.get(terminal)
    if required_terminal_event and not any(e.get("type") == required_terminal_event
                                           for e in events):
        return f"{terminal} terminal without a {required_terminal_event} event"
    position = 0
    for expectation in expect["events"]:
        minimum = expectation.get("min_count", 0 if expectation.get("optional") else 1)
        fields = expectation.get("fields", {})
        matched = 0
        cursor = position
        while cursor < len(events):
            event = events[cursor]
            if event.get("type") == expectation["type"] and is_subset(
                    fields, {k: v for k, v in event.items() if k != "openai_chunk"}):
                matched += 1
                position = cursor + 1
            cursor += 1
        if matched < minimum:
            return (f"expected at least {minimum} {expectation['type']} event(s)"
                    + (f" matching {fields}" if fields else "")
                    + f" in order; found {matched}")
    return None


@attrs.define
class ValidationReport:
    selected: int
    passed: int
    failed: list[str]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.failed and self.passed == self.selected

    def as_dict(self) -> dict[str, Any]:
        return {"selected": self.selected, "passed": self.passed, "failed": self.failed,
                "errors": self.errors, "ok": self.ok}


def schema_errors(document: Any, schema_name: str, schemas: Path | None = None) -> list[str]:
    """Errors of ``document`` against a vendored suite schema (empty when valid)."""
    import jsonschema

    schema = load_json((schemas or schemas_dir()) / schema_name)
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{schema_name}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(document)]


def validate_results(plan: dict[str, Any], results: dict[str, Any]) -> ValidationReport:
    errors = schema_errors(results, "api-profile-case-results.schema.json")
    errors += schema_errors(plan, "api-profile-execution-plan.schema.json")
    cases = {case["id"]: case for case in plan["cases"]}
    seen: set[str] = set()
    passed = 0
    failed: list[str] = []
    for result in results.get("results", []):
        case_id = result.get("id")
        if case_id not in cases:
            errors.append(f"result for unknown case {case_id!r}")
            continue
        if case_id in seen:
            errors.append(f"duplicate result for {case_id}")
            continue
        seen.add(case_id)
        problem = check_case(cases[case_id]["expect"], result.get("terminal", ""),
                             result.get("events", []))
        if result.get("outcome") == "passed" and problem is None:
            passed += 1
        else:
            failed.append(f"{case_id}: {problem or result.get('message') or result['outcome']}")
    errors += [f"no result for {case_id}" for case_id in cases if case_id not in seen]
    return ValidationReport(len(cases), passed, failed, errors)
