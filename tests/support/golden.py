"""The vendored nnrp-conformance preview4 suite's golden cases and semantic vectors
(tests/nnrp/vectors), by id and by name, as the codec and object tests read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).resolve().parents[1] / "nnrp" / "vectors"


def _cases(name: str) -> dict[str, dict[str, Any]]:
    data = json.loads((VECTORS / name).read_text())
    return {case["id"]: case.get("parameters") or {} for case in data["cases"]}


def _vectors() -> dict[str, dict[str, Any]]:
    out = {}
    for name in ("semantic-vectors.json", "nnrp1-baseline-semantic-vectors.json"):
        for vector in json.loads((VECTORS / name).read_text())["vectors"]:
            out[vector["name"]] = vector
    return out


CASES = {**_cases("common-header-core.json"), **_cases("nnrp1-baseline-core.json"),
         **_cases("typed-payload-core.json")}
VECTORS_BY_NAME = _vectors()
