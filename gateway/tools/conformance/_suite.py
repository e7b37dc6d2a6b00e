"""Recipes, capability tokens and execution plans, the way the suite's runner builds them.

Capability tokens from a capability document (docs/reference/conformance.md section 1):
``api.level<N>``
per compatibility level, ``api.<operation>`` per operation, ``api.streaming``,
``api.non_streaming``, ``api.tool_calls``, ``api.cancellation`` when any operation
claims them, ``api.extension.<name>`` per extension. A recipe is selected when all its
``required_capabilities`` are claimed; the others are reported ``not_claimed``.

Project recipes (``recipes/gateway``) use the same format. Those that need the replay
backend's scripted behaviour also require ``gateway.replay-backend``, claimed only when
the run is told the backend is the replay server.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import gateway

REPLAY_BACKEND_TOKEN = "gateway.replay-backend"
_PARAMETER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def recipes_root() -> Path:
    """The recipe tree: bundled in the wheel, or the repository's ``recipes/``."""
    bundled = resources.files("gateway.tools.conformance").joinpath("recipes")
    if bundled.is_dir():
        return Path(str(bundled))
    return Path(gateway.__file__).resolve().parent.parent / "recipes"


def suite_dir() -> Path:
    return recipes_root() / "suite"


def schemas_dir() -> Path:
    return suite_dir() / "schemas"


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def suite_recipes() -> list[dict[str, Any]]:
    base = suite_dir() / "profiles" / "openai-compatible" / "1"
    manifest = load_json(base / "manifest.json")
    return [load_json(base / name) for name in manifest["recipe_manifests"]]


def project_recipes() -> list[dict[str, Any]]:
    folder = recipes_root() / "gateway"
    return [load_json(path) for path in sorted(folder.glob("*.json"))]


def capability_tokens(capabilities: dict[str, Any], *, replay_backend: bool = False
                      ) -> set[str]:
    tokens = {f"api.level{level}" for level in capabilities.get("compatibility_levels", [])}
    for operation in capabilities.get("operations", []):
        tokens.add(f"api.{operation['name']}")
        for flag in ("streaming", "non_streaming", "tool_calls", "cancellation"):
            if operation.get(flag):
                tokens.add(f"api.{flag}")
    tokens |= {f"api.extension.{e['name']}" for e in capabilities.get("extensions", [])}
    if replay_backend:
        tokens.add(REPLAY_BACKEND_TOKEN)
    return tokens


def suite_capabilities(document: dict[str, Any]) -> dict[str, Any]:
    """The schema's projection of our capability document (models/backend are ours)."""
    keep = ("$schema", "adapter", "profile", "schema_version", "compatibility_levels",
            "operations", "extensions")
    return {key: copy.deepcopy(document[key]) for key in keep if key in document}


def _substitute(value: Any, parameters: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _PARAMETER.sub(lambda m: parameters.get(m[1], m[0]), value)
    if isinstance(value, list):
        return [_substitute(item, parameters) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, parameters) for key, item in value.items()}
    return value


def build_plan(capabilities: dict[str, Any], *, include_project: bool = True,
               replay_backend: bool = False, results_path: str = "results.json",
               evidence_dir: str = "evidence") -> tuple[dict[str, Any], list[str]]:
    """An ``api-profile-execution-plan`` document and the ids not claimed."""
    tokens = capability_tokens(capabilities, replay_backend=replay_backend)
    recipes = suite_recipes() + (project_recipes() if include_project else [])
    cases, not_claimed = [], []
    for recipe in recipes:
        required = recipe.get("required_capabilities", [])
        if not set(required) <= tokens:
            not_claimed.append(recipe["id"])
            continue
        parameters = recipe.get("parameters", {})
        cases.append({"id": recipe["id"], "operation": recipe["operation"],
                      "status": recipe.get("status", "mandatory"),
                      "required_capabilities": required,
                      "request": _substitute(recipe["request"], parameters),
                      "expect": recipe["expect"]})
    coverage: dict[str, dict[str, Any]] = {}
    for recipe in recipes:
        entry = coverage.setdefault(recipe["operation"], {
            "feature": recipe["operation"], "required_capabilities": [],
            "summary": {"selected_cases": 0, "not_claimed_cases": 0, "informational_cases": 0},
            "statuses": {"mandatory_cases": 0, "optional_cases": 0, "experimental_cases": 0,
                         "deprecated_cases": 0},
            "case_ids": []})
        for token in recipe.get("required_capabilities", []):
            if token not in entry["required_capabilities"]:
                entry["required_capabilities"].append(token)
        selected = recipe["id"] not in not_claimed
        entry["summary"]["selected_cases" if selected else "not_claimed_cases"] += 1
        if selected:
            entry["statuses"][f"{recipe.get('status', 'mandatory')}_cases"] += 1
            entry["case_ids"].append(recipe["id"])
    plan = {"$schema": "../schemas/api-profile-execution-plan.schema.json",
            "profile": "openai-compatible", "schema_version": "openai-compatible/1",
            "adapter": capabilities.get("adapter", "nnrp-vllm-gateway"),
            "artifacts": {"results_path": results_path, "evidence_dir": evidence_dir},
            "coverage_matrix": list(coverage.values()), "cases": cases}
    return plan, not_claimed
