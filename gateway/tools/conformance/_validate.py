"""The suite's validation rules, applied strictly.

For each case (docs/reference/conformance.md section 1, "What the validator checks"): the terminal
kind
matches; the expected events appear in order, each at least ``min_count`` times (default
1, or 0 when optional); ``fields`` are a JSON subset of the matched event (``openai_chunk``
ignored); error and cancelled terminals carry ``response.error`` / ``response.cancelled``.
Unknown, duplicate or missing case ids are errors. Stricter than the suite's validator:
the events are checked whatever outcome a result claims, and the run passes only when
passed == selected.

Inconclusive. A case whose precondition did not happen proves nothing either way: a
cancel recipe whose stream ended before its CANCEL could be sent, or whose terminal
crossed the CANCEL on its way (a backend faster than a cancel: a GPU vLLM answering a
short prompt in a few milliseconds). The suite's result schemas have no such outcome:
such a result is ``skipped``, its ``message`` starts with ``inconclusive: `` and says
what was seen (an api-profile result also carries the reason as
``diagnostics.inconclusive``); ``result_status`` reads it back. Only a case with a
timing precondition (``cancel_after_events``) may be inconclusive; anything else
claiming it is an error. A run with no failure and some inconclusive case is neither a
pass nor a failure (``ValidationReport.verdict``).
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

#: How an inconclusive result's ``message`` starts (module docstring).
INCONCLUSIVE = "inconclusive: "
#: The least time (ms) a CANCEL is given to reach the server and its effect to come back
#: (``crossing_window_ms``): a terminal that comes sooner may have crossed it.
CROSSING_FLOOR_MS = 50.0


def crossing_window_ms(round_trip_ms: float) -> float:
    """How soon after a CANCEL was sent a terminal (not its drop) may still have crossed
    it: sent before the server read the CANCEL. Four round trips (one measured on the
    same connection) and at least ``CROSSING_FLOOR_MS``: a terminal later than that was
    sent by a server that had read the CANCEL, so the case fails; sooner, it is
    inconclusive. Used where no exact order is observable (nnrp-py's native client, the
    wire probe); the built-in client orders its terminal against a PING's PONG."""
    return max(CROSSING_FLOOR_MS, 4 * round_trip_ms)


def result_status(result: dict[str, Any]) -> str:
    """``passed``, ``failed``, ``skipped`` or ``inconclusive`` (a ``skipped`` result whose
    message starts with ``INCONCLUSIVE``) for one result of either results schema."""
    outcome = str(result.get("outcome"))
    if outcome == "skipped" and str(result.get("message", "")).startswith(INCONCLUSIVE):
        return "inconclusive"
    return outcome


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
    #: ``id: reason`` of each case whose precondition did not happen.
    inconclusive: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.failed and self.passed == self.selected

    @property
    def verdict(self) -> str:
        """``passed`` (every case proven), ``failed`` (an error or a failed case), or
        ``inconclusive`` (nothing failed; some case proved nothing either way)."""
        if self.ok:
            return "passed"
        if self.errors or self.failed or (
                self.passed + len(self.inconclusive) != self.selected):
            return "failed"
        return "inconclusive"

    def as_dict(self) -> dict[str, Any]:
        return {"selected": self.selected, "passed": self.passed, "failed": self.failed,
                "inconclusive": self.inconclusive, "errors": self.errors, "ok": self.ok,
                "verdict": self.verdict}


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
    inconclusive: list[str] = []
    for result in results.get("results", []):
        case_id = result.get("id")
        if case_id not in cases:
            errors.append(f"result for unknown case {case_id!r}")
            continue
        if case_id in seen:
            errors.append(f"duplicate result for {case_id}")
            continue
        seen.add(case_id)
        if result_status(result) == "inconclusive":
            if (cases[case_id].get("request", {}).get("nnrp") or {}).get(
                    "cancel_after_events") is None:
                errors.append(f"{case_id} is inconclusive, but it has no timing "
                              "precondition (cancel_after_events)")
            else:
                inconclusive.append(f"{case_id}: {result['message'][len(INCONCLUSIVE):]}")
            continue
        problem = check_case(cases[case_id]["expect"], result.get("terminal", ""),
                             result.get("events", []))
        if result.get("outcome") == "passed" and problem is None:
            passed += 1
        else:
            failed.append(f"{case_id}: {problem or result.get('message') or result['outcome']}")
    errors += [f"no result for {case_id}" for case_id in cases if case_id not in seen]
    return ValidationReport(len(cases), passed, failed, errors, inconclusive)
