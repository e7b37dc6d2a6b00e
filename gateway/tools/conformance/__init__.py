"""Conformance: the suite-owned openai-compatible/1 recipes over the wire, the wire
scenario, the project's own recipes, and the wire target manifest."""

from ._native import native_available as native_available
from ._native import native_client_options as native_client_options
from ._native import native_openai_submit as native_openai_submit
from ._run import run_plan as run_plan
from ._suite import (
    build_plan as build_plan,
)
from ._suite import (
    recipes_root as recipes_root,
)
from ._suite import (
    suite_capabilities as suite_capabilities,
)
from ._validate import (
    ValidationReport as ValidationReport,
)
from ._validate import (
    check_case as check_case,
)
from ._validate import (
    schema_errors as schema_errors,
)
from ._validate import (
    validate_results as validate_results,
)
from ._wire import (
    run_wire_probe as run_wire_probe,
)
from ._wire import (
    target_manifest as target_manifest,
)
from ._wire import (
    write_atomically as write_atomically,
)
